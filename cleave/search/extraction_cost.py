"""The search cost of a candidate graph: passes over large reduced dims, as streamed bytes.

Reductions (reduce, MatMul, top-k) are grouped into *loops*, the way the scheduler
fuses them: one loop per (reduced extent, pass). A reduction over extent E whose
input depends on an earlier reduction over the same E starts a new pass, unless the
dependency is separable (`exp(x - m)`: a running m, rescaled). Each loop streams its
sources once: the graph inputs and the results of *other* loops that reach its
reductions through elementwise and layout ops. So reading K for a global max and
again for per-chunk sums is two passes (two loops read the scores), while
FlashDecoding's per-chunk loop reads them once.

    cost = sum over loops   bytes streamed / min(parallel rows, PARALLEL)
         + sum over ops     work / min(rows, PARALLEL)      (elements, twice for exp; MatMul MACs)
         + sum over loops'  results written / PARALLEL      (materialized for later ops)

The same code gives the symbolic expression (sympy, recorded on the candidate) and
the number at a binding (used to rank thousands of candidates fast).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import sympy

from cleave.ir import Graph, Node
from cleave.ir.dtypes import DType

PARALLEL = 1024  # output rows a GPU runs at once
TILE = 128  # the widest row a program handles; longer rows are several units of parallel work
REDUCTIONS = ("reduce", "matmul", "topk")
SOURCES = ("input",)  # leaves whose bytes a loop streams (consts, sizes, iotas are free)
FREE = ("input", "const", "size", "iota")
VIEWS = ("reshape", "permute", "broadcast", "split", "slice", "cast")
BYTES = {d: d.itemsize for d in DType}


def reduced_extent(n: Node):
    if n.op == "matmul":
        return n.inputs[0].shape[-1]
    return n.inputs[0].shape[n.attrs["axis"]]


def passes(graph: Graph) -> dict[int, int]:
    """Pass number of each reduction: 1 + the deepest pass over the same extent that it
    depends on, transitively (through reductions over other extents too). The factor m of
    `exp(x - m)` is separable: the extents of the reductions that produce m are excused
    (a running m, rescaled), not what m itself depends on."""
    users = graph.users()
    deps: dict[int, dict] = {}  # node id -> {extent: deepest pass it depends on}
    out: dict[int, int] = {}

    def merge(into: dict, more: dict, drop=()) -> None:
        for e, p in more.items():
            if e not in drop:
                into[e] = max(into.get(e, 0), p)

    for n in graph.live_nodes():
        d: dict = {}
        for k, x in enumerate(n.inputs):
            separable = n.op == "sub" and k == 1 and any(u.op in ("exp", "exp2") for u in users[n.id])
            merge(d, deps[x.id], _frontier(x) if separable else ())
        if n.op in REDUCTIONS:
            e = reduced_extent(n)
            out[n.id] = 1 + d.get(e, 0)
            d[e] = out[n.id]
        deps[n.id] = d
    return out


def _frontier(n: Node) -> set:
    """Extents of the reductions that produce n through elementwise and layout ops."""
    if n.op in REDUCTIONS:
        return {reduced_extent(n)}
    return set().union(*(_frontier(x) for x in n.inputs)) if n.inputs else set()


@dataclass
class Loop:
    extent: object
    pass_: int
    reductions: list = field(default_factory=list)
    sources: dict = field(default_factory=dict)  # node id -> Node streamed by this loop


def loops(graph: Graph) -> list[Loop]:
    p = passes(graph)
    key = {n.id: (reduced_extent(n), p[n.id]) for n in graph.live_nodes() if n.op in REDUCTIONS}
    found: dict[tuple, Loop] = {}
    for n in graph.live_nodes():
        if n.op not in REDUCTIONS:
            continue
        loop = found.setdefault(key[n.id], Loop(reduced_extent(n), p[n.id]))
        loop.reductions.append(n)
        stack, seen = list(n.inputs), set()
        while stack:
            x = stack.pop()
            if x.id in seen:
                continue
            seen.add(x.id)
            if x.op in REDUCTIONS:
                if key[x.id] != key[n.id]:  # another loop's result, read from memory
                    loop.sources[x.id] = x
            elif x.op in SOURCES:
                loop.sources[x.id] = x
            else:
                stack.extend(x.inputs)
    return list(found.values())


class _Symbolic:
    one = sympy.Integer(1)
    min = staticmethod(sympy.Min)
    max = staticmethod(sympy.Max)

    @staticmethod
    def dim(d):
        """An empty literal dim counts as 1, as in _Numeric: at 0 a row count divides 0 by 0."""
        return sympy.Integer(1) if d == 0 else d


class _Numeric:
    one = 1.0
    min = staticmethod(min)
    max = staticmethod(max)

    def __init__(self, env: dict):
        self.env = env
        self.memo: dict = {}

    def dim(self, d):
        """A dim's extent at the binding; an empty one (a first call with no tokens, which
        the graph may hold as a literal 0) counts as 1, as the scheduler ranks it: at 0
        every candidate costs nothing and its parallelism divides by zero."""
        v = self.memo.get(d)
        if v is None:
            v = self.memo[d] = max(1.0, float(d.xreplace(self.env)) if d.free_symbols else float(d))
        return v


def _total(graph: Graph, ar) -> object:
    def numel(n: Node):
        return math.prod((ar.dim(d) for d in n.shape), start=ar.one)

    def rows(n: Node):  # units of parallel work: rows, a long last axis counted in tiles of TILE
        return numel(n) / ar.min(ar.dim(n.shape[-1]), TILE) if n.rank else ar.one

    def par(n: Node):
        return ar.min(rows(n), PARALLEL)

    total = 0 * ar.one
    for loop in loops(graph):
        streamed = sum((numel(s) * BYTES[s.dtype] for s in loop.sources.values()), 0 * ar.one)
        total += streamed / ar.min(ar.max(ar.one, *(rows(r) for r in loop.reductions)), PARALLEL)
        total += sum((4 * numel(r) for r in loop.reductions), 0 * ar.one) / PARALLEL
    for n in graph.live_nodes():
        if n.op in FREE or n.op in VIEWS:
            continue
        work = numel(n.inputs[0]) if n.op in REDUCTIONS else numel(n)
        if n.op == "matmul":
            work = numel(n) * ar.dim(reduced_extent(n))
        if n.op == "exp":  # emitted as exp2(x * log2e): two ops, where an exp2 is one
            work = 2 * work
        total += work / par(n)
    return total


def cost(graph: Graph) -> sympy.Expr:
    """The symbolic cost (recorded on each candidate)."""
    return _total(graph, _Symbolic)


def rank(graph: Graph, env: dict) -> float:
    """The cost at a binding (symbol -> int); split counts not in `env` are taken as 32."""
    full = dict(env)
    for s in graph.symbols():
        full.setdefault(s, 32)
    return float(_total(graph, _Numeric(full)))


def representative(graph: Graph, reducible: set, shapes: dict | None = None) -> dict:
    """A binding to rank candidates: the user's, else long for the dims that are
    reduced over (`reducible`: absent from the outputs, or contracted) and short
    for the others."""
    env = {}
    for s in graph.symbols():
        if shapes and s.name in shapes:
            env[s] = shapes[s.name]
        elif s.name.startswith("s_"):
            env[s] = 32
        else:
            env[s] = 4096 if s in reducible else 8
    return env
