"""Symbolic dimensions: sympy expressions over positive-integer symbols."""
from __future__ import annotations

import functools
from typing import Iterable, Union

import sympy

from .errors import ShapeError

Dim = sympy.Expr
DimLike = Union[int, str, sympy.Expr]


def symbol(name: str) -> sympy.Symbol:
    """The one symbol the IR uses for a dimension name: a positive integer."""
    return sympy.Symbol(name, integer=True, positive=True)


def dim(value: DimLike, symbols: dict[str, sympy.Symbol] | None = None) -> Dim:
    """Read a dimension from an int, a symbol name, or an expression ('b*h', 'L/s')."""
    if isinstance(value, bool):
        raise TypeError(f"a dimension cannot be a bool ({value!r})")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a dimension cannot be negative ({value})")
        return sympy.Integer(value)
    if isinstance(value, sympy.Expr):
        return _positive_symbols(value)
    if isinstance(value, str):
        text = value.strip()
        if text.isidentifier():
            return symbol(text)
        names = {n: symbol(n) for n in _identifiers(text)}
        names.update(symbols or {})
        names["cdiv"] = cdiv
        try:
            expr = sympy.sympify(text, locals=names)
        except (sympy.SympifyError, SyntaxError, TypeError, AttributeError, ArithmeticError, ValueError):
            expr = None  # ArithmeticError: Mod(s, 0); ValueError: what sympy's parser wraps
        if not isinstance(expr, sympy.Expr) or (expr.is_number and not expr.is_integer):
            raise ShapeError(f"cannot read a dimension from {value!r}: a dimension is an int, a symbol name "
                             f"or an expression of them ('b*h', 'L/s', 'cdiv(n, 64)')")
        if expr.is_number and expr < 0:
            raise ValueError(f"a dimension cannot be negative ({value!r})")
        return _positive_symbols(expr)
    raise TypeError(f"cannot read a dimension from {value!r}")


def shape(values: Iterable[DimLike]) -> tuple[Dim, ...]:
    return tuple(dim(v) for v in values)


def cdiv(n: DimLike, d: DimLike) -> Dim:
    """Ceiling division, kept symbolic when the operands are."""
    return sympy.ceiling(dim(n) / dim(d))


def equal(a: Dim, b: Dim) -> bool:
    """True when a and b are provably equal for every binding of their symbols."""
    if a == b:
        return True
    return _equal(a, b)


@functools.lru_cache(maxsize=65536)
def _equal(a: Dim, b: Dim) -> bool:
    # expand() settles most pairs (two numbers, a difference that is a nonzero constant)
    # at a fraction of simplify()'s cost: instantiating the rule library compares 10^4
    # pairs of dims, and simplify took most of its time.
    difference = sympy.expand(a - b)
    if difference.is_Number:
        return difference == 0
    return sympy.simplify(a - b) == 0


def nonnegative(d: Dim) -> bool:
    """True when d >= 0 for every binding, also where that rests on ceiling(x) >= x and
    floor(x) <= x: 4·ceiling(n/4) - n (a pad up to a multiple of 4), which sympy's own
    assumptions leave open."""
    if d.is_nonnegative:
        return True
    terms = sympy.Add.make_args(sympy.expand(d))
    lower = []
    for term in terms:
        coeff, rest = term.as_coeff_Mul()
        if isinstance(rest, sympy.ceiling) and coeff > 0 or isinstance(rest, sympy.floor) and coeff < 0:
            lower.append(coeff * rest.args[0])
        elif rest.has(sympy.floor, sympy.ceiling):
            return False
        else:
            lower.append(term)
    return sympy.simplify(sympy.Add(*lower)).is_nonnegative is True


def exact_quotients(d: Dim) -> Dim:
    """d with each floor(p/q) read as p/q: equal where the graph's constraints say q
    divides p (h heads of floor(d/h) rows make d rows)."""
    return dim(d).replace(sympy.floor, lambda x: x)


def is_one(d: Dim) -> bool:
    return d == 1


def free_symbols(dims: Iterable[Dim]) -> set[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    for d in dims:
        out |= d.free_symbols
    return out


def evaluate(d: Dim, env: dict) -> int:
    """The integer value of d under a binding of its symbols (names or symbols as keys)."""
    try:
        return _evaluate(d, tuple(sorted(env.items(), key=lambda kv: str(kv[0]))))
    except TypeError:  # a value that does not hash
        return _evaluate.__wrapped__(d, tuple(env.items()))


@functools.lru_cache(maxsize=1 << 16)  # the scheduler asks for the same extents under each tiling
def _evaluate(d: Dim, env: tuple) -> int:
    subs = {symbol(k) if isinstance(k, str) else k: v for k, v in env}
    value = d.subs(subs)
    if not value.is_number:
        missing = ", ".join(sorted(str(s) for s in value.free_symbols))
        raise KeyError(f"dimension {d} needs a value for {missing}")
    if not value.is_finite:  # a division by a size that is 0 here (reshape(-1, 4, 3) at n = 0)
        from .errors import BindingError

        raise BindingError(f"dimension {fmt(d)} is undefined at {dict(env)} (a division by zero)")
    return int(value)


def fmt(d: Dim) -> str:
    return str(d).replace(" ", "")


def fmt_shape(dims: Iterable[Dim]) -> str:
    return "[" + ", ".join(fmt(d) for d in dims) + "]"


def _identifiers(text: str) -> set[str]:
    import re

    return {m for m in re.findall(r"[A-Za-z_]\w*", text) if m not in ("ceiling", "cdiv", "floor", "Max", "Min", "Mod", "Abs")}


def _positive_symbols(expr: sympy.Expr) -> sympy.Expr:
    """Replace plain symbols by the positive-integer symbol of the same name."""
    subs = {s: symbol(s.name) for s in expr.free_symbols if not (s.is_integer and s.is_positive)}
    return expr.xreplace(subs) if subs else expr
