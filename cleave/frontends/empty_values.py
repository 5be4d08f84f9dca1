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
from ..ir.dtypes import DType

KEPT = frozenset({"input", "const", "broadcast"})


def fold_empty_values(graph: Graph) -> Graph:
    """The graph with every computed value of no elements a broadcast constant; the
    graph itself when it has none."""
    if not any(_folds(n) for n in graph.live_nodes()):
        return graph
    out = Graph(graph.name)
    mapping: dict[int, Node] = {}
    for n in graph.inputs.values():
        mapping[n.id] = out.input(n.attrs["name"], n.attrs["shape"], n.attrs["dtype"])
    for n in graph.live_nodes():
        if n.op == "input":
            continue
        if _folds(n):
            zero = out.add("const", value=False if n.dtype == DType.bool else 0, dtype=n.dtype, loc=n.loc)
            mapping[n.id] = out.add("broadcast", zero, shape=n.shape, loc=n.loc)
        else:
            mapping[n.id] = out.add(n.op, *(mapping[x.id] for x in n.inputs), loc=n.loc, **n.attrs)
    out.output(*(mapping[o.id] for o in graph.outputs), names=graph.output_names)
    for c in graph.constraints:  # a folded node's own (a reshape's) stay, as the graph's
        out._constrain(replace(c, node=None))
    return rebuild(out)


def _folds(n: Node) -> bool:
    return n.op not in KEPT and any(d == 0 for d in n.shape)
