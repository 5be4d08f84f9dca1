"""A rule whose right side divides by a value its left side never divides by is refused,
and so is one that drops a divisor of its left side without declaring it non-zero.

The provers hold where divisors are non-zero and log arguments positive, and the
numeric gate draws no zeros: a rule that only moves a division is sound there (the
README's "divisors are non-zero"). A new divisor, as in `add(x, y) =>
mul(add(div(x, y), const(1)), y)`, turns a finite result into NaN wherever the data
holds a 0 there (a ReLU output, a mask), and neither would notice. So each value the
right side divides by (or takes the log, recip, rsqrt of, or fmod by) must be one the
left side does, a factor of one (the left side of div-div-cancel divides by y/c, so y
is non-zero too), or non-zero by construction: a non-zero constant, or a positive
value such as an exp, a count, or a sum of exps (every axis the verifier binds is
non-empty). The converse, `div(mul(x, y), y) => x`, turns the NaN eager computes where
y is 0 into x: a left side's divisor must be one the right side also divides by (or a
factor of one), non-zero by construction, or declared `nonzero(y)` (the search then
fires the rule only where it knows y is).
"""
from __future__ import annotations

from cleave.rules.dsl import Rule, Term, Var

# op -> the argument at which 0 makes it inf or NaN (the provers assume it is not 0)
SINGULAR = {"div": 1, "fmod": 1, "recip": 0, "rsqrt": 0, "log": 0}
# op -> the arguments that are all non-zero exactly when it is (finite values)
FACTORS = {"mul": (0, 1), "div": (0,), "neg": (0,), "abs": (0,), "square": (0,), "sqrt": (0,)}
POSITIVE = {"exp", "exp2", "sigmoid"}  # at every finite argument
# positive where all their tensor arguments are (a reduction's axis is non-empty)
KEEPS_POSITIVE = {"add", "mul", "div", "max", "min", "rsum", "rmax", "rmin"}


def new_divisor(rule: Rule) -> str | None:
    """Why `rule` is refused (its right side divides by a value that may be 0 where
    its left side does not divide by it), or None; None for a RuleInstance (graphs)."""
    if not isinstance(getattr(rule, "lhs", None), Term):
        return None
    known = _left_divisors(rule.lhs)
    counts = {c.args[0].name for c in rule.conditions if c.kind == "extent"}
    for op, d in _singular(rule.rhs):
        if not _nonzero(d, known, counts):
            what, d = _singular_use(op, d), _show(d)
            return (f"divisors: its right side {what}, which its left side does not: where {d} is 0 in the data "
                    f"the right side is inf or NaN and the left side need not be (a new divisor must be a factor "
                    f"of one the left side has, a non-zero constant, or positive: an exp, a count, a sum of exps)")
    return None


def cancelled_divisor(rule: Rule) -> str | None:
    """Why `rule` is refused (its left side divides by a value that may be 0 where its
    right side does not divide by it: `div(mul(x, y), y) => x` turns eager's NaN at
    y = 0 into x), or None; None for a RuleInstance (graphs). The provers assume the
    left side's divisors non-zero, so such a rule proves: it needs `nonzero(y)`, which
    lets it fire only where the search knows y is."""
    if not isinstance(getattr(rule, "lhs", None), Term):
        return None
    declared = {a for c in rule.conditions if c.kind == "nonzero" for a in c.args}
    counts = {c.args[0].name for c in rule.conditions if c.kind == "extent"}
    kept = _left_divisors(rule.rhs)

    def covered(d) -> bool:
        # d is 0 exactly where one of its factors is: each must leave the right side
        # singular too, or be non-zero
        return (d in kept or _nonzero(d, declared, counts)
                or isinstance(d, Term) and d.op in FACTORS and all(covered(d.args[i]) for i in FACTORS[d.op]))

    for op, d in _singular(rule.lhs):
        if not covered(d):
            what, d = _singular_use(op, d), _show(d)
            return (f"divisors: its left side {what}, which its right side does not: where {d} is 0 in the data "
                    f"the left side is inf or NaN and the right side need not be (declare `nonzero(...)` of it "
                    f"if the rule is meant only where it cannot be 0)")
    return None


def _singular_use(op: str, d) -> str:
    """What a side does with d that 0 makes inf or NaN, as the refusal says it."""
    d = _show(d)
    return {"div": f"divides by {d}", "fmod": f"takes fmod by {d}",
            "pow": f"raises {d} to a power that may be negative"}.get(op, f"takes {op} of {d}")


def _show(t) -> str:
    """A term as the rule file writes it."""
    if isinstance(t, Var):
        return t.name
    if isinstance(t, Term):
        return f"{t.op}({', '.join(map(_show, t.args))})"
    return str(t)


def _singular(t):
    """(op, argument) for each argument in `t` that must not be 0: a pow's base too,
    unless its exponent is a constant >= 0 (y ** -1 divides by y)."""
    if isinstance(t, Term):
        if t.op in SINGULAR:
            yield t.op, t.args[SINGULAR[t.op]]
        if t.op == "pow" and not _nonnegative_const(t.args[1]):
            yield t.op, t.args[0]
        for a in t.args:
            yield from _singular(a)


def _nonnegative_const(t) -> bool:
    return isinstance(t, Term) and t.op == "const" and float(t.args[0]) >= 0


def _left_divisors(lhs) -> set:
    """The left side's divisors and their factors: the values the provers take as non-zero."""
    known, stack = set(), [d for _, d in _singular(lhs)]
    while stack:
        t = stack.pop()
        if t not in known:
            known.add(t)
            if isinstance(t, Term) and t.op in FACTORS:
                stack.extend(t.args[i] for i in FACTORS[t.op])
    return known


def _nonzero(t, known: set, counts: set) -> bool:
    if t in known or _positive(t, counts):
        return True
    if isinstance(t, Term) and t.op == "const":
        return float(t.args[0]) != 0
    return isinstance(t, Term) and t.op in FACTORS and all(_nonzero(t.args[i], known, counts) for i in FACTORS[t.op])


def _positive(t, counts: set) -> bool:
    if isinstance(t, Var):
        return t.name in counts
    if t.op == "const":
        return float(t.args[0]) > 0
    tensors = [a for a in t.args if isinstance(a, (Term, Var))]
    return t.op in POSITIVE or t.op in KEEPS_POSITIVE and all(_positive(a, counts) for a in tensors)
