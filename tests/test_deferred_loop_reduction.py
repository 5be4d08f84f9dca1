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
