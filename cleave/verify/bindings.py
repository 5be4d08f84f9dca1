"""Concrete bindings of a rule's symbols: small ones for the provers, more for the numeric gate.

For every split, a binding falls in one case of (extent N, count s): exact (s | N,
s < N), ragged tail, empty chunk (a whole chunk is padding), s = N, s > N. The
chosen bindings cover every case the conditions allow.

A binding's size is the number of input elements: every scalar variable of a prover
query is one of them, so the provers get bindings within PROVER_ELEMENTS, and the z3
terms stay small (a top-k network costs z3 about half a second per row of 3); a case
that no binding within the budget reaches gets its smallest one. Larger bindings, up
to NUMERIC_ELEMENTS, are the numeric gate's.
"""
from __future__ import annotations

import itertools
import math
import operator
import random
from dataclasses import dataclass
from fractions import Fraction

import sympy

from ..ir import dims as D
from ..ir.contracts import RuleInstance

VALUES = range(1, 10)
PROVER_ELEMENTS = 12
NUMERIC_ELEMENTS = 4000


@dataclass(frozen=True)
class Binding:
    env: tuple[tuple[str, int], ...]
    cases: tuple[str, ...]
    size: int  # input elements
    ones: int  # symbols bound to 1 (such dims hide layout bugs; a count of 1 is no split)

    @property
    def dict(self) -> dict[str, int]:
        return dict(self.env)

    def __str__(self) -> str:
        text = " ".join(f"{k}={v}" for k, v in self.env)
        return text + (f" ({', '.join(self.cases)})" if self.cases else "")


def split_case(n: int, s: int) -> str:
    if s == n:
        return "count=N"
    if s > n:
        return "count>N"
    if n % s == 0:
        return "exact"
    inner = -(-n // s)
    return "empty-chunk" if (s - 1) * inner >= n else "ragged"


def _split_sites(inst: RuleInstance):
    sites = []
    for g in (inst.lhs, inst.rhs):
        for node in g.live_nodes():
            if node.op == "split":
                site = (node.attrs["count"], node.inputs[0].shape[node.attrs["axis"]])
                if site not in sites:
                    sites.append(site)
    return sites


def _symbols(inst: RuleInstance) -> list[sympy.Symbol]:
    syms = set(inst.lhs.symbols()) | set(inst.rhs.symbols())
    for g in (inst.lhs, inst.rhs):
        for node in g.inputs.values():
            syms |= D.free_symbols(node.shape)
    for c in inst.conditions:
        syms |= sympy.sympify(c).free_symbols
    return sorted({D.symbol(s.name) for s in syms}, key=lambda s: s.name)


_MODULES = [{"ceiling": math.ceil, "floor": math.floor, "Mod": operator.mod, "Max": max, "Min": min}, "math"]


def _compile(syms, exprs):
    """Exact evaluators (Fraction arguments keep N/s exact) for sympy expressions."""
    return [sympy.lambdify(syms, e, modules=_MODULES) for e in exprs]


def candidates(inst: RuleInstance, samples: int = 600) -> list[Binding]:
    syms = _symbols(inst)
    names = [s.name for s in syms]
    sites = _split_sites(inst)
    conds = [sympy.sympify(c).xreplace({s: D.symbol(s.name) for s in sympy.sympify(c).free_symbols})
             for c in inst.conditions]
    checks = _compile(syms, conds)
    cons = [(c.kind, f1, f2) for c, (f1, f2) in zip(
        inst.lhs.constraints, zip(_compile(syms, [c.lhs for c in inst.lhs.constraints]),
                                  _compile(syms, [c.rhs for c in inst.lhs.constraints])))]
    size_expr = sum((sympy.prod(n.shape) for n in inst.lhs.inputs.values()), sympy.Integer(0))
    size_fn, = _compile(syms, [size_expr])
    site_fns = [(f1, f2) for f1, f2 in zip(_compile(syms, [c for c, _ in sites]), _compile(syms, [e for _, e in sites]))]

    if len(VALUES) ** len(syms) <= 4 * samples:
        grid = list(itertools.product(VALUES, repeat=len(syms)))
    else:  # every small binding (the provers' pool), and random larger ones
        top = max(v for v in VALUES if v ** len(syms) <= 2 * samples)
        grid = list(itertools.product(range(1, top + 1), repeat=len(syms)))
        rng = random.Random(0)
        grid += [tuple(rng.choice(VALUES) for _ in syms) for _ in range(samples)]
    out: dict[tuple, Binding] = {}
    for values in grid:
        args = [Fraction(v) for v in values]
        if not all(bool(f(*args)) for f in checks):
            continue
        if not all(_holds(kind, f1(*args), f2(*args)) for kind, f1, f2 in cons):
            continue
        ints = []
        for fc, fe in site_fns:
            s, n = fc(*args), fe(*args)
            if Fraction(s).denominator != 1 or Fraction(n).denominator != 1 or s <= 0:
                break
            ints.append((int(n), int(s)))
        else:
            cases = tuple(split_case(n, s) for n, s in ints)
            ones = values.count(1)
            env = tuple(zip(names, values))
            out[env] = Binding(env, cases, int(size_fn(*args)), ones)
    return list(out.values())


def _holds(kind, lhs, rhs) -> bool:
    if kind == "eq":
        return lhs == rhs
    if kind == "le":
        return lhs <= rhs
    return lhs != 0 and Fraction(rhs) % Fraction(lhs) == 0


def choose(inst: RuleInstance, prover_size: int = PROVER_ELEMENTS, prover_count: int = 5,
           numeric_size: int = NUMERIC_ELEMENTS, numeric_count: int = 12) -> tuple[list[Binding], list[Binding]]:
    """(prover bindings, numeric bindings). Per split case tuple, the provers get one
    binding within `prover_size` elements (fewest symbols bound to 1), else the
    smallest of that case; the numeric gate gets the smallest one and a large one. The
    case tuples that cover every (split, case) pair come first and are never cut."""
    pool = candidates(inst)
    by_case: dict[tuple, list[Binding]] = {}
    for b in sorted(pool, key=lambda b: (b.ones, b.size, b.env)):
        by_case.setdefault(b.cases, []).append(b)
    order, covering = _cover_order(list(by_case))
    prover, numeric = [], []
    for cases in order:
        group = by_case[cases]
        small = [b for b in group if b.size <= prover_size]
        prover.append(small[0] if small else min(group, key=lambda b: (b.size, b.env)))
        fits = [b for b in group if b.size <= numeric_size]
        if fits:
            numeric.append(fits[0])
            big = max(fits, key=lambda b: (b.ones == 0, b.size))
            if big is not fits[0]:
                numeric.append(big)
    if list(by_case) == [()]:  # no split: add one binding with size-1 dims, an edge of broadcasting
        edge = sorted((b for b in pool if b.ones and b.size <= prover_size), key=lambda b: (b.size, b.env))
        if edge and edge[0] not in prover:
            prover.append(edge[0])
            numeric.append(edge[0])
    return prover[:max(prover_count, covering)], numeric[:max(numeric_count, 2 * covering)]


def _cover_order(keys: list[tuple]) -> tuple[list[tuple], int]:
    """Case tuples ordered so that the first ones cover every (split, case) pair
    (greedy), and how many those first ones are."""
    left = sorted(keys)
    uncovered = {(i, c) for k in keys for i, c in enumerate(k)}
    out, covering = [], 0
    while left:
        best = max(left, key=lambda k: len(uncovered & set(enumerate(k))))
        out.append(best)
        left.remove(best)
        uncovered -= set(enumerate(best))
        if not uncovered and not covering:
            covering = len(out)
    return out, covering
