"""Algebra: field laws the other families lean on."""
from .dsl import parse_rules

RULES = parse_rules("""
family algebra

rule div-div-cancel: div(div(x, c), div(y, c)) => div(x, y)
  if within(c, x) and nonzero(c)
  why: a common divisor cancels: (x/c) / (y/c) = x/y (c within x: dropping it keeps the shape; c non-zero: eager's 0/0 is NaN where x/y is not)
  rewrites: div(div(x, rsum(exp(sub(s, rmax(s, -1))), -1)), div(y, rsum(exp(sub(s, rmax(s, -1))), -1))) with x[m, n], y[m, n], s[m, n]
  keeps: div(div(x, c), div(y, d)) with x[m, n], y[m, n], c[m, 1], d[m, 1]
  keeps: div(div(x, c), div(y, c)) with x[m, n], y[m, n], c[m, 1]

rule div-mul-assoc: div(mul(x, y), c) => mul(x, div(y, c))
  why: multiplication and division associate: (x*y)/c = x*(y/c)
  rewrites: div(mul(x, y), c) with x[m, n], y[m, n], c[m, 1]
  keeps: div(add(x, y), c) with x[m, n], y[m, n], c[m, 1]
""", source=__file__)
