"""Normalization: row scales move after MatMuls.

The one-pass variance, sum x^2 - (sum x)^2 / n, is exact in the reals but not a rule
here: in f32 it cancels where a row's mean is large against its spread (LayerNorm of
rows around 1000 came out 11% off, around 10^4 NaN), where the two passes are exact
to f32's rounding."""
from .dsl import parse_rules

RULES = parse_rules("""
family normalization

rule rowscale-after-matmul: matmul(mul(x, c), y) => mul(matmul(x, y), c)
  if flat(c, -1) and finite(c) and unshifted_operands()
  why: a per-row scale constant along the contracted axis commutes with the MatMul (RMSNorm's scale after X@W; c finite: an infinite scale makes eager's products of -inf and inf NaN, and the moved scale an infinity; unshifted operands: a half MatMul would round a LayerNorm's x - mean instead of (x - mean) / sigma, correlated errors)
  rewrites: matmul(mul(x, c), w) with x[m, k], c[m, 1], w[k, n]
  keeps: matmul(mul(x, c), w) with x[m, k], c[1, k], w[k, n]
""", source=__file__)
