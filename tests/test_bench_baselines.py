"""The benchmark's strongest-baseline selection (benchmarks/strongest.py) and the
baselines' formulations (benchmarks/baselines.py), on CPU at tiny shapes. Nothing
here asserts a timing: fake timers stand in for do_bench."""
import dataclasses
import functools
import math
import time
import warnings

import pytest

import torch

from benchmarks import baselines, report
from benchmarks.strongest import NOT_NEEDED, Baseline, best, measure
from cleave import workloads
from cleave.workloads.attention import reference_rope_attention
from cleave.workloads.attention_variants import reference_window

X = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
REFERENCE = [X * 2]


def _fake(costs: dict[str, float]):
    """Baselines that compute the reference, and a timer that reports each one's cost."""
    last = []

    def make(name, value=None):
        def fn(x):
            last.append(name)
            return x * 2 if value is None else value
        return fn

    def timer(fn):
        fn()
        return costs[last[-1]]
    return make, timer


def _refuse(x):
    raise RuntimeError("No available kernel.\nsecond line")


def test_best_is_the_fastest_that_ran_and_is_named():
    make, timer = _fake({"slow": 3.0, "fast": 1.0, "mid": 2.0})
    outcomes = measure([Baseline(n, make(n)) for n in ("slow", "fast", "mid")], {"x": X}, REFERENCE, timer)
    assert [o.name for o in outcomes] == ["slow", "fast", "mid"]
    assert [o.ms for o in outcomes] == [3.0, 1.0, 2.0]
    assert best(outcomes).name == "fast"
    rows = [{"workload": "w", "preset": "p", "plans": [{"ms": 0.5, "rel_err": 1e-3}], "cleave_ms": 0.5,
             "baselines": [o.__dict__ for o in outcomes], "strongest": best(outcomes).__dict__}]
    line = report.table(rows).splitlines()[-1]
    assert "| fast | 1.0000 | 2.00 |" in line


def test_refusals_and_disagreements_are_dropped_with_their_reason():
    make, timer = _fake({"wrong": 0.1, "ok": 1.0})
    outcomes = measure([Baseline("refuses", _refuse), Baseline("wrong", make("wrong", X * 3)),
                        Baseline("nan", make("nan", X * math.nan)), Baseline("ok", make("ok"))],
                       {"x": X}, REFERENCE, timer)
    refuses, wrong, nan, ok = outcomes
    assert refuses.ms is None and refuses.skipped == "RuntimeError: No available kernel."
    assert wrong.ms is None and wrong.skipped.startswith("disagrees with the reference: rel err 5.00e-01")
    assert nan.ms is None and "disagrees" in nan.skipped
    assert best(outcomes).name == "ok"
    assert "- w p, wrong: disagrees" in report.skipped(
        [{"workload": "w", "preset": "p", "baselines": [o.__dict__ for o in outcomes]}])


def test_a_refusal_keeps_the_reason_given_in_warnings():
    def refuses_like_sdpa(x):
        for message in ("Flash attention kernel not used because:",
                        "Memory Efficient attention has been runtime disabled. (Triggered internally at a.h:1.)",
                        "Flash attention requires head dim <= 256 (Triggered internally at b.cpp:2.)"):
            warnings.warn(message)
        raise RuntimeError("No available kernel. Aborting execution.")

    (outcome,) = measure([Baseline("SDPA flash", refuses_like_sdpa)], {"x": X}, REFERENCE, _cpu_timer)
    assert outcome.skipped == ("RuntimeError: No available kernel. Aborting execution.; "
                               "Flash attention requires head dim <= 256")


def test_a_slow_first_call_is_over_budget():
    make, timer = _fake({"compiled": 0.1})
    (outcome,) = measure([Baseline("compiled", make("compiled"), first_call_budget_s=-1.0)],
                         {"x": X}, REFERENCE, timer)
    assert outcome.ms is None and "over the -1 s budget" in outcome.skipped


def test_a_preflight_reason_skips_the_baseline_before_its_first_call():
    calls = []
    (outcome,) = measure([Baseline("compiled", lambda **_: calls.append(1), preflight=lambda inputs: "too slow")],
                         {"x": X}, REFERENCE, lambda fn: 1.0)
    assert outcome.skipped == "too slow" and not calls


def test_a_compile_over_budget_is_stopped_in_its_own_process():
    """The child's compile is killed at the budget (here shorter than starting Python);
    within a budget it compiles and runs the workload's reference."""
    from benchmarks.strongest import compiles_within

    inputs = {"x": torch.randn(8, 16), "w": torch.randn(16, 4)}
    start = time.perf_counter()
    assert "still running after the 0 s budget: stopped" in compiles_within("matmul", "default", 0.2, inputs)
    assert time.perf_counter() - start < 30
    assert compiles_within("matmul", "default", 300, inputs) is None


def test_the_fallback_runs_only_when_nothing_else_does():
    make, timer = _fake({"math": 9.0, "fused": 1.0})
    with_fused = measure([Baseline("math", make("math"), fallback=True), Baseline("fused", make("fused"))],
                         {"x": X}, REFERENCE, timer)
    assert with_fused[0].skipped == NOT_NEEDED and best(with_fused).name == "fused"
    alone = measure([Baseline("fused", _refuse), Baseline("math", make("math"), fallback=True)],
                    {"x": X}, REFERENCE, timer)
    assert best(alone).name == "math" and alone[0].skipped
    assert best(measure([Baseline("fused", _refuse)], {"x": X}, REFERENCE, timer)) is None


def _cpu_timer(fn):
    fn()
    return 1.0


@pytest.mark.parametrize("name", ["mha_causal", "gqa", "gqa_decode", "mla_decode"])
def test_sdpa_on_cpu_skips_the_gpu_backends_and_agrees_with_the_workload(name):
    w = workloads.get(name)
    inputs = w.inputs(w.test_bindings[0], seed=3)
    reference = w.run_reference({k: v.float() for k, v in inputs.items()})
    sdpa = [b for b in baselines.for_workload(name, w.reference) if b.name.startswith("SDPA")]
    assert [b.name for b in sdpa] == ["SDPA cuDNN", "SDPA flash", "SDPA efficient", "SDPA math"]
    outcomes = {o.name: o for o in measure(sdpa, inputs, reference, _cpu_timer)}
    assert outcomes["SDPA cuDNN"].skipped and outcomes["SDPA efficient"].skipped  # CUDA only
    assert best(list(outcomes.values())) is not None  # CPU flash, or math when flash refuses


def test_a_baseline_of_another_function_is_dropped():
    w = workloads.get("mha_causal")
    inputs = w.inputs(w.test_bindings[0], seed=3)
    reference = w.run_reference({k: v.float() for k, v in inputs.items()})
    non_causal = baselines._sdpa(baselines.Attention(causal=False))
    (outcome,) = measure([Baseline("non-causal SDPA", non_causal)], inputs, reference, _cpu_timer)
    assert "disagrees" in outcome.skipped


def test_hugging_face_rope_in_bf16_then_sdpa_agrees_with_the_workload():
    w = workloads.get("rope_attention_causal")
    inputs = w.inputs({"b": 2, "h": 2, "s": 40, "d": 32}, seed=5)
    reference = [reference_rope_attention(**{k: v.float() for k, v in inputs.items()})]
    fn = baselines._after_rope(baselines._hf_rope, baselines._sdpa(baselines.Attention(causal=True)))
    (outcome,) = measure([Baseline("rope", fn)], inputs, reference, _cpu_timer)
    assert outcome.ms == 1.0, outcome.skipped


def _dense(q, k, v, variant: baselines.Attention):
    """The variants written naively: dense scores, mask and bias."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    i = torch.arange(q.shape[2])[:, None]
    j = torch.arange(k.shape[2])[None, :]
    if variant.softcap:
        s = variant.softcap * torch.tanh(s / variant.softcap)
    if variant.alibi:
        heads = q.shape[1]
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
        s = s - slopes[:, None, None] * (i - j)
    keep = torch.ones_like(s, dtype=torch.bool)
    if variant.causal:
        keep &= j <= i
    if variant.window:
        keep &= i - j < variant.window
    return torch.softmax(s.masked_fill(~keep, -math.inf), -1) @ v


@pytest.mark.parametrize("variant", [
    baselines.Attention(causal=True), baselines.Attention(causal=True, window=16),
    baselines.Attention(causal=True, softcap=5.0), baselines.Attention(causal=True, alibi=True),
    baselines.Attention(alibi=True)])
def test_flex_mods_compute_each_variant(variant):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 4, 150, 16, generator=g) for _ in range(3))
    keep, score_mod = baselines.flex_mods(variant, heads=4, device="cpu")
    mask = keep and create_block_mask(keep, None, None, 150, 150, device="cpu")
    got = flex_attention(q, k, v, score_mod=score_mod, block_mask=mask)  # unfused: eager is enough here
    torch.testing.assert_close(got, _dense(q, k, v, variant), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["mha_softcap", "mha_alibi", "mha_window"])
def test_flex_baseline_of_each_variant_computes_the_workload(name):
    """The flex_attention the GPU run times against a variant computes that workload's
    reference (the window shortened to 5 on both sides, so it cuts these sequences)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    w = workloads.get(name)
    variant, reference = baselines.ATTENTION[name], w.reference
    if variant.window:
        variant = dataclasses.replace(variant, window=5)
        reference = functools.partial(reference_window, window=5)
    inputs = {k: v.float() for k, v in w.inputs(w.test_bindings[0], seed=9).items()}
    heads, s = inputs["q"].shape[1:3]
    keep, score_mod = baselines.flex_mods(variant, heads=heads, device="cpu")
    mask = create_block_mask(keep, None, None, s, s, device="cpu")
    got = flex_attention(inputs["q"], inputs["k"], inputs["v"], score_mod=score_mod, block_mask=mask)
    torch.testing.assert_close(got, reference(**inputs), rtol=1e-4, atol=1e-4)


def test_every_attention_workload_has_a_flex_baseline_and_gemms_autotune():
    names = set(workloads.names())
    assert set(baselines.ATTENTION) | set(baselines.ROPE_ATTENTION) <= names and baselines.GEMM <= names
    ref = workloads.get("matmul").reference
    got = {b.name: b for b in baselines.for_workload("matmul", ref)}
    assert got["torch.compile max-autotune"].first_call_budget_s == baselines.AUTOTUNE_BUDGET_S
    assert "cuBLAS" in got and "flex_attention" not in got
    assert "flex_attention" in {b.name for b in baselines.for_workload("gqa_causal", ref)}
