"""Normalization: row scales move after MatMuls; variance in one pass."""
from .dsl import parse_rules

RULES = parse_rules("""
family normalization

rule rowscale-after-matmul: matmul(mul(x, c), y) => mul(matmul(x, y), c)
  if flat(c, -1)
  why: a per-row scale constant along the contracted axis commutes with the MatMul (RMSNorm's scale after X@W)
  rewrites: matmul(mul(x, c), w) with x[m, k], c[m, 1], w[k, n]
  keeps: matmul(mul(x, c), w) with x[m, k], c[1, k], w[k, n]

rule variance-one-pass: rsum(square(sub(x, div(rsum(x, a), n))), a) => sub(rsum(square(x), a), div(square(rsum(x, a)), n))
  if extent(n, x, a)
  why: sum (x - mean)^2 = sum x^2 - (sum x)^2 / n, so the sum and the sum of squares share one pass
  rewrites: rsum(square(sub(x, div(rsum(x, -1), n))), -1) with x[m, k], n = k
  keeps: rsum(square(sub(x, div(rsum(x, -1), n))), -1) with x[m, k], n = m
""", source=__file__)
