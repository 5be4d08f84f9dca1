"""FlashInfer's ragged prefill (cleave/workloads/paged.py) at CPU sizes, for the tests of
its searched plan: the user's program captured with small heads (8 q heads over 2 kv
heads, d = 16: the group of 4 of the suite), searched once, scheduled at a static
layout with empty requests and odd totals, and checked under the interpreter against
its fp64 value into poisoned outputs."""
import functools

import torch

import cleave
from cleave.interpreter import interpret
from cleave.runtime.launch import launch
from cleave.scheduler import schedule
from cleave.scheduler.exprs import evaluate
from cleave.search import search
from cleave.workloads import flashinfer as F
from kernel_check import LOOPS, check_outputs

NAME = "gqa_ragged_prefill_causal_h32_kv8_d128"
SMALL = {"num_qo_heads": 8, "num_kv_heads": 2, "head_dim": 16}
# (q lens, kv lens): empty requests (first too), one longer than a 16-row tile, totals
# that no tile divides; kv at least q (queries at the end of their kv)
LAYOUT = ([0, 3, 21, 0, 1, 9], [4, 5, 37, 0, 6, 12])


def inputs(layout=LAYOUT, seed: int = 0) -> dict:
    q_lens, kv_lens = layout
    pages, pool = F.random_layout(kv_lens, 1, torch.Generator().manual_seed(seed))
    args = F.layout_inputs(NAME, q_lens, pages, kv_lens, pool, const=SMALL, seed=seed)
    return dict(zip(F.kind_of(NAME).inputs, args))


@functools.lru_cache(maxsize=None)
def captured():
    kind = F.kind_of(NAME)
    return cleave.capture(kind.program, *inputs().values(), dynamic=F.dynamic_axes(kind), name=NAME)


@functools.lru_cache(maxsize=None)
def searched():
    return search(captured(), progress=False).candidates[0]


def binding(layout=LAYOUT) -> dict:
    q_lens, kv_lens = layout
    return {"total_q": sum(q_lens), "total_kv": sum(kv_lens), "len_indptr": len(q_lens) + 1}


def schedule_at(cand, layout=LAYOUT, dynamic: bool = False):
    """The best plan at the layout's sizes (static, or ranked there and serving every
    size when `dynamic`), every split count 1 (one chunk: the plan the H200 preset
    ranks first), every reduction a loop (LOOPS)."""
    splits = {s.name: 1 for s in cand.graph.split_counts()}
    env = binding(layout)
    (plan,) = schedule(cand, env, dynamic=set(env) if dynamic else (), target=LOOPS, top_k=1, split=splits)
    return plan


def kv_loops(kernel) -> list:
    """The kernel's loops over the packed kv tokens (one per pass)."""
    return [lp for lp in kernel.loops if "total_kv" in lp["extent"]]


def check(plan, layout=LAYOUT, seeds=(0, 1)):
    graph = captured()
    for seed in seeds:
        named = inputs(layout, seed)
        ref = interpret(graph, named, compute_dtype=torch.float64)
        out = [torch.full(tuple(r.shape), float("nan"), dtype=r.dtype) for r in interpret(graph, named)]
        launch(plan, named, out=out)
        check_outputs(out, ref, f"{NAME} small, layout {layout}, seed {seed}")


def rows_per_program(kernel, env: dict, heads: int) -> float:
    """Query rows (one head's) a program of the kernel holds on average: its grid against
    every query row of every head."""
    return env["total_q"] * heads / evaluate(kernel.grid[0], env)
