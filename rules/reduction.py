"""Reductions: factors constant along the reduced axis leave the reduction; a row sum
of a MatMul moves onto its right operand."""
from .dsl import parse_rules

RULES = parse_rules("""
family reduction

rule sum-pull-factor: rsum(mul(x, c), a) => mul(rsum(x, a), c)
  if flat(c, a) and finite(c)
  why: sum_a x*c = c * sum_a x when c does not vary along a (c finite: a factor of log 0 makes eager's sum of -inf and inf NaN, and the pulled product -inf)
  rewrites: rsum(mul(x, c), -1) with x[m, n], c[m, 1]
  keeps: rsum(mul(x, c), -1) with x[m, n], c[1, n]

rule sum-pull-div: rsum(div(x, c), a) => div(rsum(x, a), c)
  if flat(c, a) and nonzero(c)
  why: sum_a x/c = (sum_a x)/c when c does not vary along a and is not 0 (eager's sum of [0/0, 1/0] is NaN, 1/0 is inf)
  rewrites: rsum(div(x, rsum(exp(sub(s, rmax(s, -2))), -2)), -2) with x[m, n], s[m, n]
  keeps: rsum(div(x, c), -2) with x[m, n], c[m, 1]
  keeps: rsum(div(x, c), -2) with x[m, n], c[1, n]

rule sum-of-matmul: rsum(matmul(x, w), -1) => matmul(x, rsum(w, -1))
  if finite(x) and finite(w) and unrounded(w)
  why: sum_n (X W)[s, n] = X (W 1): row-sum W once (k values), then one matrix-vector product; needs finite operands, as -inf in X makes the left inf - inf = NaN where the right is inf, and a W the MatMul rounds (f32 cast to its f16) would be summed unrounded
  rewrites: rsum(matmul(x, w), -1) with x[s, k], w[k, n]
  keeps: rsum(matmul(x, log(w)), -1) with x[s, k], w[k, n]

rule max-pull-shift: rmax(sub(x, c), a) => sub(rmax(x, a), c)
  if flat(c, a) and finite(c)
  why: max_a (x - c) = (max_a x) - c when c does not vary along a (c finite: a shift of -inf, log 0, makes eager's -inf - -inf at a masked x NaN, and max_a x - c +inf)
  rewrites: rmax(sub(x, c), -1) with x[m, n], c[]
  keeps: rmax(sub(x, c), -1) with x[m, n], c[m, n]
""", source=__file__)
