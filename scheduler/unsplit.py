"""A split at count 1 as the reshape it is. Scheduled as written, its chunk axis of
extent 1 still indexes the split operand (`0 * cdiv(k, s_k) + k_offset`), which keeps
the operand tiles off TMA and the kernels unspecialised: matmul's split-K candidate at
s_k = 1, ranked first by the search, ran at 0.35x cuBLAS on the H200 where the same
GEMM with TMA descriptors runs at 1.0x (RESULTS.md, session 28)."""
from __future__ import annotations

import sympy

from cleave.ir import Graph
from cleave.ir import dims as D


def unsplit(graph: Graph, counts: dict[str, int]) -> Graph | None:
    """`graph` with every split whose count is a symbol bound to 1 in `counts` replaced
    by a reshape inserting the axis of extent 1, and that symbol replaced by 1 wherever
    a dim holds it; node for node, so node ids (and the facts that name them) stay. None
    where nothing changes or the ids would not."""
    ones = {D.symbol(s): 1 for s, v in counts.items() if v == 1}
    if not ones or not any(n.op == "split" and D.dim(n.attrs["count"]).free_symbols & set(ones) for n in graph.nodes):
        return None
    out = Graph(graph.name)
    made = {}
    for n in graph.nodes:
        args = [made[x.id] for x in n.inputs]
        if n.op == "input":
            made[n.id] = out.input(n.attrs["name"], [_one(d, ones) for d in n.shape], n.dtype)
        elif n.op == "split" and D.dim(n.attrs["count"]).free_symbols & set(ones):
            made[n.id] = out.add("reshape", *args, shape=tuple(_one(d, ones) for d in n.shape))
        else:
            made[n.id] = out.add(n.op, *args, **{k: _substituted(v, ones) for k, v in n.attrs.items()})
        if made[n.id].id != n.id:
            return None
    out.output(*(made[o.id] for o in graph.outputs), names=graph.output_names)
    return out


def _one(d, ones) -> sympy.Expr:
    return D.dim(sympy.sympify(d).xreplace(ones))


def _substituted(value, ones):
    if isinstance(value, sympy.Basic):
        return D.dim(value.xreplace(ones)) if value.free_symbols else value
    if isinstance(value, tuple):
        return tuple(_substituted(v, ones) for v in value)
    return value
