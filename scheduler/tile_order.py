"""Heaviest tiles first: which grid tile ids to decode in reverse.

Programs are dispatched roughly in program-id order, so the programs whose loops run
longest should get the lowest ids (longest-processing-time order, as FlashAttention-3
orders causal q tiles): otherwise the heaviest tiles of the last heads run alone at
the end of the launch. A loop's bounds (loop_bounds.py) tell how its trip count moves
with each grid tile id `tid<L>`: causal attention's kv loop stops at the q tile's
diagonal, `min(s, 128 + 128 * tid)`, so its trip count grows with the q tile. A tile
id is decoded in reverse (`n - 1 - t`) when every loop's trip count that reads it is
known never to decrease in it. A sliding window (both bounds move with the tile), a
bound loaded from memory or searched in a buffer reads as unknown: the order stays.
"""
from __future__ import annotations

import sympy

from .index_bounds import provable
from .loop_bounds import Call, Search, Tiles, free_symbols, tid

# How a value moves as one tile id grows: +1 never decreases, -1 never increases,
# 0 does not read it, None unknown.
INCREASING, DECREASING = "increasing", "decreasing"
_NAMES = {1: INCREASING, -1: DECREASING, None: "unknown"}


def combine(directions) -> int | None:
    """The direction of a function that is non-decreasing in each of its arguments."""
    found = set(directions)
    if None in found:
        return None
    found.discard(0)
    return found.pop() if len(found) == 1 else (0 if not found else None)


def _neg(d):
    return None if d is None else -d


def direction(b, t: str, defs: dict, constants: set) -> int | None:
    """How bound b (loop_bounds.py) moves as the tile id named t grows. `defs` maps the
    names of the bounds defined before the loop to their bounds; `constants` holds the
    names of the symbols fixed within a launch (graph symbols, the other tile ids)."""
    if isinstance(b, Call):  # tl.maximum / tl.minimum, or tl.min / tl.max over a tile: monotone in each
        return combine(direction(a, t, defs, constants) for a in b.args)
    if isinstance(b, Tiles):  # rounding to a multiple of the tile is monotone
        return direction(b.e, t, defs, constants)
    if isinstance(b, Search):  # reads a buffer: known only when nothing it reads moves
        moved = combine(direction(a, t, defs, constants) for a in (b.extent, b.target))
        return 0 if moved == 0 else None
    return _affine(sympy.sympify(b), t, defs, constants)


def _affine(e, t: str, defs: dict, constants: set) -> int | None:
    """The direction of a sympy expression: linear, with coefficients of known sign, in t,
    in the bounds defined before the loop and in floors of such (a page index); any
    other symbol that is not fixed within a launch (a loaded value) makes it unknown."""
    fixed = constants - {t}
    moving = {}
    for f in e.atoms(sympy.floor):
        num, den = sympy.fraction(sympy.together(f.args[0]))
        if provable(den - 1) and all(s.name in fixed for s in den.free_symbols):
            dummy = sympy.Dummy(integer=True)
            e, moving[dummy] = e.xreplace({f: dummy}), _affine(sympy.expand(num), t, defs, constants)
    for s in e.free_symbols - set(moving):
        if s.name == t:
            moving[s] = 1
        elif s.name in defs:
            moving[s] = direction(defs[s.name], t, defs, constants)
        elif s.name not in fixed:
            return None
    moving = {s: d for s, d in moving.items() if d != 0}
    if not moving:
        return 0
    if None in moving.values() or not e.is_polynomial(*moving):
        return None
    poly = sympy.Poly(e, *moving)
    if poly.total_degree() > 1:
        return None
    out = []
    for s, d in moving.items():
        c = poly.coeff_monomial(s)
        out.append(d if provable(c) else -d if provable(-c) else None)
    return combine(out)


def trip_direction(lo, hi, t: str, defs: dict, constants: set) -> int | None:
    """How the trip count of a loop from lo to hi moves as the tile id named t grows."""
    return combine([direction(hi, t, defs, constants), _neg(direction(lo, t, defs, constants))])


def trip_directions(em, lo, hi, defs: list) -> dict:
    """Per grid tile id a loop's bounds read, `X<L>` -> INCREASING, DECREASING or
    "unknown": how the loop's trip count (from lo to hi, with the bounds `defs` defined
    before it) moves as the tile id grows."""
    table = {sym.name: b for sym, b in defs}
    reads = {s.name for s in set().union(free_symbols(lo), free_symbols(hi), *(free_symbols(b) for _, b in defs))}
    constants = {s.name for s in em.views.graph.symbols()} | {tid(lid).name for lid in em.labels}
    out = {}
    for lid in sorted(em.labels):
        if em.t.role[lid] == "grid" and tid(lid).name in reads:
            d = trip_direction(lo, hi, tid(lid).name, table, constants)
            if d != 0:
                out[f"X{lid}"] = _NAMES[d]
    return out


def descending(records: list) -> set:
    """Ids of the grid labels to decode in reverse: those along which some loop's trip
    count grows and none moves otherwise (loop records: bounds.loop_record)."""
    seen: dict = {}
    for r in records:
        for label, d in r["trips"].items():
            seen.setdefault(label, set()).add(d)
    return {int(label[1:]) for label, ds in seen.items() if ds == {INCREASING}}
