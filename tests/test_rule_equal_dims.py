"""The verifier's small instances make dims equal where a rule builds only so: a rule
false only for a square MatMul operand was proven, and a sound one that needs a
square operand was refused ("no small instance builds")."""
from __future__ import annotations

import re

from cleave.rules.dsl import parse_rules
from cleave.verify import check_rule

RULES = {r.name: r for r in parse_rules("""
family probe phase rewrite

rule matmul-assoc-scale: matmul(x, mul(y, c)) => mul(matmul(x, y), c)
  if flat(c, -1)
  why: wrong: c scales the rows of y, which the MatMul contracts (colscale-after-matmul needs flat(c, -2))

rule matmul-power-assoc: matmul(matmul(x, x), x) => matmul(x, matmul(x, x))
  if finite(x)
  why: products associate; x is square
""", source="equal_dims.rules")}


def test_rule_false_only_for_a_square_operand_is_refused():
    v = check_rule(RULES["matmul-assoc-scale"], use_cache=False)
    assert v.verdict == "unsound", v.explain()
    assert re.search(r"x\[(\d+), \1\]", v.counterexample), v.counterexample  # at a square x


def test_sound_rule_that_needs_a_square_operand_is_proven():
    v = check_rule(RULES["matmul-power-assoc"], use_cache=False)
    assert v.verdict == "proven", v.explain()

