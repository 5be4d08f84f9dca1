"""Options the cost model costs the same rank the longer loop step first
(scheduler/api.py, `_loop_step`): a GEMM's K step changes neither its bytes nor its MMA
work in the model, and on the H200 Qwen3's down projection (K = 25600) took 10-23%
less time in 64-wide steps than in the 32-wide ones its tie had put first."""
import math

from cleave.ir import parse_graph
from cleave.scheduler import schedule
from kernel_check import recorded_kernel_options

# Qwen3-32B's down projection at 2048 tokens, bf16
DOWN = parse_graph('''graph down_projection {
  %0 = input(name="h", shape=[s,25600], dtype=bf16) : bf16[s,25600]
  %1 = input(name="w", shape=[25600,5120], dtype=bf16) : bf16[25600,5120]
  %2 = matmul(%0, %1) : bf16[s,5120]
  return out=%2
}''')


def test_equal_costs_rank_the_longer_k_step_first(monkeypatch):
    found = recorded_kernel_options(monkeypatch)
    schedule(DOWN, {"s": 2048}, top_k=4)
    (ranked,) = found
    tilings = [f[3][1] for f in ranked]
    steps = [math.prod(t.block[x] for x, role in t.role.items() if role == "loop") for t in tilings]
    ties = [(steps[i], steps[i + 1]) for i in range(len(ranked) - 1) if ranked[i][0] == ranked[i + 1][0]]
    assert ties, "no two options tie here: the test no longer exercises the tie-break"
    assert all(a >= b for a, b in ties), ties
    assert steps[0] >= 64, steps[:4]
