"""Fold the boolean detours that captured masks take back into one compare.

`torch.ones(s, s, dtype=bool).tril()` captures as `where(j <= i, true, false)`, and
`masked_fill(~mask, -inf)` as `where(eq(mask, false), -inf, x)`. Both are the plain
`where(j <= i, x, -inf)` the hand-written graphs use, and only that form lets the
scheduler see the compare between indices and skip the masked tiles (bounds.py):
left as captured, a causal kernel walks every kv tile of every row.

    where(c, true, false)          ->  c            (c boolean, of the result's shape)
    where(eq(m, false), a, b)      ->  where(m, b, a)  (m boolean; also eq(false, m))
"""
from __future__ import annotations

from ..ir import Graph, Node, rebuild
from ..ir.graph import rewritten
from ..ir import dims as D
from ..ir.dtypes import DType


def simplify_masks(graph: Graph) -> Graph:
    """The graph with those patterns folded; the graph itself when it has none."""
    if not any(_fold(n, list(n.inputs)) for n in graph.live_nodes() if n.op == "where"):
        return graph
    out = rewritten(graph, _folded)
    for c in graph.constraints:
        out._constrain(c)
    return rebuild(out)


def _folded(n: Node, out: Graph, args: list) -> Node | None:
    folded = _fold(n, args) if n.op == "where" else None
    if folded is None or isinstance(folded, Node):
        return folded
    cond, a, b = folded  # a swapped where
    return out.add("where", cond, a, b, loc=n.loc)


def _fold(n: Node, args: list):
    """A node that replaces `where` n (given its mapped operands), the operands of a
    swapped `where`, or None."""
    cond, a, b = args
    if (n.dtype == DType.bool and _is_const(a, True) and _is_const(b, False) and cond.dtype == DType.bool
            and _same(cond.shape, n.shape)):
        return cond
    if cond.op == "eq":
        x, y = cond.inputs
        m = x if _is_const(y, False) else y if _is_const(x, False) else None
        if m is not None and m.dtype == DType.bool and _same(m.shape, cond.shape):
            return (m, b, a)
    return None


def _is_const(node: Node, value: bool) -> bool:
    while node.op == "broadcast":
        node = node.inputs[0]
    return node.op == "const" and node.dtype == DType.bool and bool(node.attrs["value"]) == value


def _same(s1, s2) -> bool:
    return len(s1) == len(s2) and all(D.equal(a, b) for a, b in zip(s1, s2))
