"""Target.index_prefetch (off by default; `benchmarks.build --index-prefetch`): a loop's
index tiles (a paged cache's page indices) are loaded a step ahead and carried, the
first step's before the loop and none past its segment, so that Triton can give the
tile gathered through them two buffers at three stages (compiled for sm_90 in session
37; not yet timed). Every such plan against the fp64 interpreter, with long, short and
empty requests, scattered pages and NaN-poisoned outputs."""
import dataclasses
import re

import torch

import cleave
from cleave import workloads as W
from cleave.workloads import flashinfer as F
from cleave.interpreter import interpret
from cleave.runtime.launch import launch
from cleave.scheduler import H200
from kernel_check import check_outputs
from paged_decode_case import paged_decode_case

PREFETCH = dataclasses.replace(H200, index_prefetch=True)
CARRIED = re.compile(r"^\s*(pf\d+) = tl\.load\(kv_indices_ptr", re.M)


def _carried(plan) -> set:
    return {name for k in plan.kernels for name in CARRIED.findall(k.source)}


def _check(graph, plans, inputs, env, label):
    """Every plan that serves env (a dynamic split count may leave a chunk empty there)."""
    ref = interpret(graph, inputs, compute_dtype=torch.float64)
    serving = [p for p in plans if p.fits({**env, **p.split}) is None]
    assert serving, [p.split for p in plans]
    for p in serving:
        outs = [torch.full(tuple(r.shape), float("nan"), dtype=r.dtype) for r in interpret(graph, inputs)]
        check_outputs(launch(p, inputs, out=outs), ref, f"{label}: split {p.split}, tiles {p.tiles}")


def test_a_paged_decode_with_its_page_indices_a_step_ahead_matches_fp64():
    graph, inputs, env, dynamic, cand = paged_decode_case([70, 0, 33, 1, 9], pool=131, heads=8, seed=5)
    plans = cleave.schedule(cand, env, dynamic=dynamic, top_k=2, target=PREFETCH)
    assert plans and all(_carried(p) for p in plans), [k.source for k in plans[0].kernels]
    # each carried tile is loaded before its loop and again at the end of each step
    src = plans[0].kernels[0].source
    for name in _carried(plans[0]):
        assert src.count(f"{name} = tl.load(") >= 2 and f"= {name}\n" in src
    _check(graph, plans, inputs, env, "gqa paged")
    # the same plans at another batch of requests (the serving axes are dynamic): the
    # first of each kernel count (one pass, and a partial kernel with its combine), as
    # the interpreter takes about 3 s a plan there
    graph2, inputs2, env2, *_ = paged_decode_case([5, 64, 0, 0, 2, 17, 40], pool=197, heads=8, seed=9)
    firsts = {len(p.kernels): p for p in reversed(plans)}
    assert len(firsts) == 2, [p.split for p in plans]
    _check(graph2, list(firsts.values()), inputs2, env2, "gqa paged, another step")


def test_the_mla_paged_decode_with_its_page_indices_a_step_ahead_matches_fp64():
    w = W.get("mla_paged_decode_h16_ckv512_kpe64_ps1")
    (cand,) = [c for c in cleave.search(w.graph).candidates if "split-softmax-matmul" in c.derivation][:1]
    # long enough that the plans loop over the kv indices (the test bindings fit one tile),
    # an empty request among them
    name, kv_lens = "mla_paged_decode_h16_ckv512_kpe64_ps1", [300, 0, 141]
    pages, pool = F.random_layout(kv_lens, 1, torch.Generator().manual_seed(3))
    inputs = dict(zip(F.kind_of(name).inputs, F.layout_inputs(name, [1] * 3, pages, kv_lens, pool, seed=3)))
    env = {a: v for a, v in F.sizes(name, [1] * 3, kv_lens, pages, pool).items() if a in F.kind_of(name).var}
    plans = cleave.schedule(cand, env, top_k=2, target=PREFETCH)
    assert any(_carried(p) for p in plans), [p.tiles for p in plans]
    _check(w.graph, plans, inputs, env, "mla paged")


def test_off_by_default_and_the_model_counts_the_second_buffer():
    graph, inputs, env, dynamic, cand = paged_decode_case([70, 0, 33, 1, 9], pool=131, heads=8, seed=5)
    assert not any(_carried(p) for p in cleave.schedule(cand, env, dynamic=dynamic, top_k=2))
    from cleave.scheduler.kernel_stats import Stats

    key = ("tile",)
    plain, ahead = Stats(gathered={key}), Stats(gathered={key}, index_prefetch=True)
    assert [plain.buffers(key, s) for s in (2, 3, 4)] == [1, 1, 1]
    assert [ahead.buffers(key, s) for s in (2, 3, 4)] == [1, 2, 3]
