"""Scores scaled after the dot (scheduler/scale_after.py): beside each attention tiling
the scheduler offers its twin whose loop step computes (q·Kᵀ)·c from q as loaded
instead of (q·c)·Kᵀ from a scaled q tile, with the row max scaled once per row and
s·c - m one fused multiply-add. Each twin must match the fp64 reference."""
import re

import pytest

from cleave import search
from cleave import workloads as W
from cleave.ir import Graph
from cleave.scheduler import schedule
from cleave.workloads.attention import safe_softmax
from kernel_check import ATTENTION_BINDINGS, LOOPS, check_every_length, only_tilings, run_and_check


@pytest.fixture
def twins_only(monkeypatch):
    """Schedule only the options with the scale after the dot."""
    only_tilings(monkeypatch, lambda t: t.scale_after)


def _twins(plans):
    return [p for p in plans if any(k.endswith(".scale_after") for k in p.tiles)]


@pytest.mark.parametrize("name", ["mha", "mha_causal", "gqa_causal", "mha_window", "mha_alibi", "mha_softcap"])
def test_scores_scaled_after_the_dot_match_the_reference(twins_only, name):
    env = ATTENTION_BINDINGS[name]
    g = W.get(name).graph
    plans = schedule(search(g).candidates[0], env, top_k=3, target=LOOPS)
    assert plans and len(_twins(plans)) == len(plans)
    for plan in plans:  # one row tile and two per program
        for seed in (0, 1):
            run_and_check(g, plan, env, seed)


def test_one_compile_serves_every_length(twins_only):
    check_every_length("gqa_causal", {"b": 1, "hkv": 1, "g": 2, "s": 200, "d": 16}, "s", (1, 64, 65, 129, 257))


def test_the_loop_reads_q_as_loaded_and_scales_each_row_max_once(twins_only):
    g = W.get("mha").graph
    plan = schedule(search(g).candidates[0], {"b": 1, "h": 2, "s": 300, "d": 16}, top_k=1, target=LOOPS)[0]
    src = plan.kernels[0].source
    defs = dict(re.findall(r"^\s*(\w+) = (.+)$", src, re.M))
    q = next(v for v, rhs in defs.items() if rhs.startswith("tl.load(q_ptr"))
    assert f"tl.dot({q}.to(DOT_BF16)" in src, "q is not fed to the dot as loaded"
    assert not [rhs for rhs in defs.values() if re.fullmatch(rf"to_bf16\(.*\b{q}\b.*\)", rhs)], "q is rounded again"
    scale = next(v for v, rhs in defs.items() if rhs.startswith("tl.where(") and 'float("inf")' in rhs)
    maxima = [v for v, rhs in defs.items() if rhs.startswith("reduce_max(")]
    assert maxima and all(any(rhs == f"{m} * {scale}" for rhs in defs.values()) for m in maxima)
    assert re.search(rf"= \w+ \* {scale} - run\d+\[:, None\]$", src, re.M), "s·c - m is not one expression"


def _scaled_attention(factor: float) -> Graph:
    g = Graph(f"attention_scaled_{'neg' if factor < 0 else 'pos'}")
    q, k, v = (g.input(n, ("b", "s", "d"), "bf16") for n in "qkv")
    scores = (q @ k.T).cast("f32") * g.const(factor)
    return g.output(safe_softmax(scores).cast("bf16") @ v, names=["o"])


def test_offered_only_for_a_positive_scale():
    """A negative factor would turn the row max into the row min and the -inf mask
    fill into +inf: no twin. The same graph with a positive factor gets one."""
    env = {"b": 2, "s": 300, "d": 16}
    for factor, twins in ((0.25, True), (-0.25, False)):
        g = _scaled_attention(factor)
        plans = schedule(search(g).candidates[0], env, top_k=8, target=LOOPS)
        assert bool(_twins(plans)) is twins, factor
        for plan in _twins(plans):
            run_and_check(g, plan, env, seed=0)


def test_not_offered_for_a_decode_step():
    """A decode's q tile (a few query heads per kv head) is small beside its keys."""
    w = W.get("gqa_decode")
    env = w.test_bindings[0]
    plans = schedule(search(w.graph).candidates[0], env, top_k=8, target=LOOPS)
    assert plans and not _twins(plans)
