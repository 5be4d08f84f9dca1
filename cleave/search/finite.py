"""Which nodes of a graph hold only finite values, and which are never 0: the facts
behind `finite(x)` and `nonzero(c)`.

The provers reason over finite reals, and so do rules that distribute a product over
a sum: with an infinity in X, sum_n (X W) can be inf - inf = NaN where X (W 1) is
inf. The masked numeric gate feeds such rules -inf, as a mask fill leaves it, so a
rule that needs finite operands says so. A node is finite when the program's inputs
are (the provers' assumption) and every op on the way keeps finite values finite:
a -inf fill, a division, a log or an exp that may overflow ends it. The provers also
take divisors non-zero, which finite data does not promise (an input may hold 0): a
rule moving or cancelling a divisor needs `nonzero` (nonzero_nodes).
"""
from __future__ import annotations

import math

from cleave.ir import Graph

# Ops mapping finite operands to finite values (exp overflows in f32 at 89; a max
# over an empty axis is -inf; a division or log can make an infinity from finite data).
KEEPS_FINITE = frozenset({
    "neg", "abs", "square", "silu", "sigmoid", "tanh", "cos", "sin", "erf", "erfc", "floor", "ceil", "trunc", "round", "sign",
    "add", "sub", "mul", "max", "min", "atan2", "copysign", "lt", "le", "gt", "ge", "eq", "ne",
    "where", "matmul", "cast", "broadcast", "reshape", "permute", "slice", "concat", "gather", "take",
})


def finite_nodes(graph: Graph) -> set[int]:
    """Ids of the live nodes that hold finite values whenever the inputs do. A division,
    rsqrt or reciprocal is one where its divisor is at least a positive number (a norm's
    rsqrt(mean(x^2) + eps), a mean's division by the row's size)."""
    out: set[int] = set()
    floored = _at_least_positive(graph)
    for n in graph.live_nodes():
        if n.op in ("input", "size", "iota"):
            ok = True
        elif n.op == "const":
            ok = math.isfinite(float(n.attrs["value"]))
        elif n.op == "reduce":
            ok = n.attrs["op"] == "sum"
        elif n.op == "split":
            ok = math.isfinite(n.attrs["pad"])
        elif n.op in ("rsqrt", "recip", "div"):
            ok = n.inputs[-1].id in floored
        else:
            ok = n.op in KEEPS_FINITE
        if ok and all(x.id in out for x in n.inputs):
            out.add(n.id)
    return out


# Ops whose value is >= 0 wherever their operands are (the first operand's, for a view).
NONNEGATIVE = frozenset({"square", "abs", "exp", "exp2", "sigmoid", "sqrt"})


def _at_least_positive(graph: Graph) -> set[int]:
    """Ids of the live nodes bounded below by a positive number (so never 0, nor tiny
    enough that a division by them overflows): a positive constant, a size (an empty
    axis runs the graph as written), and a sum of such a node and values >= 0."""
    nonnegative: set[int] = set()
    out: set[int] = set()
    for n in graph.live_nodes():
        ids = [x.id for x in n.inputs]
        if n.op == "const":
            value = float(n.attrs["value"])
            positive, nonneg = math.isfinite(value) and value > 0, value >= 0
        elif n.op == "size":
            positive = nonneg = True
        elif n.op in VIEWS:
            positive, nonneg = ids[0] in out, ids[0] in nonnegative
        elif n.op == "add":
            positive = all(i in nonnegative for i in ids) and any(i in out for i in ids)
            nonneg = all(i in nonnegative for i in ids)
        elif n.op == "mul":
            positive, nonneg = all(i in out for i in ids), all(i in nonnegative for i in ids)
        elif n.op == "div":  # a large divisor makes a quotient tiny: >= 0, not floored
            positive, nonneg = False, ids[0] in nonnegative and ids[1] in out
        elif n.op == "reduce":  # a max over an empty axis is -inf
            positive, nonneg = False, n.attrs["op"] == "sum" and ids[0] in nonnegative
        else:
            positive, nonneg = False, n.op in NONNEGATIVE
        if nonneg or positive:
            nonnegative.add(n.id)
        if positive:
            out.add(n.id)
    return out


# Views of a value: non-zero where it is (a cast may round a tiny value to 0: not one).
VIEWS = frozenset({"broadcast", "reshape", "permute", "slice", "squeeze", "unsqueeze"})


def nonzero_nodes(graph: Graph) -> set[int]:
    """Ids of the live nodes that are never 0 nor infinite wherever the inputs are
    finite: the facts behind `nonzero(c)`, which the rules that move or cancel a
    divisor need. Proofs hold where divisors are non-zero; an input may hold 0 (eager's
    (x / 0).sum() is NaN where sum(x) / 0 is inf), so only these qualify: a finite
    non-zero constant, a size (an empty axis runs the graph as written), a softmax's
    denominator sum_a exp(x - max_a x) (at least 1: its max term is exp(0)), and views
    of them."""
    finite = finite_nodes(graph)
    out: set[int] = set()
    for n in graph.live_nodes():
        if n.op == "const":
            ok = math.isfinite(float(n.attrs["value"])) and float(n.attrs["value"]) != 0
        elif n.op == "size":
            ok = True
        elif n.op in VIEWS:
            ok = n.inputs[0].id in out
        else:
            ok = _softmax_denominator(n, finite)
        if ok:
            out.add(n.id)
    return out


def _through_views(n):
    while n.op in VIEWS:
        n = n.inputs[0]
    return n


def _softmax_denominator(n, finite: set[int]) -> bool:
    """n = sum_a exp(x - max_a x) over one axis a, x finite where the inputs are."""
    if n.op != "reduce" or n.attrs["op"] != "sum":
        return False
    e = _through_views(n.inputs[0])
    if e.op != "exp":
        return False
    d = _through_views(e.inputs[0])
    if d.op != "sub":
        return False
    x, m = d.inputs[0], _through_views(d.inputs[1])
    return m.op == "reduce" and m.attrs["op"] == "max" and m.attrs["axis"] == n.attrs["axis"] and \
        _through_views(m.inputs[0]) is _through_views(x) and x.id in finite
