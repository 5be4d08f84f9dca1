"""A GEMM's epilogue operands (a residual tile, a bias) are loaded after its K loop, not
before it (scheduler/codegen.py, `runs_loop`): loaded first, a 64 x 256 residual tile in
f32 stayed in registers through the loop beside the accumulator. On the H200, emitting it
after the loop took GPT-2's down projection with bias and residual from 0.094-0.099 to
0.079-0.082 ms, and Llama-3-8B's and Qwen3-32B's by 4-6% (benchmarks/RESULTS.md, session 19)."""
import re

import pytest

from cleave.ir import parse_graph
from cleave.scheduler import schedule

# the residual is the add's first operand: emitted in operand order it came first
RESIDUAL = parse_graph('''graph residual_projection {
  %0 = input(name="r", shape=[s,768], dtype=bf16) : bf16[s,768]
  %1 = input(name="x", shape=[s,3072], dtype=bf16) : bf16[s,3072]
  %2 = input(name="w", shape=[3072,768], dtype=bf16) : bf16[3072,768]
  %3 = input(name="b", shape=[768], dtype=bf16) : bf16[768]
  %4 = matmul(%1, %2) : bf16[s,768]
  %5 = cast(%0, dtype=f32) : f32[s,768]
  %6 = cast(%3, dtype=f32) : f32[768]
  %7 = cast(%4, dtype=f32) : f32[s,768]
  %8 = add(%6, %7) : f32[s,768]
  %9 = add(%5, %8) : f32[s,768]
  %10 = cast(%9, dtype=bf16) : bf16[s,768]
  return out=%10
}''')


def _first_line(lines, pattern):
    return min(i for i, ln in enumerate(lines) if re.search(pattern, ln))


@pytest.mark.parametrize("rows", [8192, 61])
def test_residual_and_bias_load_after_the_k_loop(rows):
    plans = schedule(RESIDUAL, {"s": rows}, top_k=3)
    assert plans
    for plan in plans:
        (kernel,) = plan.kernels
        lines = kernel.source.splitlines()
        loop = _first_line(lines, r"^\s*for start")
        for buf in ("r", "b"):
            assert _first_line(lines, rf"\b{buf}_(ptr \+|desc\d+\.load)") > loop, (buf, kernel.source)



def _scaled(side: str):
    """(x @ w) * v in f32, v a vector along the product's rows or its columns."""
    dim, shape = ("s", "[s,1]") if side == "rows" else ("n", "[1,n]")
    return parse_graph(f'''graph scaled_{side} {{
  %0 = input(name="x", shape=[s,k], dtype=bf16) : bf16[s,k]
  %1 = input(name="w", shape=[k,n], dtype=bf16) : bf16[k,n]
  %2 = input(name="v", shape=[{dim}], dtype=f32) : f32[{dim}]
  %3 = matmul(%0, %1) : bf16[s,n]
  %4 = cast(%3, dtype=f32) : f32[s,n]
  %5 = reshape(%2, shape={shape}) : f32{shape}
  %6 = mul(%4, %5) : f32[s,n]
  %7 = cast(%6, dtype=bf16) : bf16[s,n]
  return y=%7
}}''')


def test_a_row_vector_beside_the_accumulator_keeps_the_gemm_persistent():
    """A row scale (RMSNorm's, moved past the MatMul) costs a thread of the wgmma layout a
    few registers: the GEMM stays persistent, and is exact over several tiles a program
    at odd sizes. A column vector (a bias) costs it dozens: that GEMM is not persistent."""
    import os

    import torch

    from cleave.interpreter import interpret
    from cleave.runtime.launch import launch
    from kernel_check import check_outputs

    big = {"s": 4096, "k": 4096, "n": 6144}
    rows = schedule(_scaled("rows"), big, dynamic={"s", "k", "n"}, top_k=3)
    assert rows and all(k.programs_per_sm > 0 for p in rows for k in p.kernels)
    columns = schedule(_scaled("columns"), big, dynamic={"s", "k", "n"}, top_k=3)
    assert columns and all(k.programs_per_sm == 0 for p in columns for k in p.kernels)
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    gen = torch.Generator().manual_seed(7)
    for s, k, n in ((37, 70, 45), (130, 33, 300)):  # more tiles than the interpreter's 4 SMs run at once
        inputs = {"x": torch.randn(s, k, generator=gen).bfloat16(), "w": torch.randn(k, n, generator=gen).bfloat16(),
                  "v": torch.rand(s, generator=gen) + 0.5}
        ref = interpret(_scaled("rows"), inputs, compute_dtype=torch.float64)
        out = [torch.full((s, n), float("nan"), dtype=torch.bfloat16)]
        check_outputs(launch(rows[0], inputs, out=out), ref, f"s={s} k={k} n={n}")


def test_a_loop_reducing_to_a_scalar_is_no_gemm():
    """The persistence check reads a GEMM accumulator's columns: a kernel whose one
    accumulator sums into a scalar (`(x > 0).sum()`, dynamic) has none, and schedules."""
    graph = parse_graph('''graph count {
  %0 = input(name="x", shape=[s,n], dtype=f32) : f32[s,n]
  %1 = reshape(%0, shape=[n*s]) : f32[n*s]
  %2 = reduce(%1, op="sum", axis=0, keepdim=0) : f32[]
  return y=%2
}''')
    plans = schedule(graph, {"s": 4, "n": 6}, dynamic={"s", "n"}, top_k=1)
    assert plans and all(k.programs_per_sm == 0 for k in plans[0].kernels)
