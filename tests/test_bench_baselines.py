"""The benchmark's strongest-baseline selection (benchmarks/strongest.py) and the
baselines' formulations (benchmarks/baselines.py), on CPU at tiny shapes. Nothing
here asserts a timing: fake timers stand in for do_bench."""
import dataclasses
import functools
import math
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


def test_graph_replays_pick_their_own_strongest():
    """Replayed from CUDA graphs, another baseline may be fastest (launch gaps gone); one
    that cannot be captured has no graph time and is not the strongest there."""
    calls = []

    def make(name):
        return lambda x: (calls.append(name), x * 2)[1]

    def timer(costs):
        return lambda fn: (fn(), costs[calls[-1]])[1]

    per_call = timer({"one kernel": 1.0, "three kernels": 1.2, "host sync": 0.9})
    in_graphs = timer({"one kernel": 0.95, "three kernels": 0.8, "host sync": None})
    names = ["one kernel", "three kernels", "host sync"]
    outcomes = measure([Baseline(n, make(n)) for n in names], {"x": X}, REFERENCE, per_call, graph_timer=in_graphs)
    assert [o.graph_ms for o in outcomes] == [0.95, 0.8, None]
    assert best(outcomes).name == "host sync" and best(outcomes, "graph_ms").name == "three kernels"
    assert measure([Baseline("one kernel", make("one kernel"))], {"x": X}, REFERENCE, per_call)[0].graph_ms is None


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


def test_a_floor_is_timed_unchecked_reported_beside_cleave_and_never_the_strongest():
    """A floor computes part of the workload (its GEMM alone): not its output, so it is
    not checked against the reference, and it can never be the strongest."""
    make, timer = _fake({"gemm alone": 0.5, "ok": 1.0})
    outcomes = measure([Baseline("gemm alone", make("gemm alone", X * 7), floor=True), Baseline("ok", make("ok"))],
                       {"x": X}, REFERENCE, timer)
    assert outcomes[0].ms == 0.5 and outcomes[0].secondary and outcomes[0].rel_err is None
    assert best(outcomes).name == "ok"
    rows = [{"workload": "w", "preset": "p", "cleave_ms": 0.6, "baselines": [o.__dict__ for o in outcomes]}]
    assert "- w p, gemm alone: 0.5000 ms; cleave's served plan takes 1.20× this" in report.secondary(rows)


@pytest.mark.parametrize("name", ["rmsnorm_matmul", "swiglu"])
def test_the_gemm_floors_compute_the_workloads_gemms(name):
    w = workloads.get(name)
    inputs = w.inputs({"s": 5, "k": 8, "n": 6}, seed=0)
    (floor,) = [b for b in baselines.for_workload(name, w.reference) if b.floor]
    got = floor.fn(**inputs)
    want = [inputs["x"] @ inputs[key] for key in inputs if key != "x"]
    assert all(torch.equal(g, e) for g, e in zip(got if isinstance(got, tuple) else [got], want))


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
    assert "still running after the 0 s budget: stopped" in compiles_within("matmul", "default", 0.2, inputs)
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


# The paged definitions' baselines (benchmarks/paged_baselines.py): each computes the
# definition's fp64 reference on a batch with random, non-contiguous pages and an empty
# request (the suite's second test batch: kv lengths 4, 0, 9, 2).

def _paged_case(name):
    from cleave.workloads import flashinfer

    w = workloads.get(name)
    inputs = w.inputs(w.test_bindings[1], seed=4, dtype=torch.float32)
    pages = inputs.get("kv_indices", inputs.get("block_tables"))
    if pages is not None:
        assert not (pages.flatten()[1:] - pages.flatten()[:-1] == 1).all()  # not one contiguous run
    as64 = {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}
    return inputs, flashinfer.kind_of(name).reference(**as64)


def _run_paged(baseline, inputs):
    return baseline.fn(**baseline.prepare(inputs))


@pytest.mark.parametrize("name", list(workloads.flashinfer.DEFINITIONS))
def test_padded_sdpa_computes_each_paged_definition(name):
    from benchmarks import paged_baselines

    inputs, (out, lse) = _paged_case(name)
    assert (paged_baselines.layout(name, inputs).kv_len == 0).any()  # the empty request
    for folded in (False, True):
        for pregather in (False, True):
            prepare = functools.partial(paged_baselines._prepare_padded, name, pregather=pregather)
            fn = paged_baselines.pregathered_sdpa(folded) if pregather else paged_baselines.padded_sdpa(name, folded)
            got = _run_paged(Baseline("sdpa", fn, prepare=prepare), inputs)
            torch.testing.assert_close(got.double(), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(workloads.flashinfer.DEFINITIONS))
def test_paged_flex_attention_computes_each_paged_definition(name):
    """Eager (unfused) flex_attention on CPU; the GPU run compiles the same call."""
    from benchmarks import paged_baselines

    inputs, reference = _paged_case(name)
    baseline = Baseline("flex", paged_baselines.paged_flex(name, compiled=False),
                        prepare=functools.partial(paged_baselines._prepare_flex, name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "called without torch.compile", return_lse's deprecation
        got = _run_paged(baseline, inputs)
    for g, r in zip(got, reference):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-5)


def test_paged_baselines_are_offered_and_checked_on_what_they_return():
    """Every definition gets the padded SDPA forms on each backend and paged flex; SDPA is
    checked on the output alone, its pre-gathered timing is secondary (never the
    strongest), and an lse of -inf (the empty request) is matched, not an error."""
    name = "gqa_paged_decode_h32_kv8_d128_ps1"
    got = {b.name: b for b in baselines.for_workload(name, workloads.get(name).reference)}
    assert {"padded SDPA (enable_gqa) flash", "padded SDPA (GQA folded) efficient", "paged flex_attention",
            "pre-gathered SDPA (GQA folded) cuDNN"} <= set(got)
    assert got["padded SDPA (GQA folded) flash"].outputs == 1 and got["paged flex_attention"].outputs is None
    assert got["pre-gathered SDPA (GQA folded) flash"].secondary
    ref = [torch.tensor([1.0, 2.0]), torch.tensor([0.5, -math.inf])]
    make, timer = _fake({"output only": 1.0, "secondary": 0.1, "both": 2.0})
    outcomes = measure([Baseline("output only", make("output only", ref[0]), outputs=1),
                        Baseline("secondary", make("secondary", ref[0]), outputs=1, secondary=True),
                        Baseline("both", make("both", ref))], {"x": X}, ref, timer)
    assert [o.rel_err for o in outcomes] == [0.0, 0.0, 0.0]
    assert best(outcomes).name == "output only"
    assert "- w p, secondary: 0.1000 ms" in report.secondary([{"workload": "w", "preset": "p",
                                                         "baselines": [o.__dict__ for o in outcomes]}])
    wrong = [torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.0])]
    assert math.isinf(measure([Baseline("both", make("both", wrong))], {"x": X}, ref, timer)[0].rel_err or math.inf)


def test_decode_bytes_count_the_pages_used_q_and_outputs():
    from benchmarks.paged_baselines import copy_ceiling_fraction, decode_bytes

    bf16, i32 = torch.bfloat16, torch.int32
    # 3 requests, 4 heads of 8 over 2 kv heads, one-token pages: 12 pages listed of a pool of 20.
    gqa = {"q": torch.zeros(3, 4, 8, dtype=bf16), "k_cache": torch.zeros(20, 1, 2, 8, dtype=bf16),
           "v_cache": torch.zeros(20, 1, 2, 8, dtype=bf16), "kv_indptr": torch.tensor([0, 5, 5, 12], dtype=i32),
           "kv_indices": torch.arange(12, dtype=i32), "sm_scale": torch.tensor(0.3)}
    # K and V: 12 pages * 2 heads * 8 * 2 B each = 384 + 384; q 3*4*8*2 = 192; output 192; lse 3*4*4 = 48.
    assert decode_bytes("gqa_paged_decode_h32_kv8_d128_ps1", gqa) == 384 + 384 + 192 + 192 + 48
    # Block table: seq_lens 5, 0, 17 in 16-token pages use 1 + 0 + 2 pages of 16*2*8*2 = 512 B (K, V each).
    table = {**gqa, "k_cache": torch.zeros(9, 16, 2, 8, dtype=bf16), "v_cache": torch.zeros(9, 16, 2, 8, dtype=bf16),
             "block_tables": torch.zeros(3, 4, dtype=i32), "seq_lens": torch.tensor([5, 0, 17], dtype=i32)}
    assert decode_bytes("block_table_decode_h32_kv8_d128_ps16", table) == 3 * 512 * 2 + 192 + 192 + 48
    # MLA: 7 latent pages of 16 + 4 values read once (keys and values): 7 * 20 * 2 = 280; q 2*3*20*2 = 240;
    # output 2*3*16*2 = 192; lse 2*3*4 = 24.
    mla = {"q_nope": torch.zeros(2, 3, 16, dtype=bf16), "q_pe": torch.zeros(2, 3, 4, dtype=bf16),
           "ckv_cache": torch.zeros(10, 1, 16, dtype=bf16), "kpe_cache": torch.zeros(10, 1, 4, dtype=bf16),
           "kv_indptr": torch.tensor([0, 3, 7], dtype=i32), "kv_indices": torch.arange(7, dtype=i32),
           "sm_scale": torch.tensor(0.1)}
    assert decode_bytes("mla_paged_decode_h16_ckv512_kpe64_ps1", mla) == 280 + 240 + 192 + 24
    assert decode_bytes("gqa_ragged_prefill_causal_h32_kv8_d128", {}) is None
    assert copy_ceiling_fraction(4.3e9, 1.0) == pytest.approx(1.0)  # 4.3 GB in 1 ms: the ceiling
    assert copy_ceiling_fraction(None, 1.0) is None
    row = {"workload": "w", "preset": "p", "plans": [{"ms": 2.0}], "cleave_ms": 2.0, "baselines": [],
           "strongest": {"name": "b", "ms": 4.0}, "decode_bytes": int(4.3e9)}
    assert report.table([row]).splitlines()[-1].endswith("| 50% / 25% | — | none captured | — |")
    row.update(cleave_graph_ms=1.0, strongest_graph={"name": "b", "graph_ms": 3.0})
    assert report.table([row]).splitlines()[-1].endswith(
        "| 50% / 25% | 1.0000 (100% of the copy ceiling) | b (3.0000) | 3.00 |")


def test_cleave_is_timed_as_the_runtime_serves_it(monkeypatch):
    """cleave's time is the plan the runtime's own ranking picks, not the fastest of the
    benchmark's timings (an oracle's pick among noisy samples); a served plan past the
    tolerance leaves no time."""
    import cleave.runtime.mix as mix
    import cleave.runtime.profile as profile
    from cleave.benchmarking import _serve

    monkeypatch.setattr(profile, "rank", lambda plans, inputs: [1, 0, 2][:len(plans)])
    monkeypatch.setattr(mix, "fastest_kernels", lambda plans, order, inputs: None)
    monkeypatch.setattr(profile, "graph_ms", lambda fn, calls, cold: 0.8 if cold else None)
    records = [{"index": 0, "ms": 0.9, "rel_err": 1e-3}, {"index": 1, "ms": 1.0, "rel_err": 1e-3},
               {"index": 2, "error": "OutOfResources"}]
    row = {"plans": [dict(r) for r in records]}
    _serve(row, [None, None, None], {}, [])
    assert (row["served"], row["cleave_ms"], row["best_ms"], row["cleave_graph_ms"]) == ("plan 1", 1.0, 0.9, 0.8)
    row = {"plans": [dict(r) for r in records]}
    row["plans"][1]["rel_err"] = 0.5
    _serve(row, [None, None, None], {}, [])
    assert (row["served"], row["cleave_ms"], row["best_ms"], row["cleave_graph_ms"]) == ("plan 1", None, 0.9, None)
