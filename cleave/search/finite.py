"""Which nodes of a graph hold only finite values: the facts behind `finite(x)`.

The provers reason over finite reals, and so do rules that distribute a product over
a sum: with an infinity in X, sum_n (X W) can be inf - inf = NaN where X (W 1) is
inf. The masked numeric gate feeds such rules -inf, as a mask fill leaves it, so a
rule that needs finite operands says so. A node is finite when the program's inputs
are (the provers' assumption) and every op on the way keeps finite values finite:
a -inf fill, a division, a log or an exp that may overflow ends it.
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
    """Ids of the live nodes that hold finite values whenever the inputs do."""
    out: set[int] = set()
    for n in graph.live_nodes():
        if n.op in ("input", "size", "iota"):
            ok = True
        elif n.op == "const":
            ok = math.isfinite(float(n.attrs["value"]))
        elif n.op == "reduce":
            ok = n.attrs["op"] == "sum"
        elif n.op == "split":
            ok = math.isfinite(n.attrs["pad"])
        else:
            ok = n.op in KEEPS_FINITE
        if ok and all(x.id in out for x in n.inputs):
            out.add(n.id)
    return out
