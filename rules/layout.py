"""Layout: the axis bookkeeping of splits cancels."""
from .dsl import parse_rules

RULES = parse_rules("""
family layout

rule unsqueeze-squeeze: unsqueeze(squeeze(x, a), a) => x
  why: squeeze removes the extent-1 axis a-1 that unsqueeze puts back
  rewrites: unsqueeze(squeeze(x, -1), -1) with x[m, 1, n]
  keeps: unsqueeze(squeeze(x, -1), -2) with x[m, 1, n]

rule squeeze-unsqueeze: squeeze(unsqueeze(x, a), a) => x
  why: unsqueeze inserts an extent-1 axis left of a that squeeze removes
  rewrites: squeeze(unsqueeze(x, -1), -1) with x[m, n]
  keeps: squeeze(unsqueeze(x, -2), -1) with x[1, n]
""", source=__file__)
