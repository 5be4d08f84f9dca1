"""Values with no elements, folded to a broadcast constant.

A value whose static shape has an extent 0 (a batch of nothing traced static) holds
nothing, so what computes it does not matter; left as traced, it can still defeat the
scheduler, which maps tile labels through each reshape of it (einsum's
`[0, 7, 1] -> [1, 0, 7]` has no such map: "no tiling fits"). Folded, its consumers read
a constant: a reduction over its empty axis still gives that reduction's empty value.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Graph, Node, rebuild
from ..ir.graph import rewritten
from ..ir.dtypes import DType

KEPT = frozenset({"input", "const", "broadcast"})


def fold_empty_values(graph: Graph) -> Graph:
    """The graph with every computed value of no elements a broadcast constant; the
    graph itself when it has none."""
    if not any(_folds(n) for n in graph.live_nodes()):
        return graph
    out = rewritten(graph, _as_constant)
    for c in graph.constraints:  # a folded node's own (a reshape's) stay, as the graph's
        out._constrain(replace(c, node=None))
    return rebuild(out)


def _as_constant(n: Node, out: Graph, args: list) -> Node | None:
    if not _folds(n):
        return None
    zero = out.add("const", value=False if n.dtype == DType.bool else 0, dtype=n.dtype, loc=n.loc)
    return out.add("broadcast", zero, shape=n.shape, loc=n.loc)


def _folds(n: Node) -> bool:
    return n.op not in KEPT and any(d == 0 for d in n.shape)
