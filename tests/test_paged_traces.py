"""The paged serving traces (traces/simulate_paged.py, issue 14): per-step CSR layouts
from a free list, page sizes 1 and 64, at least 300 shapes across the nine definitions,
and `cleave trace replay` over them with one operator and no recompile."""
from __future__ import annotations

import importlib.util
import time
import warnings
from pathlib import Path

import torch

import cleave
from cleave.frontends.capture import capture_program
from cleave.interpreter import interpret
from cleave.runtime.replay import replay
from cleave.runtime.traces import load_trace
from cleave.workloads import flashinfer as F

TRACES = Path(__file__).parent.parent / "traces"
_spec = importlib.util.spec_from_file_location("simulate_paged", TRACES / "simulate_paged.py")
simulate_paged = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(simulate_paged)

TINY = dict(per_definition=3, max_batch=3, chunk_budget=12, pool_tokens=256, prompt=(8, 0.5, 2, 16),
            output=(4, 0.5, 2, 8), warmup=20)


def test_full_run_has_300_shapes_with_scattered_pages_of_both_sizes():
    steps = simulate_paged.simulate(seed=0)
    assert set(steps) == set(F.FLASHINFER_BENCH)
    assert sum(len(s) for s in steps.values()) >= 300
    for name, batches in steps.items():
        size = F.DEFINITIONS[name][1].get("page_size", 1)
        for q_lens, kv_lens, pages, pool in batches:
            assert [len(p) for p in pages] == [-(-n // size) for n in kv_lens]
            assert all(q <= kv for q, kv in zip(q_lens, kv_lens))
            flat = [i for p in pages for i in p]
            assert len(set(flat)) == len(flat) and max(flat) < pool  # no page is shared
        if size == 1:  # after the warmup, finished requests' pages come back scattered
            assert any(p != list(range(p[0], p[0] + len(p))) for _, _, pages, _ in batches for p in pages), name
    assert {F.DEFINITIONS[n][1].get("page_size") for n in steps} >= {1, 64}
    assert simulate_paged.simulate(seed=0, **TINY) == simulate_paged.simulate(seed=0, **TINY)


def test_written_lines_validate_and_hold_consistent_layouts(tmp_path):
    simulate_paged.write(tmp_path, seed=1, **TINY)
    for name in F.FLASHINFER_BENCH:
        definition, lines = load_trace(tmp_path / "workloads" / f"{name}.jsonl")
        assert definition == F.definition(name)
        for line in lines:
            axes, inputs = line["workload"]["axes"], line["workload"]["inputs"]
            indptr = inputs["kv_indptr"]["value"]
            assert len(indptr) == axes["len_indptr"]
            if "kv_indices" in inputs:
                assert indptr[-1] == len(inputs["kv_indices"]["value"]) == axes["num_kv_indices"]
            assert inputs["sm_scale"]["type"] == "scalar"


def test_replay_runs_one_operator_without_recompiling(tmp_path):
    """Small heads (--const) over the simulator's tiny layouts; under the interpreter
    Triton compiles nothing, so only searches and schedules are counted."""
    simulate_paged.write(tmp_path, seed=2, **TINY)
    name = "gqa_paged_decode_h32_kv8_d128_ps1"
    seen = []

    def baselines(inputs):  # what benchmarks/replay_paged.py hands over: named inputs, no-argument runs
        seen.append(sorted(inputs))
        return [("sleeps", lambda: time.sleep(0.05)), ("returns", lambda: None)]

    result = replay(tmp_path / "workloads" / f"{name}.jsonl", device="cpu",
                    const={"num_qo_heads": 6, "num_kv_heads": 2, "head_dim": 16}, baselines=baselines)
    assert len(result.shapes) == 3 and len({tuple(s.axes.items()) for s in result.shapes}) == 3
    assert result.recompiles == 0 and result.stats["operators"] == 1 and result.stats["failed"] == 0
    assert all(s.max_error < 5e-2 for s in result.shapes)
    assert seen == [sorted(load_trace(tmp_path / "workloads" / f"{name}.jsonl")[0]["inputs"])] * 3
    assert {s.baseline for s in result.shapes} == {"returns"}  # the fastest baseline is the one compared


RAGGED = "gqa_ragged_prefill_causal_h32_kv4_d128"


def _ragged_prefill():
    """The ragged prefill at small heads: its kind, const axes, and inputs (f64 unless
    told) for given query and kv lengths per request."""
    kind = F.kind_of(RAGGED)
    const = {"num_qo_heads": 4, "num_kv_heads": 2, "head_dim": 8}

    def inputs(q_lens, kv_lens, seed, dtype=torch.float64):
        q_lens, kv_lens, pages, pool = F._layout(RAGGED, q_lens, kv_lens, seed)
        return F.layout_inputs(RAGGED, q_lens, pages, kv_lens, pool, const=const, seed=seed, dtype=dtype)
    return kind, const, inputs


def _serves_batches_with_an_empty_request(graph, kind, inputs):
    args = inputs([2, 0, 3], [4, 0, 9], 1)
    got = interpret(graph, dict(zip(kind.inputs, args)), compute_dtype=torch.float64)
    for g, want in zip(got, kind.reference(*args)):
        torch.testing.assert_close(g, want.to(g.dtype), rtol=1e-5, atol=1e-5)  # the reference runs in f32


def test_a_first_step_of_one_request_captures_with_its_axes_dynamic():
    """The traces' first prefill step holds one request, so `indptr[1:-1]` is empty and
    torch.export specialised len_indptr to 2: `cleave trace build` failed with "does not
    capture whole" on all four prefill definitions. Traced as if the axis had any extent,
    the graph serves every batch (and schedules: its slice of the interior boundaries is
    len_indptr - 2 as when traced at more requests, not Max(0, len_indptr - 2))."""
    kind, const, inputs = _ragged_prefill()
    graph = capture_program(kind.program, *inputs([3], [5], 0), dynamic=F.dynamic_axes(kind), name=RAGGED).graph
    assert "len_indptr" in str(graph.inputs["qo_indptr"].shape)
    assert "Max" not in graph.text()  # the interior boundaries' slice: len_indptr - 2, not clamped at 0
    _serves_batches_with_an_empty_request(graph, kind, inputs)
    # kernels take it in bf16, as served (an f64 MatMul is left to torch: kernels contract in f32)
    served = capture_program(kind.program, *inputs([3], [5], 0, torch.bfloat16), dynamic=F.dynamic_axes(kind),
                             name=RAGGED).graph
    binding = {"total_q": 5, "total_kv": 13, "len_indptr": 4, **const}
    assert cleave.schedule(served, binding, dynamic={"total_q", "total_kv", "len_indptr"}, top_k=1)


def test_a_step_of_two_requests_captures_where_size_oblivious_tracing_leaves_a_size_unbound(monkeypatch):
    """On torch 2.11 (the H200's image) every prefill trace failed to capture: their
    steps hold at most two requests, so `indptr[1:-1]` has one element and export
    specialised len_indptr to 3, and the size-oblivious retry leaves an unbacked size.
    Here 2.13's retry is made to report one; the capture then traces wider zeros (every
    short dynamic extent 8 larger) and the graph still serves every batch."""
    import torch.fx.experimental.symbolic_shapes as shapes

    kind, _, inputs = _ragged_prefill()
    monkeypatch.setattr(shapes, "free_unbacked_symbols", lambda value: {"u0"})
    graph = capture_program(kind.program, *inputs([3, 4], [5, 4], 0), dynamic=F.dynamic_axes(kind), name=RAGGED).graph
    assert "len_indptr" in str(graph.inputs["qo_indptr"].shape)
    _serves_batches_with_an_empty_request(graph, kind, inputs)


def test_a_replay_captures_the_program_at_its_widest_step():
    """The operator is captured at the first call: a replay starts with the step whose
    smallest var axis is largest, not with a one-request step whose indptr slices are
    empty (torch 2.11's export failed there on the H200 with an unbacked size)."""
    from cleave.runtime.replay import _captured_first

    steps = [{"workload": {"axes": {"len_indptr": 2, "total_q": 300}}},
             {"workload": {"axes": {"len_indptr": 5, "total_q": 40}}},
             {"workload": {"axes": {"len_indptr": 4, "total_q": 90}}}]
    assert _captured_first(steps, 1.0) == [steps[1], steps[0], steps[2]]
    # A step of fresh prompts (total_q == total_kv) is captured only where no other
    # step's extents all differ: torch may give equal extents one symbol.
    steps = [{"workload": {"axes": {"len_indptr": 5, "total_q": 90, "total_kv": 90}}},
             {"workload": {"axes": {"len_indptr": 3, "total_q": 40, "total_kv": 70}}}]
    assert _captured_first(steps, 1.0) == [steps[1], steps[0]]


def test_a_program_export_cannot_take_whole_says_why():
    """A replay must not time eager PyTorch as cleave: when torch.export refuses the
    program (the first call then runs eagerly, later ones through dynamo's graphs), the
    compiled function keeps the reason, and `replay` raises with it."""
    def branches(x):
        return x * 2 if x.sum() > 0 else x - 1  # a data-dependent branch

    compiled = cleave.compile(branches)
    x = torch.randn(5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(x)
    torch.testing.assert_close(got, branches(x))
    assert compiled.capture_error, compiled.capture_error


def test_const_axes_of_a_flashinfer_definition_pass_the_clis_check(tmp_path):
    """`cleave trace replay --const num_qo_heads=6,num_kv_heads=2,head_dim=16` (the way to
    replay these at small heads on a CPU) was refused for every FlashInfer definition:
    the check bound the program's graph, which holds the heads at 32 and 8."""
    from cleave.cli.trace import _check_const

    simulate_paged.write(tmp_path, seed=1, **TINY)
    for name in ("gqa_paged_decode_h32_kv8_d128_ps1", "gqa_ragged_prefill_causal_h32_kv4_d128"):
        _check_const(str(tmp_path / "workloads" / f"{name}.jsonl"),
                     {"num_qo_heads": 6, "num_kv_heads": 2, "head_dim": 16})
