"""The symbolic search cost of a candidate graph (sympy).

    cost = sum over ops of  work / min(parallel rows, PARALLEL)  +  bytes materialized / PARALLEL

`work` of a reduction (reduce, MatMul, top-k) is the elements it streams times
its number of passes: a reduction over an extent E whose input depends on an
earlier reduction over the same extent E (broadcast back along it) needs that
one finished first: one more pass over the data. The dependency through
`exp(x - m)` does not count: it is separable (a running m, rescaled). Split
reductions stream shorter extents with more parallel rows, which is what makes
FlashDecoding and Split-K win when rows are few.
"""
from __future__ import annotations

import math

import sympy

from cleave.ir import Graph, Node

PARALLEL = 1024  # output rows a GPU runs at once
REDUCTIONS = ("reduce", "matmul", "topk")
VIEWS = ("input", "const", "size", "iota", "reshape", "permute", "broadcast", "split", "slice")


def _numel(n: Node):
    return math.prod(n.shape, start=sympy.Integer(1))


def _rows(n: Node):
    return _numel(n) / n.shape[-1] if n.rank and n.shape[-1] != 0 else sympy.Integer(1)


def reduced_extent(n: Node):
    if n.op == "matmul":
        return n.inputs[0].shape[-1]
    return n.inputs[0].shape[n.attrs["axis"]]


def passes(graph: Graph) -> dict[int, int]:
    out: dict[int, int] = {}
    users = graph.users()

    def upstream(n: Node, extent, separable: bool, seen: set) -> int:
        best = 0
        for k, x in enumerate(n.inputs):
            sep = separable or (n.op == "sub" and k == 1 and any(u.op == "exp" for u in users[n.id]))
            if x.id in seen:
                continue
            seen.add(x.id)
            if x.op in REDUCTIONS:
                best = max(best, out[x.id] + (0 if sep or reduced_extent(x) != extent else 1) - 1)
            else:
                best = max(best, upstream(x, extent, sep, seen))
        return best

    for n in graph.live_nodes():
        if n.op in REDUCTIONS:
            out[n.id] = 1 + upstream(n, reduced_extent(n), False, set())
    return out


def cost(graph: Graph) -> sympy.Expr:
    p = passes(graph)
    total = sympy.Integer(0)
    for n in graph.live_nodes():
        if n.op in VIEWS:
            continue
        if n.op in REDUCTIONS:
            work = _numel(n.inputs[0]) * p[n.id]
            if n.op == "matmul":
                work = _numel(n) * reduced_extent(n) * p[n.id]
            # its result is materialized (4 bytes an element) for the ops after it
            total += work / sympy.Min(_rows(n), PARALLEL) + 4 * _numel(n) / PARALLEL
        else:
            total += _numel(n) / sympy.Min(_rows(n), PARALLEL)
    return total


def representative(graph: Graph, reducible: set, shapes: dict | None = None) -> dict:
    """A binding to rank candidates: the user's, else reduced dims long and others short."""
    env = {}
    for s in graph.symbols():
        if shapes and s.name in shapes:
            env[s] = shapes[s.name]
        elif s.name.startswith("s_"):
            env[s] = 32
        else:
            env[s] = 4096 if s in reducible else 8
    return env


def evaluate(expr: sympy.Expr, env: dict) -> float:
    """The cost at a binding; split counts it does not fix are taken as 32."""
    full = {s: env.get(s, 32) for s in expr.free_symbols}
    return float(expr.xreplace(full))
