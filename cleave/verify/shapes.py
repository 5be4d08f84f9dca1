"""Shape obligations of a rule, proven in z3 for every binding of the symbols.

Premises: every symbol is a positive integer, the rule's conditions hold, and the
lhs graph is well formed (its constraints hold). Goals: the rhs reads only lhs
inputs (same shapes and dtypes), its own constraints hold (a split without pad
needs its count to divide the axis), and the outputs agree in number, rank, dims
and dtype: a rhs that drops a broadcast operand is narrower, and a sum over the
dropped axis, or an output, would take another extent (`within(c, x)` keeps such
rules to operands that do not widen the result). Dims are sympy expressions;
ceiling/floor/Mod become fresh integers bounded by their definition (q = cdiv(N, s)
as s*(q-1) < N <= s*q).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
import z3

from ..ir import dims as D
from ..ir.contracts import RuleInstance
from ..ir.graph import Constraint


@dataclass
class ShapeResult:
    status: str  # "proven", "refuted", "unknown"
    detail: str = ""


class DimEncoder:
    """sympy dimension expressions and relations as z3 integer arithmetic.

    ceiling/floor/Mod become fresh integers bounded by their definition, and a
    relation between rational expressions is cleared of its (positive) denominator,
    so every query stays in integer arithmetic (real division makes z3 hang)."""

    def __init__(self):
        self.symbols: dict[str, z3.ArithRef] = {}
        self.facts: list[z3.BoolRef] = []
        self._fresh: dict[sympy.Symbol, z3.ArithRef] = {}

    def _new_int(self, tag: str) -> sympy.Symbol:
        s = sympy.Symbol(f"{tag}!{len(self._fresh)}", integer=True)
        self._fresh[s] = z3.Int(s.name)
        return s

    def _flatten(self, e) -> sympy.Expr:
        """e with every ceiling/floor/Mod replaced by a fresh integer (its definition becomes a fact)."""
        e = sympy.sympify(e)
        if isinstance(e, (sympy.ceiling, sympy.floor)):
            p, q = self._fraction(e.args[0])
            c = self._new_int("ceil" if isinstance(e, sympy.ceiling) else "floor")
            if isinstance(e, sympy.ceiling):
                self.facts += [self._poly(q * (c - 1)) < self._poly(p), self._poly(p) <= self._poly(q * c)]
            else:
                self.facts += [self._poly(q * c) <= self._poly(p), self._poly(p) < self._poly(q * (c + 1))]
            return c
        if isinstance(e, sympy.Mod):
            a, b = self._flatten(e.args[0]), self._flatten(e.args[1])
            k = self._new_int("quot")
            r = a - b * k
            self.facts += [self._poly(r) >= 0, self._poly(r) < self._poly(b)]
            return r
        if e.args:
            return e.func(*(self._flatten(a) for a in e.args))
        return e

    def _fraction(self, e):
        p, q = sympy.fraction(sympy.together(self._flatten(e)))
        if q.is_positive is not True:
            raise ValueError(f"cannot tell the sign of the denominator {q} in {e}")
        return sympy.expand(p), sympy.expand(q)

    def _poly(self, e) -> z3.ArithRef:
        e = sympy.expand(e)
        if e.is_Symbol:
            if e in self._fresh:
                return self._fresh[e]
            if e.name not in self.symbols:
                v = z3.Int(e.name)
                self.symbols[e.name] = v
                self.facts.append(v > 0)
            return self.symbols[e.name]
        if e.is_Integer:
            return z3.IntVal(int(e))
        if e.is_Add:
            return z3.Sum(*(self._poly(a) for a in e.args))
        if e.is_Mul:
            return z3.Product(*(self._poly(a) for a in e.args))
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return z3.Product(*([self._poly(e.base)] * int(e.exp)))
        raise ValueError(f"cannot encode dimension {e} for z3")

    def compare(self, op: str, a, b) -> z3.BoolRef:
        """a op b, with op in ==, !=, <, <=; denominators are cleared (they are positive)."""
        p, _ = self._fraction(sympy.sympify(a) - sympy.sympify(b))
        v = self._poly(p)
        return {"==": v == 0, "!=": v != 0, "<": v < 0, "<=": v <= 0}[op]

    def relation(self, r) -> z3.BoolRef:
        if r is sympy.true or r is True:
            return z3.BoolVal(True)
        if r is sympy.false or r is False:
            return z3.BoolVal(False)
        if isinstance(r, sympy.And):
            return z3.And(*(self.relation(a) for a in r.args))
        if isinstance(r, sympy.Or):
            return z3.Or(*(self.relation(a) for a in r.args))
        if isinstance(r, sympy.Not):
            return z3.Not(self.relation(r.args[0]))
        if isinstance(r, sympy.Eq):
            return self.compare("==", r.lhs, r.rhs)
        if isinstance(r, sympy.Ne):
            return self.compare("!=", r.lhs, r.rhs)
        if isinstance(r, (sympy.Lt, sympy.StrictLessThan)):
            return self.compare("<", r.lhs, r.rhs)
        if isinstance(r, sympy.Le):
            return self.compare("<=", r.lhs, r.rhs)
        if isinstance(r, sympy.Gt):
            return self.compare("<", r.rhs, r.lhs)
        if isinstance(r, sympy.Ge):
            return self.compare("<=", r.rhs, r.lhs)
        raise ValueError(f"cannot encode condition {r} for z3")

    def constraint(self, c: Constraint) -> z3.BoolRef:
        if c.kind == "eq":
            return self.compare("==", c.lhs, c.rhs)
        if c.kind == "le":
            return self.compare("<=", c.lhs, c.rhs)
        return self.compare("==", sympy.Mod(c.rhs, c.lhs), 0)


def check_shapes(inst: RuleInstance, timeout_ms: int = 5000) -> ShapeResult:
    lhs, rhs = inst.lhs, inst.rhs
    static = _static_mismatch(inst)
    if static:
        return ShapeResult("refuted", static)
    enc = DimEncoder()
    premises = [enc.relation(c) for c in inst.conditions] + [enc.constraint(c) for c in lhs.constraints]
    goals: list[tuple[z3.BoolRef, str]] = []
    for c in rhs.constraints:
        goals.append((enc.constraint(c), f"rhs constraint {c}"))
    for name, node in rhs.inputs.items():
        for i, (a, b) in enumerate(zip(lhs.inputs[name].shape, node.shape)):
            goals.append((enc.compare("==", a, b), f"input {name!r} dim {i}: lhs {D.fmt(a)} vs rhs {D.fmt(b)}"))
    for k, (lo, ro) in enumerate(zip(lhs.outputs, rhs.outputs)):
        for a, b in zip(lo.shape, ro.shape):
            goals.append((enc.compare("==", a, b), _differ(inst, k)))
    # premises first: encoding the goals may add definitional facts (fresh ceil/floor vars)
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*enc.facts, *premises)
    solver.add(z3.Or(*(z3.Not(g) for g, _ in goals)) if goals else z3.BoolVal(False))
    result = solver.check()
    if result == z3.unsat:
        return ShapeResult("proven")
    if result == z3.unknown:
        return ShapeResult("unknown", f"z3: {solver.reason_unknown()}")
    model = solver.model()
    binding = {name: model.eval(s, model_completion=True).as_long() for name, s in sorted(enc.symbols.items())}
    failed = [text for g, text in goals if z3.is_false(model.eval(g, model_completion=True))]
    values = ", ".join(f"{k}={v}" for k, v in binding.items())
    return ShapeResult("refuted", f"{failed[0] if failed else 'a shape goal'} at {values}")


def _differ(inst: RuleInstance, k: int) -> str:
    """The message for output k of the two sides with different shapes, at which inputs."""
    lo, ro = inst.lhs.outputs[k], inst.rhs.outputs[k]
    inputs = ", ".join(f"{name}{D.fmt_shape(n.shape)}" for name, n in inst.lhs.inputs.items())
    return (f"the sides' shapes differ: lhs {D.fmt_shape(lo.shape)} vs rhs {D.fmt_shape(ro.shape)} "
            f"(output {k}, inputs {inputs})")


def _static_mismatch(inst: RuleInstance) -> str:
    lhs, rhs = inst.lhs, inst.rhs
    if len(lhs.outputs) != len(rhs.outputs):
        return f"lhs has {len(lhs.outputs)} outputs, rhs has {len(rhs.outputs)}"
    for name, node in rhs.inputs.items():
        if name not in lhs.inputs:
            return f"rhs reads input {name!r}, which the lhs does not have"
        ln = lhs.inputs[name]
        if ln.rank != node.rank or ln.dtype != node.dtype:
            return f"input {name!r}: lhs {ln.dtype}{D.fmt_shape(ln.shape)} vs rhs {node.dtype}{D.fmt_shape(node.shape)}"
    for k, (lo, ro) in enumerate(zip(lhs.outputs, rhs.outputs)):
        if lo.rank != ro.rank:
            return _differ(inst, k)
        if lo.dtype != ro.dtype:
            return f"output {k}: lhs dtype {lo.dtype} vs rhs dtype {ro.dtype}"
    return ""
