"""The rule library (installed as cleave.rules): one module per family, each
rule written once in the DSL of `dsl.py`.

    all_rules()      every rule of the library
    load_file(path)  the rules of a researcher's own rule file (same DSL)
    phases_of(rule)  the saturation phases a rule runs in (FAMILY_PHASES)
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from .dsl import Example, Rule, RuleError, parse_rules

# Saturation runs the phases in this order. Algebraic rewrites come first; the splits
# then look up the terms they made (the division moved after the MatMul); the
# cleanups last cancel a split's axis bookkeeping.
PHASES = ("rewrite", "split", "cleanup")

# The schedule: the phases each family's rules run in. A family not listed here
# (a researcher's new one) declares its phases in its rule file:
# `family contraction phase rewrite`.
FAMILY_PHASES = {
    "algebra": ("rewrite", "cleanup"),
    "reduction": ("rewrite", "cleanup"),
    "normalization": ("rewrite",),
    "softmax": ("rewrite",),
    "base2": ("rewrite",),
    "rope": ("rewrite",),
    "rescale": ("split",),
    "split": ("split",),
    "layout": ("cleanup",),
}


def phases_of(rule: Rule) -> tuple[str, ...]:
    """The phases `rule` runs in: its family's row of FAMILY_PHASES, or the phases its
    file declared for a new family. An unknown family without them is an error."""
    known = FAMILY_PHASES.get(rule.family)
    where = f"{rule.source}: rule {rule.name}"
    if not rule.phases:
        if known is None:
            raise RuleError(f"{where}: unknown family {rule.family!r}; known families: {', '.join(FAMILY_PHASES)}. "
                            f"A new family names its phase: 'family {rule.family} phase rewrite' "
                            f"(phases, in order: {', '.join(PHASES)})")
        return known
    unknown = [p for p in rule.phases if p not in PHASES]
    if unknown:
        raise RuleError(f"{where}: unknown phase {unknown[0]!r}; phases, in order: {', '.join(PHASES)}")
    if known is not None and set(rule.phases) != set(known):
        raise RuleError(f"{where}: family {rule.family} runs in phase {', '.join(known)} "
                        f"(cleave.rules.FAMILY_PHASES); a file declares phases only for a new family")
    return rule.phases


def _checked(rules: list[Rule]) -> list[Rule]:
    """Names unique, every family scheduled: errors name the file and line."""
    seen: dict[str, Rule] = {}
    for r in rules:
        if r.name in seen:
            raise RuleError(f"rule {r.name} is defined twice ({seen[r.name].source}, {r.source})")
        seen[r.name] = r
        phases_of(r)
    return rules


def all_rules() -> list[Rule]:
    from . import algebra, base2, layout, normalization, reduction, rope, softmax, split

    return _checked([r for m in (algebra, reduction, normalization, softmax, base2, layout, rope, split)
                     for r in m.RULES])


def load_file(path) -> list[Rule]:
    """Rules from a text file of `family`/`rule` blocks (see dsl.py)."""
    if not str(path).strip():  # Path("") is ".", read as a directory
        raise RuleError("a rule file path is empty")
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark some editors write is no text
    except UnicodeDecodeError as err:
        raise RuleError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except IsADirectoryError:
        raise RuleError(f"{path}: a directory, not a rule file") from None
    except FileNotFoundError:
        raise RuleError(f"{path}: no such rule file") from None
    return _checked(parse_rules(text, source=str(path)))


def with_files(paths) -> tuple[list[Rule], list[Rule]]:
    """(the library plus the rules of `paths`, those files' rules): names unique across all."""
    extra = []
    for path in paths:
        found = load_file(path)
        if not found:
            raise RuleError(f"no rules in {path}")
        extra += found
    return _checked(all_rules() + extra), extra


def digest(rules: list[Rule]) -> str:
    """A hash of rule definitions (text, family, phases): part of a compiled operator's
    cache key when it was searched with rules beyond the library."""
    h = hashlib.sha256()
    for r in rules:
        h.update(f"{r.family}\0{','.join(phases_of(r))}\0{r.text()}\0".encode())
    return h.hexdigest()[:16]


__all__ = ["FAMILY_PHASES", "PHASES", "Example", "Rule", "RuleError", "all_rules", "digest", "load_file",
           "parse_rules", "phases_of", "with_files"]
