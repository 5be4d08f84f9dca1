"""A split over a dynamic extent: the scheduler keeps plans for every count of its
ladder, and the operator runs, per shape, only a plan whose chunks are all
non-empty there. Kernels run under TRITON_INTERPRET=1 against the fp64 interpreter."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from cleave import workloads as W
from cleave.interpreter import interpret
from cleave.ir import BindingError
from cleave.runtime.operator import CompiledOperator, NotReadyDuringCapture
from cleave.runtime.launch import launch
from cleave.scheduler import schedule
from cleave.scheduler.api import DYNAMIC_SPLITS, dynamic_split_counts
from fixtures_candidates import CANDIDATES
from kernel_check import LOOPS, run_and_check

DECODE = {"b": 2, "hkv": 2, "g": 3, "L": 45, "d": 16}


def test_dynamic_split_keeps_every_count_of_the_ladder():
    cand = CANDIDATES["gqa_decode"]()
    plans = schedule(cand, DECODE, dynamic={"b", "L"}, target=LOOPS, top_k=1)
    counts = [p.split["sp"] for p in plans]
    assert set(counts) == set(DYNAMIC_SPLITS)
    assert len(set(counts[:len(DYNAMIC_SPLITS)])) == len(DYNAMIC_SPLITS)  # one of each first
    for p in plans:  # ranked where the largest count leaves chunks of a tile or more
        assert p.env["L"] >= 64 * max(DYNAMIC_SPLITS)
    by_count = {p.split["sp"]: p for p in reversed(plans)}
    for s, L in ((1, 45), (4, 45), (8, 61)):
        run_and_check(cand.graph, by_count[s], {**DECODE, "L": L}, seed=L + s)


def test_operator_runs_only_plans_that_fit_the_shape(monkeypatch, tmp_path):
    """The searched candidate's split rules hold only without empty chunks: at L=45 a
    count of 16 or 32 would leave some, so the operator must pick another plan there."""
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    op = CompiledOperator(W.get("gqa_decode").graph, {"b", "L"}, top_k=1)
    for L in (45, 9, 700):
        env = {**DECODE, "L": L}
        inputs = W.get("gqa_decode").inputs(env, seed=L)
        plan, spec = op.select(inputs)
        (count,) = plan.split.values()
        assert (count - 1) * -(-L // count) < L
        got = op(inputs)[0]
        # top_k = 1 plan of every count: the profile chooses the count, not the model
        assert sorted(c for p in spec.plans for c in p.split.values()) == list(DYNAMIC_SPLITS)
        ref = interpret(W.get("gqa_decode").graph, inputs, compute_dtype=torch.float64)[0]
        assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-2
    assert op.stats["searches"] == 1 and op.stats["compiles"] == 1
    widest = next(p for p in spec.plans if max(p.split.values()) == max(DYNAMIC_SPLITS))
    with pytest.raises(BindingError, match="no empty chunk"):  # launched directly at a short L
        launch(widest, W.get("gqa_decode").inputs({**DECODE, "L": 45}, seed=0))


def test_dynamic_reduced_extent_is_ranked_short_and_long():
    """Prefill over a dynamic s: one set of kernels serves s=5 and s=4000, so the kept
    plans come from rankings at the first shape and at a long s, and each runs at both."""
    cand = CANDIDATES["mha_causal"]()
    env = {"b": 1, "h": 2, "s": 37, "d": 16}
    plans = schedule(cand, env, dynamic={"s"}, target=LOOPS, top_k=4)
    assert {p.env["s"] for p in plans} == {37, 4096}
    long = next(p for p in plans if p.env["s"] == 4096)
    for s in (5, 37):
        run_and_check(cand.graph, long, {**env, "s": s}, seed=s)


def test_grid_lanes_past_a_dynamic_extent_load_unmasked():
    """A q tile's rows past a dynamic s are never stored: the load reads row s-1 there
    instead of masking (a masked tl.dot operand made Triton spill registers), the store
    still masks them, and results hold at odd s into a poisoned output."""
    cand = CANDIDATES["mha_causal"]()
    env = {"b": 1, "h": 2, "s": 37, "d": 16}
    plan = schedule(cand, env, dynamic={"s"}, target=LOOPS, top_k=1)[0]
    lines = [line for k in plan.kernels for line in k.source.splitlines()]
    q_load = next(line for line in lines if "tl.load(q_ptr" in line)
    assert "tl.minimum(idx" in q_load and "mask=" not in q_load, q_load
    assert all("mask=" in line for line in lines if "tl.store(" in line)
    for s in (5, 37, 50):
        run_and_check(cand.graph, plan, {**env, "s": s}, seed=s)


def test_gpu_branch_compiles_every_plan_once_and_ranks_each_bucket(monkeypatch, tmp_path, capsys):
    """The CUDA branch of the plan choice, run here with a recording launch (the
    kernels' numerics are tested elsewhere): the first call launches every plan, those
    that do not fit the shape on scratch inputs; each shape bucket is ranked once and
    saved; both steps report."""
    import cleave.runtime.operator as operator
    from cleave.runtime import artifact as A

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    scratch, launched = operator._scratch, []
    monkeypatch.setattr(operator, "_scratch", lambda plan, device: scratch(plan, "meta"))
    monkeypatch.setattr(operator, "launch", lambda plan, inputs, out=None: launched.append(id(plan)) or [None])
    op = CompiledOperator(W.get("gqa_decode").graph, {"b", "L"}, top_k=1)
    op.device = torch.device("cuda")
    for L in (45, 50, 700):
        op(W.get("gqa_decode").inputs({**DECODE, "L": L}, seed=L))
    (spec,) = op.specs.values()
    assert spec.warm and set(launched) >= {id(p) for p in spec.plans}
    assert op.stats["tunings"] == 2
    assert set(A.load_tuning(op.entry, spec.static)) == {"L=64,b=2", "L=1024,b=2"}
    err = capsys.readouterr().err
    assert f"[cleave compile] gqa_decode: plan {len(spec.plans)}/{len(spec.plans)}" in err
    assert "[cleave tune] gqa_decode bucket L=1024,b=2" in err


@pytest.mark.parametrize("error, serves", [
    (RuntimeError("PassManager::run failed"), True),  # triton 3.6 on a persistent split-K GEMM's fused loops
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),  # the context is lost
])
def test_a_plan_triton_cannot_compile_is_left_out(monkeypatch, tmp_path, error, serves):
    """The CUDA branch, with a recording launch: a plan whose kernels fail to compile is
    left out (one warning names it) and the others serve; the whole operator ran eagerly.
    A fault of the device itself still fails the operator, and so does every plan failing."""
    import warnings

    import cleave.runtime.operator as operator

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    scratch, launched = operator._scratch, []
    monkeypatch.setattr(operator, "_scratch", lambda plan, device: scratch(plan, "meta"))
    op = CompiledOperator(W.get("gqa_decode").graph, {"b", "L"}, top_k=3)
    op.device = torch.device("cuda")
    def launch(plan, inputs, out=None):
        (spec,) = op.specs.values()
        if plan is spec.plans[0]:
            raise error
        launched.append(plan)
        return [None]

    monkeypatch.setattr(operator, "launch", launch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if not serves:
            with pytest.raises(operator.CompileFailure, match="illegal memory access"):
                op(W.get("gqa_decode").inputs(DECODE, seed=1))
            return
        for L in (45, 50):
            op(W.get("gqa_decode").inputs({**DECODE, "L": L}, seed=L))
    (spec,) = op.specs.values()
    assert spec.broken == {0} and len(spec.plans) > 1
    assert all(plan is not spec.plans[0] for plan in launched)
    said = [str(w.message) for w in caught if "does not compile" in str(w.message)]
    assert said == ["cleave: plan 0 of gqa_decode does not compile here (RuntimeError: PassManager::run failed); "
                    "the other plans serve"]
    # every plan failing: the operator fails (its caller runs it eagerly)
    op2 = CompiledOperator(W.get("gqa_decode").graph, {"b", "L"}, top_k=3)
    op2.device = torch.device("cuda")
    monkeypatch.setattr(operator, "launch", lambda plan, inputs, out=None: (_ for _ in ()).throw(error))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(operator.CompileFailure, match="no plan of gqa_decode compiles here"):
            op2(W.get("gqa_decode").inputs(DECODE, seed=1))


def test_each_wave_count_of_a_buckets_choice_is_timed_once(monkeypatch, tmp_path):
    """Inside one bucket (b in 33..64) the chosen plan's programs need one wave over the
    SMs at b=33 and two at b=36: the second count gets its own timing, once, and the
    shape it was timed at keeps the bucket's ranking."""
    import cleave.runtime.operator as operator
    from cleave.runtime import artifact as A

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    scratch = operator._scratch
    monkeypatch.setattr(operator, "_scratch", lambda plan, device: scratch(plan, "meta"))
    monkeypatch.setattr(operator, "launch", lambda plan, inputs, out=None: [None])
    monkeypatch.setattr(operator, "run", lambda prepared, inputs, out=None: [None])  # b=33 again
    monkeypatch.setattr(operator, "waves", lambda plan, inputs: 1 if inputs["q"].shape[0] <= 33 else 2)
    op = CompiledOperator(W.get("gqa_decode").graph, {"b", "L"}, top_k=1)
    op.device = torch.device("cuda")
    for b in (33, 36, 40, 33):
        op(W.get("gqa_decode").inputs({**DECODE, "b": b, "L": 45}, seed=b))
    assert op.stats["tunings"] == 2
    (spec,) = op.specs.values()
    assert set(A.load_tuning(op.entry, spec.static)) == {"L=64,b=64", "L=64,b=64;waves=1", "L=64,b=64;waves=2"}


def test_shapes_first_met_during_graph_capture_are_built_after_it(monkeypatch, tmp_path):
    """Compiling plans and timing a bucket launch kernels of their own, which a CUDA
    graph capture would record or refuse: a shape first met during a capture raises
    NotReadyDuringCapture with nothing launched, timed or remembered; outside the
    capture the same shape is built as usual, and a later capture simply launches it."""
    import cleave.runtime.operator as operator

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    scratch, launched, capturing = operator._scratch, [], [True]
    monkeypatch.setattr(operator, "_scratch", lambda plan, device: scratch(plan, "meta"))
    monkeypatch.setattr(operator, "launch", lambda plan, inputs, out=None: launched.append("built") or [None])
    monkeypatch.setattr(operator, "run", lambda prepared, inputs, out=None: launched.append("ready") or [None])
    monkeypatch.setattr(operator, "_capturing", lambda device: capturing[0])
    op = CompiledOperator(W.get("gqa_decode").graph, {"b", "L"}, top_k=1)
    op.device = torch.device("cuda")
    inputs = W.get("gqa_decode").inputs({**DECODE, "L": 45}, seed=1)
    with pytest.raises(NotReadyDuringCapture, match="first met during CUDA graph capture"):
        op(inputs)
    assert launched == [] and op.stats["tunings"] == 0 and not op._ready and not op._dispatch
    capturing[0] = False
    op(inputs)
    assert op.stats["tunings"] == 1 and set(launched) == {"built"}
    capturing[0], launched[:] = True, []
    op(inputs)
    assert launched == ["ready"]


def test_blocks_per_sm_is_the_tightest_resource():
    """Occupancy from a compiled kernel's registers, shared memory and warps."""
    from types import SimpleNamespace as NS

    from cleave.runtime.waves import blocks_per_sm

    h200 = NS(max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
              shared_memory_per_multiprocessor=233472)
    kernel = lambda regs, shared, warps: NS(n_regs=regs, metadata=NS(num_warps=warps, shared=shared))
    assert blocks_per_sm(kernel(128, 98304, 4), h200) == 2  # shared memory: 96 KiB tiles
    assert blocks_per_sm(kernel(255, 0, 8), h200) == 1  # registers
    assert blocks_per_sm(kernel(32, 0, 4), h200) == 16  # threads
    assert blocks_per_sm(NS(), h200) is None  # the interpreter reports no resources


def test_two_dynamic_splits_are_profiled_one_at_a_time():
    """The paged prefill splits its kv axis and its segment-id count: every count of each
    against 1 of the other (11 settings), not their cross product (36, 72 plans, over
    three minutes of first-call compiles on the H200); a static split stays at 1."""
    counts = dynamic_split_counts(["s_a", "s_b", "s_c"], {"s_a", "s_b"})
    assert len(counts) == 2 * len(DYNAMIC_SPLITS) - 1
    assert all(sum(v > 1 for v in c.values()) <= 1 and c["s_c"] == 1 for c in counts)
    assert {c["s_a"] for c in counts} == {c["s_b"] for c in counts} == set(DYNAMIC_SPLITS)
