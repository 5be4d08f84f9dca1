"""Base 2: exp(x - c) = 2^(x·log2e - c·log2e), and log2(e) moves into the factors that
already scale x (a softmax's score scale), so that a kernel computes exp2(x' - m')
with no multiply per element (FlashAttention's qk_scale = sm_scale · log2e)."""
from .dsl import parse_rules

RULES = parse_rules("""
family base2

rule exp-base2: exp(sub(x, c)) => exp2(sub(mul(x, const(log2e)), mul(c, const(log2e))))
  if moderate_values()
  why: e^(x - c) = 2^(x log2e - c log2e); the products then fold into constants and maxima
  f32: x log2e and c log2e are rounded at the magnitude of x and c, not of x - c (off by ulps of |x| log2e where x - c is small): the trade FlashAttention makes, under moderate_values()
  rewrites: exp(sub(x, c)) with x[m, n], c[m, 1]
  keeps: exp(add(x, c)) with x[m, n], c[m, 1]

rule max-scale: mul(rmax(x, a), const(log2e)) => rmax(mul(x, const(log2e)), a)
  why: a positive factor commutes with max: the max of the base-2 values is the base-2 max
  rewrites: mul(rmax(x, -1), const(log2e)) with x[m, n]
  keeps: mul(rmax(x, -1), const(-1)) with x[m, n]

rule mask-scale: mul(where(p, x, const(-inf)), const(log2e)) => where(p, mul(x, const(log2e)), const(-inf))
  why: a positive factor keeps a mask's -inf fill and scales the kept values
  rewrites: mul(where(p, x, const(-inf)), const(log2e)) with p[m, n], x[m, n]
  keeps: mul(where(p, x, const(0)), const(log2e)) with p[m, n], x[m, n]

rule scale-fold: mul(mul(x, c), const(log2e)) => mul(x, mul(c, const(log2e)))
  if moderate_values()
  why: log2e joins the factor that already scales x (a score scale): one product per element, not two
  rewrites: mul(mul(x, c), const(log2e)) with x[m, n], c[]
  keeps: mul(add(x, c), const(log2e)) with x[m, n], c[]

rule scale-fold-left: mul(mul(c, x), const(log2e)) => mul(mul(c, const(log2e)), x)
  if moderate_values()
  why: as scale-fold, with the factor on the left (ALiBi's slope_h * distance): log2e joins the slope, not each distance
  rewrites: mul(mul(c, x), const(log2e)) with c[h, 1, 1], x[m, n]
  keeps: mul(add(c, x), const(log2e)) with c[h, 1, 1], x[m, n]

rule scale-add: mul(add(x, y), const(log2e)) => add(mul(x, const(log2e)), mul(y, const(log2e)))
  why: log2e distributes over a sum of score terms (scaled scores plus a bias), so that each term folds it into its own factor
  rewrites: mul(add(x, y), const(log2e)) with x[m, n], y[m, n]
  keeps: mul(sub(x, y), const(log2e)) with x[m, n], y[m, n]
""", source=__file__)
