"""Rule soundness: shapes proven in z3 for every binding, the algebra proven in z3
(sympy where z3 is unsure) on small concrete bindings, and a randomized numeric gate
(fp64 with IEEE special values in the data, then f32).
The only package that imports z3; it loads on first use, so that building the CLI
parser (cleave.verify.cli) stays cheap.
"""
from __future__ import annotations

__all__ = ["UnprovenRule", "UnprovenRuleWarning", "UnsoundRule", "Verdict", "check_rule", "check_rules", "require_sound",
           "sound_rules", "with_proven_files"]


def __getattr__(name):
    if name in ("check_rule", "check_rules", "require_sound", "sound_rules", "with_proven_files"):
        from . import check

        return getattr(check, name)
    if name in ("UnprovenRule", "UnprovenRuleWarning", "UnsoundRule", "Verdict"):
        from . import verdict

        return getattr(verdict, name)
    raise AttributeError(f"module 'cleave.verify' has no attribute {name!r}")
