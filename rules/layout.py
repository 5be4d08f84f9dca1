"""Layout: the axis bookkeeping of splits cancels."""
from .dsl import parse_rules

RULES = parse_rules("""
family layout

rule unsqueeze-squeeze: unsqueeze(squeeze(x, a), a) => x
  why: squeeze removes the extent-1 axis a-1 that unsqueeze puts back

rule squeeze-unsqueeze: squeeze(unsqueeze(x, a), a) => x
  why: unsqueeze inserts an extent-1 axis left of a that squeeze removes
""", source=__file__)
