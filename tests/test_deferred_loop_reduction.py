"""A sum, max or min over a looped axis that nothing in the loop reads is kept as a
tile-shaped accumulator, added to lane by lane, and reduced once after the loop.
Reduced every step, each load fed shuffles across lanes before the next load was
issued: ptxas kept one load in flight a thread, and a row sum of W ran 3x slower on the
H200 than the same loop with its loads batched (RESULTS.md, session 31)."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import pytest
import torch

from cleave import parse_graph
from cleave.interpreter import interpret
from cleave.runtime.launch import launch
from cleave.scheduler import schedule
from kernel_check import LOOPS, run_and_check

ROW_STATS = '''graph row_stats {
  %0 = input(name="x", shape=[r,n], dtype=f32) : f32[r,n]
  %1 = reduce(%0, op="sum", axis=1, keepdim=0) : f32[r]
  %2 = reduce(%0, op="max", axis=1, keepdim=0) : f32[r]
  %3 = reduce(%0, op="min", axis=1, keepdim=0) : f32[r]
  return total=%1, top=%2, bottom=%3
}'''


def _loop_lines(source: str) -> tuple[list[str], list[str]]:
    """The lines of the kernel's first `for` loop, and those after it."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("for "))
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent), len(lines))
    return lines[start + 1:end], lines[end:]


@pytest.mark.parametrize("env", [{"r": 5, "n": 203}, {"r": 3, "n": 64}, {"r": 1, "n": 1}])
def test_row_statistics_reduce_once_after_their_loop(env):
    graph = parse_graph(ROW_STATS)
    plans = schedule(graph, env, target=LOOPS, top_k=4)
    for plan in plans:
        for seed in (0, 1):
            run_and_check(graph, plan, env, seed)
    looped = [k for p in plans for k in p.kernels if "for " in k.source]
    assert looped or env["n"] == 1
    for kernel in looped:
        inside, after = _loop_lines(kernel.source)
        reductions = ("tl.sum(", "reduce_max(", "reduce_min(")
        assert not any(r in line for line in inside for r in reductions), kernel.source
        assert sum(r in line for line in after for r in reductions) >= 3, kernel.source


def test_specials_keep_their_meaning_in_the_lane_by_lane_accumulators():
    """NaN in a row makes its max and min NaN; a row of -inf keeps max -inf; a masked
    tail lane (n odd) adds nothing and never wins a max or min."""
    graph = parse_graph(ROW_STATS)
    env = {"r": 4, "n": 203}
    x = torch.randn(4, 203) - 100.0
    x[1, 150] = float("nan")
    x[2] = float("-inf")
    x[3] = 5.0
    want = interpret(graph, {"x": x}, compute_dtype=torch.float64)
    for plan in schedule(graph, env, target=LOOPS, top_k=4):
        outs = [torch.full((4,), float("nan")) for _ in range(3)]
        got = launch(plan, {"x": x}, out=outs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g.double(), w, rtol=1e-6, atol=1e-6, equal_nan=True)
        assert math.isnan(got[1][1]) and math.isnan(got[2][1]) and got[1][2] == float("-inf")
        assert got[0][3] == 5.0 * 203 and got[1][3] == 5.0 and got[2][3] == 5.0


SPLIT_ROWS = '''graph split_rows {{
  %0 = input(name="x", shape=[s,k], dtype={dtype}) : {dtype}[s,k]
  %1 = split(%0, axis={axis}, count=c, pad=0.0) : {shape}
  %2 = reduce(%1, op="sum", axis=2, keepdim=0) : {dtype}[{kept}]
  return y=%2
}}'''


@pytest.mark.parametrize("dtype, lanes", [("bf16", 8), ("f32", 4)])
def test_split_counts_over_a_contiguous_axis_keep_chunks_16_byte_aligned(dtype, lanes):
    """Chunks of 125 bf16 (K = 4096 in 33) start 250 bytes apart: every load narrows to
    2 bytes. The counts offered there are moved up (to at most twice) to aligned ones."""
    from cleave.scheduler.api import _split_candidates
    from cleave.scheduler.target import H200

    graph = parse_graph(SPLIT_ROWS.format(dtype=dtype, axis=1, shape=f"{dtype}[s,c,ceiling(k/c)]", kept="s,c"))
    env = {"s": 64, "k": 4096}
    counts = _split_candidates(graph, env, "c", 64, H200)
    assert len(counts) > 3
    assert all(-(-4096 // c) % lanes == 0 for c in counts if c > 1), counts


def test_split_counts_over_a_strided_axis_are_left_as_they_are():
    from cleave.scheduler.api import _split_candidates
    from cleave.scheduler.target import H200

    graph = parse_graph(SPLIT_ROWS.format(dtype="bf16", axis=0, shape="bf16[c,ceiling(s/c),k]", kept="c,ceiling(s/c)"))
    counts = _split_candidates(graph, {"s": 4096, "k": 64}, "c", 64, H200)
    assert 33 in counts, counts  # 16 programs an SM (132 of them): chunks of 125 rows, each row aligned


GEMV = '''graph gemv {
  %0 = input(name="x", shape=[s,k], dtype=bf16) : bf16[s,k]
  %1 = input(name="v", shape=[k,1], dtype=f32) : f32[k,1]
  %2 = matmul(%0, %1) : f32[s,1]
  return y=%2
}'''


@pytest.mark.parametrize("env", [{"s": 7, "k": 203}, {"s": 70, "k": 96}])
def test_a_contraction_off_the_tensor_cores_sums_once_after_its_loop(env):
    """x·v (one column: no tensor-core tile) over a looped K: its products are added
    lane by lane and summed once."""
    graph = parse_graph(GEMV)
    plans = schedule(graph, env, target=LOOPS, top_k=4)
    for plan in plans:
        run_and_check(graph, plan, env, seed=3)
    looped = [k for p in plans for k in p.kernels if "for " in k.source]
    assert looped
    for kernel in looped:
        inside, after = _loop_lines(kernel.source)
        assert not any("tl.sum(" in line for line in inside), kernel.source
        assert any("tl.sum(" in line for line in after), kernel.source


def test_split_counts_over_a_views_last_axis_are_left_as_they_are():
    """Split-KV cuts Kᵀ's last axis: its keys lie a row apart in memory, so the chunk
    alignment means nothing to the loads, and the decode's counts stay."""
    from cleave.scheduler.api import _split_candidates
    from cleave.scheduler.target import H200

    graph = parse_graph('''graph split_keys {
  %0 = input(name="k", shape=[s,d], dtype=bf16) : bf16[s,d]
  %1 = permute(%0, perm=[1,0]) : bf16[d,s]
  %2 = split(%1, axis=1, count=c, pad=0.0) : bf16[d,c,ceiling(s/c)]
  %3 = reduce(%2, op="sum", axis=2, keepdim=0) : bf16[d,c]
  return y=%3
}''')
    counts = _split_candidates(graph, {"s": 4096, "d": 64}, "c", 64, H200)
    assert 33 in counts, counts
