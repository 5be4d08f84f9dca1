"""The attention variants SDPA cannot express (tanh softcap, ALiBi, a causal sliding
window): each searches to one fused attention kernel that runs under
TRITON_INTERPRET=1 against the fp64 interpreter of its naive graph, and the window's
kv loop runs over the band of keys its query tile sees, not from key 0."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import re

import pytest
import torch

import cleave
from cleave import workloads as W
from cleave.interpreter import interpret
from cleave.scheduler import schedule
from cleave.workloads.attention_variants import reference_window, window_graph
from kernel_check import LOOPS, check_outputs, run_and_check

SHORT = 5  # a window shorter than the tiles: both edges of the band cut kv tiles
WIDE = 100  # a window longer than a q tile plus a kv tile: whole tiles inside the band


def _fused_plan(graph, env):
    cand = cleave.search(graph, progress=False).best
    split = {s.name: 1 for s in cand.graph.symbols() if s.name.startswith("s_")}
    return cand, schedule(cand, env, target=LOOPS, top_k=1, split=split)[0]


def test_a_short_window_graph_computes_its_reference_in_fp64():
    g = window_graph(SHORT)
    for seed, env in enumerate(W.get("mha_window").test_bindings):
        inputs = W.get("mha_window").inputs(env, seed=seed, dtype=torch.float64)
        casts = {n.id for n in g.live_nodes() if n.op == "cast"}
        (got,) = interpret(g, inputs, compute_dtype=torch.float64, exact=casts)
        torch.testing.assert_close(got, reference_window(**inputs, window=SHORT).double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["mha_softcap", "mha_alibi"])
def test_score_modifying_variant_is_one_fused_kernel(name):
    graph = W.get(name).graph
    env = {"b": 1, "h": 3, "s": 77, "d": 16}  # several q tiles, a ragged last one
    cand, plan = _fused_plan(graph, env)
    assert len(plan.kernels) == 1 and not plan.intermediates  # no s x s scores in memory
    run_and_check(cand.graph, plan, env, seed=torch.seed() % 1000, reference=graph)


@pytest.mark.parametrize("window", [SHORT, WIDE])
def test_window_kv_loop_starts_at_the_query_tiles_band(window):
    graph = window_graph(window)
    env = {"b": 1, "h": 2, "s": 163, "d": 16}
    cand, plan = _fused_plan(graph, env)
    assert len(plan.kernels) == 1 and not plan.intermediates
    src = plan.kernels[0].source
    first = re.search(r"for start\d+ in range\((\w+), ", src).group(1)
    start = re.search(rf"^\s*{first} = (.*)$", src, re.M)
    # The start is computed from the program's q tile (tid), so the tiles before the band are skipped.
    assert start and re.search(r"\btid\d+\b", start.group(1)), first
    run_and_check(cand.graph, plan, env, seed=torch.seed() % 1000, reference=graph)
