"""Rule soundness: shapes proven in z3 for every binding, the algebra proven in z3
(sympy where z3 is unsure) on small concrete bindings, and a randomized fp64 gate.
The only package that imports z3.
"""
from .check import check_rule, check_rules, require_sound
from .verdict import UnsoundRule, Verdict

__all__ = ["UnsoundRule", "Verdict", "check_rule", "check_rules", "require_sound"]
