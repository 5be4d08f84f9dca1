"""Torch's symbolic sizes (SymInt expressions over s0, s1, ...) as IR dims over the
user's symbol names."""
from __future__ import annotations

import sympy
import torch

from ..ir import Constraint
from ..ir import dims as D


def _trunc(a):
    """int(a): a floor where a is known not negative (a size scaled by a factor,
    interpolate's int(n * 1.5)), a ceiling where not positive; None (left as torch's)
    where the sign is unknown."""
    if a.is_nonnegative:
        return sympy.floor(a)
    if a.is_nonpositive:
        return sympy.ceiling(a)
    return None


def _mod(a, b):
    """a % b by a positive number as the floor it is, so that a size padded up to a
    multiple, n + (-n) % 4, reads 4·ceiling(n/4) for every n rather than one residue;
    sympy's Mod where b is not a positive number or a's sign is unknown."""
    if not (b.is_Integer and b > 0):
        return sympy.Mod(a, b)
    if a.is_nonnegative:
        return a - b * sympy.floor(a / b)
    if a.is_nonpositive:  # floor(-x/b) is -ceiling(x/b): indices print floors of nonnegative numbers
        return a + b * sympy.ceiling(-a / b)
    return sympy.Mod(a, b)


# torch.utils._sympy.functions classes, by name so that torch 2.11..2.13 all work.
_REWRITES = {
    "FloorDiv": lambda a, b: sympy.floor(a / b),
    "CleanDiv": lambda a, b: a / b,
    "IntTrueDiv": lambda a, b: a / b,
    "FloatTrueDiv": lambda a, b: a / b,
    "CeilToInt": sympy.ceiling,
    "FloorToInt": sympy.floor,
    "ToFloat": lambda a: a,
    "TruncToFloat": sympy.floor,
    "TruncToInt": _trunc,
    "PowByNatural": lambda a, b: a ** b,
    "FloatPow": lambda a, b: a ** b,
    "Mod": _mod,
    "PythonMod": _mod,
    "OpaqueUnaryFn_sqrt": sympy.sqrt,
    "Max": sympy.Max,
    "Min": sympy.Min,
}


class DataDependentSize(ValueError):
    """A size no input dimension defines: it depends on a tensor's values (torch.unique,
    x[mask], nonzero)."""


class SymbolMap:
    """torch symbol -> IR symbol; `to_dim` converts a size, `to_scalar` a SymFloat."""

    def __init__(self):
        self.subs: dict[sympy.Symbol, sympy.Expr] = {}
        self.hints: dict[sympy.Symbol, int] = {}  # IR symbol -> its size where torch traced
        # The side of each clamp the reading took (_clamp_as_traced): the capture adds them
        # to the graph, so that a call where the other side wins runs eagerly.
        self.facts: list[Constraint] = []

    def name(self, torch_expr, our_name: str, hint: int | None = None) -> None:
        """Record that a bare torch symbol is the user's `our_name`."""
        if isinstance(torch_expr, sympy.Symbol) and torch_expr not in self.subs:
            self.read_as(torch_expr, D.symbol(our_name), hint)

    def read_as(self, torch_expr: sympy.Symbol, expr: sympy.Expr, hint: int | None = None) -> None:
        """Record a torch symbol as an expression of IR symbols (cleave.frontends.unify),
        solving the traced size of an IR symbol it alone holds."""
        self.subs[torch_expr] = expr
        unknown = [s for s in expr.free_symbols if s not in self.hints]
        if hint is not None and len(unknown) == 1:
            (s,) = unknown
            value = sympy.solve(sympy.Eq(expr.subs(self.hints), hint), s)
            if len(value) == 1 and value[0].is_integer:
                self.hints[s] = int(value[0])

    def name_expr(self, torch_expr: sympy.Expr, our_name: str, hint: int | None = None) -> None:
        """Record a torch size expression (Min(s0, s1 - 1)) as one IR symbol of its own."""
        self.subs[_rewrite(torch_expr)] = D.symbol(our_name)
        if hint is not None:
            self.hints[D.symbol(our_name)] = hint

    def knows(self, torch_expr: sympy.Expr) -> bool:
        return _rewrite(torch_expr) in self.subs

    def signed(self, torch_expr: sympy.Symbol, pos: str, neg: str, hint: int | None = None) -> None:
        """Record a torch symbol that may be negative (an int argument) as pos - neg: the
        IR's symbols are positive (dims), so it is read as the difference of two."""
        self.subs[torch_expr] = D.symbol(pos) - D.symbol(neg)
        if hint is not None:
            self.hints[D.symbol(pos)], self.hints[D.symbol(neg)] = max(hint, 0) + 1, max(-hint, 0) + 1

    def names(self) -> set[str]:
        return {s.name for v in self.subs.values() for s in v.free_symbols}

    def to_expr(self, value) -> sympy.Expr:
        """An int, float, SymInt or SymFloat as a sympy expression over our symbols."""
        if isinstance(value, bool):
            return sympy.true if value else sympy.false
        if isinstance(value, int):
            return sympy.Integer(value)
        if isinstance(value, float):
            return sympy.Float(value)
        node = getattr(value, "node", None)
        expr = getattr(node, "expr", None)
        if expr is None:
            raise TypeError(f"not a size: {value!r}")
        expr = _rewrite(expr).xreplace(self.subs).replace(
            lambda e: isinstance(e, sympy.Max) and len(e.args) == 2 and 0 in e.args, self._clamp_as_traced)
        ours = {s for v in self.subs.values() for s in v.free_symbols}
        unknown = [s for s in expr.free_symbols if s not in ours]
        if unknown:
            raise DataDependentSize(f"size {expr} depends on {', '.join(map(str, unknown))}, "
                             f"which no input dimension defines (a data-dependent size)")
        if isinstance(value, torch.SymInt) and expr.has(sympy.Float):
            # a size through a float (arange(0, n, 0.5) holds ceiling(2.0*n)), in exact rationals
            expr = sympy.nsimplify(expr, rational=True)
        return sympy.simplify(expr) if not expr.is_Atom else expr

    def to_dim(self, value) -> sympy.Expr:
        return D.dim(self.to_expr(value))

    def _clamp_as_traced(self, clamp: sympy.Max) -> sympy.Expr:
        """Max(0, e), a size clamped at empty (indptr[1:-1] traced size-obliviously) or a
        number (`max(k, 0)` of an int argument): the side torch traced, held to that side by
        a fact, so that one graph never serves both (the IR's dims hold no Max)."""
        inner = next(a for a in clamp.args if a != 0)
        traced = inner.subs(self.hints) if inner.free_symbols <= set(self.hints) else None
        text = f"the clamp of {D.fmt(inner)} at 0, as traced"
        if traced is not None and traced < 0:
            self.facts.append(Constraint("le", inner, D.dim(0), text))
            return sympy.Integer(0)
        self.facts.append(Constraint("le", D.dim(0), inner, text))
        return inner


def _rewrite(expr):
    """Replace torch's sympy function classes by plain sympy, innermost first."""
    if expr.is_Atom:
        return expr
    args = [_rewrite(a) for a in expr.args]
    fn = _REWRITES.get(type(expr).__name__)
    out = fn(*args) if fn is not None else None
    if out is not None:
        return out
    return expr.func(*args) if args else expr
