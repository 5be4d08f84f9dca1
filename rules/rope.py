"""RoPE: position rotations stay elementwise prologues of the QK MatMul, so
attention with RoPE remains one fusable graph."""
from .dsl import parse_rules

RULES = parse_rules("""
family rope

rule scale-into-prologue: mul(matmul(x, y), c) => matmul(mul(x, c), y)
  if flat(c, -1) and wide_operands()
  why: a per-row score scale folds into the elementwise prologue of the q tile, beside the rotation
  rewrites: mul(matmul(q, k), c) with q[s, d], k[d, t], c[s, 1]
  keeps: mul(matmul(q, k), c) with q[s, d], k[d, t], c[1, t]
""", source=__file__)
