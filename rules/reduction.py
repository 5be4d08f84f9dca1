"""Reductions: factors constant along the reduced axis leave the reduction."""
from .dsl import parse_rules

RULES = parse_rules("""
family reduction

rule sum-pull-factor: rsum(mul(x, c), a) => mul(rsum(x, a), c)
  if flat(c, a)
  why: sum_a x*c = c * sum_a x when c does not vary along a

rule sum-pull-div: rsum(div(x, c), a) => div(rsum(x, a), c)
  if flat(c, a)
  why: sum_a x/c = (sum_a x)/c when c does not vary along a

rule max-pull-shift: rmax(sub(x, c), a) => sub(rmax(x, a), c)
  if flat(c, a)
  why: max_a (x - c) = (max_a x) - c when c does not vary along a
""", source=__file__)
