"""Regroup matmuls against repeated K/V heads (GQA/MQA) into one matmul per kv head.

`k.repeat_interleave(g, dim=1)` (or `k[:, :, None].expand(...).reshape(...)`) captures
as reshape -> broadcast -> reshape, so every query head re-reads its kv head. With
R = repeat(X), X: [..., H, L, D] and A: [..., H*G, M, D],

    A @ R^T  ==  reshape(reshape(A, [..., H, G*M, D]) @ X^T, [..., H*G, M, L])

(row-major: head h*G+j of R is head h of X), and likewise P @ R. The grouped result is
carried forward through the ops that commute with a change of the leading axes
(elementwise ops, last-axis keepdim reductions, the next `@ repeat(V)`), so the softmax
between the two matmuls stays in one layout: the search's rules match matmul ->
softmax chains positionally and the scheduler fuses a chain only in one layout. One
reshape back is left where a value leaves that region.

Rows merge as G*M unless an operand entering the region varies along M (a causal mask
[M, L]): a merged row axis cannot broadcast it, so that region keeps G and M apart,
[..., H, G, M, X], and the matmuls broadcast X over G.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Graph, Node, rebuild
from ..ir import dims as D
from ..ir.ops import BINARY, COMPARE, UNARY

_ELEMENTWISE = frozenset(BINARY + COMPARE + ("where",))


@dataclass(frozen=True)
class _Group:
    """A grouped region's layout: original values are [*prefix, heads*groups, rows, x]."""
    prefix: tuple
    heads: D.Dim
    groups: D.Dim
    rows: D.Dim

    def shape(self, shape: tuple, split: bool) -> tuple:
        rows = (self.groups, self.rows) if split else (self.groups * self.rows,)
        return tuple(self.prefix) + (self.heads,) + rows + tuple(shape[-1:])

    def covers(self, shape: tuple) -> bool:
        return _same(shape[:-1], tuple(self.prefix) + (self.heads * self.groups, self.rows))


@dataclass(frozen=True)
class _Repeat:
    """R = X repeated `groups` times in place along the head axis (third from last)."""
    source: Node  # X, or X with a unit axis after the heads
    squeezed: tuple  # X's shape [..., H, L, D]
    heads: D.Dim
    groups: D.Dim


def regroup_repeated_operands(graph: Graph) -> Graph:
    """The graph with matmuls against repeated K/V heads regrouped (see the module doc);
    the graph itself when it has none. Name, inputs and outputs are unchanged."""
    live = graph.live_nodes()
    seeds = {n.id: s for n in live if n.op == "matmul" and (s := _seed(n)) is not None}
    if not seeds:
        return graph
    groups, split_rows = _regions(live, seeds)
    return _emit(graph, live, seeds, groups, split_rows)


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(D.equal(x, y) for x, y in zip(a, b))


def _swap_last(rank: int) -> tuple:
    return tuple(range(rank - 2)) + (rank - 1, rank - 2)


def _repeat(node: Node) -> _Repeat | None:
    """Match reshape(broadcast(X: [..., H, 1, L, D] -> [..., H, G, L, D]) -> [..., H*G, L, D])
    (repeat_interleave, expand + reshape), or broadcast(X: [..., 1, L, D] -> [..., G, L, D])
    (MQA by expand)."""
    n = node.rank
    if n < 3:
        return None
    if node.op == "reshape" and node.inputs[0].op == "broadcast":
        wide = node.inputs[0]
        base = wide.inputs[0]
        if wide.rank != n + 1 or base.rank != n + 1 or not D.is_one(base.shape[n - 2]):
            return None
        heads, groups = wide.shape[n - 3], wide.shape[n - 2]
        squeezed = base.shape[:n - 2] + base.shape[n - 1:]
        if not (_same(base.shape[:n - 2], wide.shape[:n - 2]) and _same(base.shape[n - 1:], wide.shape[n - 1:])
                and _same(node.shape, squeezed[:n - 3] + (heads * groups,) + squeezed[n - 2:])):
            return None
        source = base.inputs[0] if base.op == "reshape" and _same(base.inputs[0].shape, squeezed) else base
        return _Repeat(source, squeezed, heads, groups)
    if node.op == "broadcast":
        base = node.inputs[0]
        kept = [i for i in range(n) if i != n - 3]
        if base.rank != n or not D.is_one(base.shape[n - 3]) or D.is_one(node.shape[n - 3]):
            return None
        if not _same(tuple(base.shape[i] for i in kept), tuple(node.shape[i] for i in kept)):
            return None
        return _Repeat(base, base.shape, D.dim(1), node.shape[n - 3])
    return None


@dataclass(frozen=True)
class _Seed:
    repeat: _Repeat
    transposed: bool  # A @ R^T (scores) rather than P @ R (values)
    group: _Group


def _seed(node: Node) -> _Seed | None:
    """A matmul whose right operand is a repeat (or its transpose), batched like its left."""
    a, b = node.inputs
    transposed = b.op == "permute" and b.attrs["perm"] == _swap_last(b.rank)
    r = b.inputs[0] if transposed else b
    rep = _repeat(r)
    if rep is None or a.rank != r.rank or not _same(a.shape[:-2], r.shape[:-2]):
        return None
    return _Seed(rep, transposed, _Group(rep.squeezed[:-3], rep.heads, rep.groups, a.shape[-2]))


def _regions(live, seeds) -> tuple[dict[int, _Group], set[_Group]]:
    """Which nodes compute in a grouped layout (node id -> group), and the groups whose
    rows must stay split because an operand entering them varies along the rows."""
    groups: dict[int, _Group] = {}
    split_rows: set[_Group] = set()
    for n in live:
        if n.id in seeds:
            groups[n.id] = seeds[n.id].group
        elif n.op in UNARY or n.op == "cast":
            if n.inputs[0].id in groups:
                groups[n.id] = groups[n.inputs[0].id]
        elif n.op == "reduce":
            if n.inputs[0].id in groups and n.attrs["axis"] == n.rank - 1 and n.attrs["keepdim"]:
                groups[n.id] = groups[n.inputs[0].id]
        elif n.op in _ELEMENTWISE:
            found = {groups[x.id] for x in n.inputs if x.id in groups}
            if len(found) != 1:
                continue
            group = found.pop()
            others = [x for x in n.inputs if x.id not in groups]
            if not group.covers(n.shape) or not all(_enters(x, n.rank) for x in others):
                continue
            groups[n.id] = group
            if any(x.rank >= 2 and not D.is_one(x.shape[-2]) for x in others):
                split_rows.add(group)
    return groups, split_rows


def _enters(x: Node, rank: int) -> bool:
    """An operand from outside a region broadcasts into it when it is constant over the
    heads (the rows and the last axis it may vary along; the batch axes stay in place)."""
    return x.rank <= rank and (x.rank < 3 or D.is_one(x.shape[-3]))


def _emit(graph: Graph, live, seeds, groups, split_rows) -> Graph:
    out = Graph(graph.name)
    for c in graph.constraints:
        out._constrain(c)
    plain: dict[int, Node] = {}
    grouped: dict[int, Node] = {}
    for n in graph.inputs.values():
        plain[n.id] = out.input(n.attrs["name"], n.attrs["shape"], n.attrs["dtype"])

    def as_plain(x: Node) -> Node:
        if x.id not in plain:  # a grouped value leaving its region
            plain[x.id] = out.add("reshape", grouped[x.id], shape=x.shape, loc=x.loc)
        return plain[x.id]

    def as_grouped(x: Node, group: _Group, loc) -> Node:
        if groups.get(x.id) == group:
            return grouped[x.id]
        return out.add("reshape", as_plain(x), shape=group.shape(x.shape, group in split_rows), loc=x.loc or loc)

    def entering(x: Node, is_split: bool, loc) -> Node:
        """An outside operand, aligned with the grouped axes: a unit axis for the groups."""
        if not is_split or x.rank < 3:
            return as_plain(x)
        return out.add("reshape", as_plain(x), shape=x.shape[:-2] + (D.dim(1),) + x.shape[-2:], loc=loc)

    def shaped(x: Node, shape: tuple, loc) -> Node:
        return x if _same(x.shape, shape) else out.add("reshape", x, shape=shape, loc=loc)

    for n in live:
        if n.op == "input":
            continue
        group = groups.get(n.id)
        if group is None:
            plain[n.id] = out.add(n.op, *(as_plain(x) for x in n.inputs), loc=n.loc, **n.attrs)
            continue
        is_split = group in split_rows
        if n.id in seeds:
            rep = seeds[n.id].repeat
            x = rep.squeezed  # split rows: X gets a unit axis the matmul broadcasts over the groups
            rhs = shaped(as_plain(rep.source), x[:-2] + (D.dim(1),) + x[-2:] if is_split else x, n.loc)
            if seeds[n.id].transposed:
                rhs = out.add("permute", rhs, perm=_swap_last(rhs.rank), loc=n.loc)
            grouped[n.id] = out.add("matmul", as_grouped(n.inputs[0], group, n.loc), rhs, loc=n.loc)
        elif n.op == "reduce":
            rank = len(group.shape(n.shape, is_split))
            grouped[n.id] = out.add("reduce", grouped[n.inputs[0].id], loc=n.loc, **{**n.attrs, "axis": rank - 1})
        else:
            operands = [grouped[x.id] if groups.get(x.id) == group else entering(x, is_split, n.loc)
                        for x in n.inputs]
            grouped[n.id] = out.add(n.op, *operands, loc=n.loc, **n.attrs)
    out.output(*(as_plain(o) for o in graph.outputs), names=graph.output_names)
    return rebuild(out)
