"""Loop bounds as values, printed as Triton only when the loop is emitted.

A bound is a sympy expression (over graph symbols, a program's tile indices `tid<L>`,
values it loads and the names of bounds defined before it) or one of the integer
operations Triton code applies to such expressions: `tl.maximum`/`tl.minimum`, a
tile reduction `tl.min`/`tl.max` of loaded values, and rounding to a multiple of the
tile, and the search of a never-decreasing buffer (monotone.py). The scheduler
evaluates bounds at the scheduled shapes (the cost model's share of tiles a loop runs)
and reads which loaded values they come from; codegen prints them.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from .exprs import code, value as expr_value


@dataclass(frozen=True)
class Call:
    """tl.<fn>(args): maximum/minimum of two bounds, or min/max over a tile of values."""
    fn: str
    args: tuple


@dataclass(frozen=True)
class Tiles:
    """e rounded to a multiple of `block`: down (e // b * b) or up ((e + b - 1) // b * b)."""
    e: object
    block: int
    up: bool = False


@dataclass(frozen=True)
class Search:
    """The first index j < extent of a never-decreasing 1-d buffer with buffer[j] >= target
    (extent when none): monotone.FIRST_AT_LEAST, computed in the kernel."""
    buffer: str
    extent: object
    target: object


def maximum(a, b) -> Call:
    return Call("maximum", (a, b))


def minimum(a, b) -> Call:
    return Call("minimum", (a, b))


def nest(fn: str, args: list):
    """tl.<fn> of all of args, left to right."""
    out = args[0]
    for a in args[1:]:
        out = Call(fn, (out, a))
    return out


def symbol(name: str) -> sympy.Symbol:
    """The symbol of a value the kernel defines (a bound, a tile index, a loaded value)."""
    return sympy.Symbol(name, integer=True)


def tid(lid: int) -> sympy.Symbol:
    """Label lid's tile index in the grid: the program's own tile of that label."""
    return sympy.Symbol(f"tid{lid}", integer=True, nonnegative=True)


def render(b) -> str:
    """The Triton code of bound b."""
    if isinstance(b, Call):
        return f"tl.{b.fn}({', '.join(render(a) for a in b.args)})"
    if isinstance(b, Tiles):
        e = f"({render(b.e)} + {b.block - 1})" if b.up else render(b.e)
        return f"{e} // {b.block} * {b.block}"
    if isinstance(b, Search):
        return f"first_at_least({b.buffer}_ptr, {render(b.extent)}, {render(b.target)})"
    return code(b)


def free_symbols(b) -> set:
    if isinstance(b, Call):
        return set().union(*(free_symbols(a) for a in b.args))
    if isinstance(b, Tiles):
        return free_symbols(b.e)
    if isinstance(b, Search):
        return free_symbols(b.extent) | free_symbols(b.target)
    return sympy.sympify(b).free_symbols


_SCALAR = {"maximum": max, "minimum": min}


def value(b, env: dict) -> int:
    """b's integer value, as the kernel computes it, with env giving each symbol's value
    by name (a tile reduction of loaded values, or a search, has none at schedule time)."""
    if isinstance(b, Call):
        return _SCALAR[b.fn](*(value(a, env) for a in b.args))
    if isinstance(b, Tiles):
        v = value(b.e, env)
        return ((v + b.block - 1) if b.up else v) // b.block * b.block
    return expr_value(b, env)
