"""The rule library (installed as cleave.rules): one module per family, each
rule written once in the DSL of `dsl.py`.

    all_rules()      every rule of the library
    load_file(path)  the rules of a researcher's own rule file (same DSL)
"""
from __future__ import annotations

from pathlib import Path

from .dsl import Rule, RuleError, parse_rules

FAMILIES = ("algebra", "reduction", "normalization", "rescale", "softmax", "layout", "rope", "split")


def all_rules() -> list[Rule]:
    from . import algebra, layout, normalization, reduction, rope, softmax, split

    rules = [r for m in (algebra, reduction, normalization, softmax, layout, rope, split) for r in m.RULES]
    seen: dict[str, Rule] = {}
    for r in rules:
        if r.name in seen:
            raise RuleError(f"rule {r.name} is defined twice ({seen[r.name].source}, {r.source})")
        seen[r.name] = r
    return rules


def load_file(path) -> list[Rule]:
    """Rules from a text file of `family`/`rule` blocks (see dsl.py)."""
    path = Path(path)
    return parse_rules(path.read_text(), source=str(path))


__all__ = ["FAMILIES", "Rule", "RuleError", "all_rules", "load_file", "parse_rules"]
