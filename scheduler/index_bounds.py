"""Interval bounds of tile index expressions, to leave out masks that provably hold."""
from __future__ import annotations

import sympy


def index_bounds(e, extents: dict):
    """Least and greatest value of an index over its labels' valid ranges, by
    interval arithmetic over sums, label-free scalings, x % n and floor(x / n)
    (None where it cannot tell): masks that these prove are left out."""
    labels = set(extents)
    if not (e.free_symbols & labels):
        return e, e
    if e in extents:
        return sympy.Integer(0), extents[e] - 1
    if isinstance(e, sympy.Add):
        lo = hi = sympy.Integer(0)
        for term in e.args:
            t_lo, t_hi = index_bounds(term, extents)
            if t_lo is None:
                return None, None
            lo, hi = lo + t_lo, hi + t_hi
        return lo, hi
    if isinstance(e, sympy.Mul):
        coeff = sympy.Mul(*[a for a in e.args if not (a.free_symbols & labels)])
        rest = [a for a in e.args if a.free_symbols & labels]
        if len(rest) != 1:
            return None, None
        r_lo, r_hi = index_bounds(rest[0], extents)
        if r_lo is None:
            return None, None
        if provable(coeff):
            return coeff * r_lo, coeff * r_hi
        if provable(-coeff):
            return coeff * r_hi, coeff * r_lo
        return None, None
    if isinstance(e, sympy.Mod):  # reshape indices: x % n lies in [0, n) for x >= 0
        x_lo, _ = index_bounds(e.args[0], extents)
        if x_lo is not None and provable(x_lo) and not (e.args[1].free_symbols & labels):
            return sympy.Integer(0), e.args[1] - 1
        return None, None
    if isinstance(e, sympy.floor):  # floor(x / n) for a positive n free of labels
        num, den = sympy.fraction(e.args[0])
        if den.free_symbols & labels or not provable(den - 1):
            return None, None
        x_lo, x_hi = index_bounds(num, extents)
        if x_lo is None:
            return None, None
        return sympy.floor(x_lo / den), sympy.floor(x_hi / den)
    return None, None


def provable(e) -> bool:
    """e >= 0 for every positive integer binding of its symbols."""
    e = sympy.expand(e)  # cheap; simplify would cost seconds per plan
    return bool(e.is_nonnegative) or (e.is_number and e >= 0)
