"""Dims an op needs equal that the IR reads as different expressions: which symbol to
read as what so that they become equal.

Torch guards such equalities when it traces (a MatMul's contracted dims, broadcast
dims, a view's element count) and proves them with its own facts, which the IR's
expressions do not carry. The translator asks `unification` for one symbol to read
as an expression of others, translates again, and repeats. Every choice agrees with
the sizes torch traced (`hints`); the operator's binding checks each input dim
against it, so inputs where it does not hold run eagerly, never wrongly.
"""
from __future__ import annotations

import sympy

from ..ir import dims as D

MAX_DIVISOR = 64


def unification(dims, hints: dict) -> tuple[str, sympy.Expr] | None:
    """(symbol name, expression) making dims[0] and dims[1] equal, tried in order:

    - a symbol under a floor by an expression of other symbols that divides its traced
      size (x.reshape(n, -1) of a length s gives n rows of s // n): read as that
      expression times a new symbol, as torch guards n | s;
    - two symbols equal exactly when they are one (s and t, s + 1 and t + 1, 2s and 2t,
      g·s and g·t, the same expression of each): the later name is read as the earlier;
    - a linear relation with a symbol of unit coefficient (4·s beside t: t is read as
      4·s; a symbol beside a number: read as that number), or one symbol's multiple
      beside a number it divides (16·C beside 48: C is read as 3);
    - a symbol under a floor, ceiling or modulo by c (x.chunk(2) over a width s gives
      ceil(s/2) and s - ceil(s/2); a view into T // 4 rows): read as c·t + r, r the
      traced size's residue, so that the floors resolve;
    - a product of symbols beside a number (heads · head_dim read off a KV cache
      beside a Linear's 8 features): the first symbol is read as its traced size, and
      the relation left is linear.
    None when nothing agrees with the traced sizes."""
    diff = _without_size_factors(sympy.expand(dims[0] - dims[1]))
    if not diff.free_symbols:
        return None
    # a quotient first: s = n·floor(s/n) traced at s = n is every multiple of n, not only n
    return (_quotient(dims, hints) or _one_symbol(dims, diff, hints) or _linear(diff, hints)
            or _residue(dims, hints) or _product(diff, hints))


def _without_size_factors(diff):
    """diff with the factors that are products of sizes taken out: sizes are positive, so
    those are never 0 (k's and v's heads repeated by one group size: g·hk beside g·hv
    leaves hk - hv)."""
    _, rest = sympy.factor_terms(diff).as_coeff_Mul()
    kept = [f for f in sympy.Mul.make_args(rest)
            if not (f.is_Symbol or f.is_Pow and f.base.is_Symbol and f.exp.is_Integer and f.exp > 0)]
    return sympy.expand(sympy.Mul(*kept)) if len(kept) < len(sympy.Mul.make_args(rest)) and kept else diff


def _one_symbol(dims, diff, hints: dict) -> tuple[str, sympy.Expr] | None:
    if len(diff.free_symbols) != 2:
        return None
    s, t = sorted(diff.free_symbols, key=lambda x: x.name)
    if s in hints and t in hints and hints[s] != hints[t]:
        return None  # traced at different sizes: one symbol would fit no call torch saw
    ratio = sympy.simplify(diff / (s - t))
    if (ratio.is_number and ratio != 0) or D.equal(dims[0].subs(t, s), dims[1].subs(t, s)):
        return t.name, s
    return None


def _linear(diff, hints: dict) -> tuple[str, sympy.Expr] | None:
    syms = sorted(diff.free_symbols, key=lambda x: x.name)
    try:
        poly = sympy.Poly(diff, *syms)
    except sympy.PolynomialError:  # floors, products of symbols: not linear
        return None
    if poly.total_degree() < 1 or not all(c.is_integer for c in poly.coeffs()):
        return None
    if len(syms) == 1:
        # A polynomial in s beside a number, torch guarding their equality: c·s beside k
        # (16·C beside 48: C == 3), or 8·w² beside 128 (a pooled map of w × w flattened
        # into a Linear's 128 features: w == 4). s is the positive integer root torch
        # traced; a binding at another root runs eagerly.
        s = syms[0]
        roots = [r for r in sympy.solve(diff, s) if r.is_Integer and r >= 1 and _agrees(s, r, hints)]
        return (s.name, roots[0]) if roots else None
    if poly.total_degree() != 1:
        return None
    for s in reversed(syms):  # the later name first, as pairs of symbols are merged
        coeff = diff.coeff(s)
        if abs(coeff) != 1:
            continue
        expr = sympy.expand(-(diff - coeff * s) / coeff)
        if _agrees(s, expr, hints) and (expr.free_symbols or expr >= 1):
            return s.name, expr
    return None


def _product(diff, hints: dict) -> tuple[str, sympy.Expr] | None:
    """A polynomial of several symbols with a product among its terms, each symbol's
    traced size known: only a number of the symbols' sizes solve it, so the first is
    read as its size; each later call of another size runs eagerly."""
    syms = sorted(diff.free_symbols, key=lambda x: x.name)
    if len(syms) < 2 or not set(syms) <= set(hints) or diff.subs(hints) != 0:
        return None
    try:
        if sympy.Poly(diff, *syms).total_degree() < 2:
            return None
    except sympy.PolynomialError:  # floors: _quotient's and _residue's
        return None
    return syms[0].name, sympy.Integer(hints[syms[0]])


def _residue(dims, hints: dict) -> tuple[str, sympy.Expr] | None:
    """A symbol whose traced size c divides goes first, whatever its name: an (n, 6)
    tensor viewed as rows of 3 under dynamic shapes (n·w // 3) reads w as 3·t, which
    every n serves, where n = 3·t + 2 (traced at n = 5) served a third of the ns."""
    both = dims[0] - dims[1]
    found = sorted(((hints[s] % c != 0, s.name, c, s) for s in both.free_symbols if s in hints
                    for c in _divisors(both, s)), key=lambda f: f[:3])
    for _, _, c, s in found:
        r = hints[s] % c
        if hints[s] < c + r:  # t would be 0: the traced size is the residue alone
            continue
        expr = c * D.symbol(f"{s.name}_by{c}") + r
        if dims[0].subs(s, expr) != dims[0] or dims[1].subs(s, expr) != dims[1]:
            return s.name, expr
    return None


def _quotient(dims, hints: dict) -> tuple[str, sympy.Expr] | None:
    both = dims[0] - dims[1]
    for f in sorted(both.atoms(sympy.floor), key=sympy.default_sort_key):
        num, den = sympy.fraction(sympy.together(f.args[0]))
        if not all(a.is_Symbol or a.is_Integer for a in sympy.Mul.make_args(num)) \
                or not den.free_symbols or not den.free_symbols <= set(hints) or den.subs(hints) < 1:
            continue
        size = den.subs(hints)
        for s in sorted(num.free_symbols - den.free_symbols, key=lambda x: x.name):
            if s in hints and hints[s] % size == 0:
                per = "_".join(x.name for x in sorted(den.free_symbols, key=lambda x: x.name))
                return s.name, den * D.symbol(f"{s.name}_per_{per}")
    return None


def _divisors(expr, s) -> list[int]:
    """The integers s is divided by under a floor, ceiling or modulo in expr."""
    out = set()
    for e in expr.atoms(sympy.floor, sympy.ceiling, sympy.Mod):
        if s not in e.free_symbols:
            continue
        if isinstance(e, sympy.Mod) and e.args[1].is_Integer:
            out.add(int(e.args[1]))
        for q in e.atoms(sympy.Rational):
            out.add(int(sympy.fraction(q)[1]))
    return sorted(c for c in out if 1 < c <= MAX_DIVISOR)


def _agrees(s, expr, hints: dict) -> bool:
    """expr takes s's traced size wherever the sizes of its symbols are known."""
    if s not in hints or not expr.free_symbols <= set(hints):
        return False
    return expr.subs(hints) == hints[s]


def resolved(reads: dict[str, sympy.Expr], name: str) -> sympy.Expr:
    """The expression an IR symbol is read as, through every reading recorded."""
    expr = D.symbol(name)
    table = {D.symbol(k): v for k, v in reads.items()}
    for _ in range(len(reads) + 1):
        expr, before = sympy.expand(expr.xreplace(table)), expr
        if expr == before:
            break
    return expr
