"""A MatMul dim a little past `full_matmul` (MLA's latent of 512) is held whole where
tiling it repeats work: the scores' contraction inside the key loop and the output's
width. MLA decode is then one fused kernel that loads each ckv tile once per key step
and uses it as both K and V, instead of materialising the scores and probabilities
(issue 13 item 6)."""
import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from cleave import workloads as W
from cleave.scheduler import H200, schedule
from fixtures_candidates import CANDIDATES
from kernel_check import computed_kernels, loaded, run_and_check

# The H200's thresholds scaled down to test shapes: MatMul dims over 16 loop unless held
# whole, up to 32 (the keys, 53 of them, always loop).
SMALL = dataclasses.replace(H200, full_reduce=32, full_matmul=16, hold_matmul=32)


def test_mla_decode_preset_is_one_kernel_reading_ckv_once():
    """At the benchmark's shapes (c = 512 > full_matmul = 256): no scores or
    probabilities in memory, the 64 x 512 accumulator fits 8 warps."""
    env = dict(W.get("mla_decode").presets["b64_L4096"])
    plan = schedule(CANDIDATES["mla_decode"](), env, top_k=1, split={"sp": 1})[0]
    assert len(plan.kernels) == 1 and not plan.intermediates
    src = plan.kernels[0].source
    assert len(loaded(src, "ckv")) == 1
    assert "tl.arange(0, 512)" in src and plan.kernels[0].num_warps == 8


def test_mla_decode_held_whole_runs_at_odd_shapes():
    """The same decision at test shapes (c = 32 between the scaled thresholds): one
    kernel unsplit, one partial kernel plus its combine split, all exact. At these
    shapes the model ranks a loop over c inside the key loop about level with c
    whole (latency-bound), so both are offered and both are checked."""
    cand, w = CANDIDATES["mla_decode"](), W.get("mla_decode")
    env = {"b": 2, "h": 5, "c": 32, "r": 8, "L": 53}
    for sp, kernels in ((1, 1), (3, 2)):
        plans = schedule(cand, env, target=SMALL, top_k=4, split={"sp": sp})
        assert all(computed_kernels(p) == kernels and (sp > 1 or not p.intermediates) for p in plans)
        whole = [p for p in plans if len(loaded(p.kernels[0].source, "ckv")) == 1]
        assert whole, "no plan holds the latent whole (one ckv load per key step)"
        for plan in {id(p): p for p in (plans[0], whole[0])}.values():
            run_and_check(cand.graph, plan, env, seed=torch.seed() % 1000, reference=w.graph)


def test_past_the_hold_the_scores_are_cut_as_before():
    """A latent over `hold_matmul` (c = 64 here) is still materialised by a producer."""
    cand = CANDIDATES["mla_decode"]()
    env = {"b": 2, "h": 5, "c": 64, "r": 8, "L": 53}
    plan = schedule(cand, env, target=SMALL, top_k=1, split={"sp": 1})[0]
    assert len(plan.kernels) > 1 and plan.intermediates
