"""The partitioner's choice between fusing a MatMul operand (recomputed once per tile of
the other side) and materialising it once (scheduler/recompute.py), both ways, and
the materialised plan's kernels against the fp64 interpreter."""
from __future__ import annotations

import re

import cleave
from cleave import workloads
from kernel_check import computed_kernels, run_and_check

NORM_MM = workloads.get("rmsnorm_matmul").graph  # x (s, k) -> RMSNorm -> @ w (k, n)


def _stores(plan) -> list[list[str]]:
    return [re.findall(r"tl\.store\((\w+)_ptr", k.source) for k in plan.kernels]


def test_wide_projection_materialises_its_normed_rows_in_their_own_dtype():
    """14336 output columns: 112 programs per row tile would each renormalise the rows."""
    (plan,) = cleave.schedule(NORM_MM, {"s": 2048, "k": 4096, "n": 14336}, top_k=1)
    assert len(plan.kernels) == 2, _stores(plan)
    (normed,) = plan.intermediates
    assert normed.dtype == "bf16" and normed.shape == ["s", "k"]
    assert _stores(plan)[0] == [normed.name] and "tl.dot(" in plan.kernels[1].source
    assert f"{normed.name}_ptr" in plan.kernels[1].source and "x_ptr" not in plan.kernels[1].source


def test_narrow_projection_keeps_the_norm_in_its_operand():
    """64 output columns: one program per row tile, nothing is computed twice."""
    (plan,) = cleave.schedule(NORM_MM, {"s": 2048, "k": 4096, "n": 64}, top_k=1)
    assert len(plan.kernels) == 1 and not plan.intermediates


def test_the_recompute_weight_moves_the_crossover_both_ways():
    """Target.recompute_weight: 0 always fuses, inf always cuts (benchmarks/crossover.py
    measures the partition the model did not choose). At 2048 rows and 14336 columns
    the model cuts; at 64 columns nothing is computed twice, so even inf fuses."""
    import dataclasses
    import math

    from cleave.scheduler import H200

    wide, narrow = {"s": 2048, "k": 4096, "n": 14336}, {"s": 2048, "k": 4096, "n": 64}
    fused = dataclasses.replace(H200, recompute_weight=0.0)
    cut = dataclasses.replace(H200, recompute_weight=math.inf)
    assert len(cleave.schedule(NORM_MM, wide, top_k=1, target=fused)[0].kernels) == 1
    assert len(cleave.schedule(NORM_MM, wide, top_k=1, target=cut)[0].kernels) == 2
    assert len(cleave.schedule(NORM_MM, narrow, top_k=1, target=cut)[0].kernels) == 1


def test_a_split_operand_is_read_not_materialised():
    """Split-K's chunks only re-index x and w: the partial products read them in place."""
    graph = workloads.get("matmul").graph
    split = next(c for c in cleave.search(graph, top_k=4, progress=False).candidates if c.derivation == ["split-k"])
    plans = cleave.schedule(split, {"s": 4096, "k": 4096, "n": 4096}, split={"s_k": 2}, top_k=1)
    assert [computed_kernels(p) for p in plans] == [2]  # the partial products, their combine
    (partials,) = plans[0].intermediates
    assert partials.dtype == "f32"  # a partial over the chunk axis keeps f32


def test_materialised_plan_matches_the_fp64_interpreter_at_odd_sizes():
    """Partitioned at a wide binding, run at a small odd one (all axes dynamic)."""
    (plan,) = cleave.schedule(NORM_MM, {"s": 2048, "k": 4096, "n": 14336}, dynamic={"s", "k", "n"}, top_k=1)
    assert len(plan.kernels) == 2
    for seed, env in enumerate(({"s": 37, "k": 45, "n": 70}, {"s": 1, "k": 130, "n": 19})):
        run_and_check(NORM_MM, plan, env, seed=seed)


def test_intermediates_reuse_one_kept_workspace_per_stream(monkeypatch):
    """The second call's intermediates land where the first call's were (no allocation
    on the hot path), results stay fresh and exact; another thread gets its own; a
    workspace over the cap is allocated per call."""
    import threading

    import torch

    from cleave.runtime import launch as L

    (plan,) = cleave.schedule(NORM_MM, {"s": 2048, "k": 4096, "n": 14336}, dynamic={"s", "k", "n"}, top_k=1)
    env = {"s": 37, "k": 45, "n": 70}
    inputs = workloads.get("rmsnorm_matmul").inputs(env, seed=3)
    want = workloads.get("rmsnorm_matmul").reference(*inputs.values())
    L._WORKSPACES.clear()
    first = L.launch(plan, inputs)[0]
    (kept,) = L._WORKSPACES.values()
    second = L.launch(plan, inputs)[0]
    assert list(L._WORKSPACES.values()) == [kept] and first.data_ptr() != second.data_ptr()
    for got in (first, second):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    other = threading.Thread(target=L.launch, args=(plan, inputs))
    other.start()
    other.join()
    assert len(L._WORKSPACES) == 2
    monkeypatch.setattr(L, "WORKSPACE_KEPT_BYTES", 0)
    L._WORKSPACES.clear()
    L.launch(plan, inputs)
    assert not L._WORKSPACES
