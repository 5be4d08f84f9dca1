"""Carry a MatMul's result in its own layout through the elementwise ops and reductions
that follow it, so that the next MatMul's re-merge cancels the un-merge.

`einsum("rkgd,nkd->rkgn")` lowers to a MatMul over merged axes, [k, r*g, n], then a
reshape and a permute back to the user's [r, k, g, n]. When the softmax that follows
feeds `einsum("rkgn,nkd->rkgd")`, that one permutes and reshapes its operand into
[k, r*g, n] again. The search's rules match MatMul -> softmax -> MatMul chains
positionally (split-KV's rescaled P·V among them), and layout ops are opaque to them.
So the ops between are computed in the MatMul's layout instead: an operand entering
that region is permuted and reshaped to it (broadcast where a merged axis needs it, as
a mask [r, 1, 1, n] must be over g), and a reduction runs along the same axis of the
MatMul's layout. Where a value leaves the region, its layout ops are applied again.

Only the MatMul results whose layout ops cancel somewhere are carried; a graph without
such a chain is returned as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import sympy

from ..ir import Graph, Node, rebuild
from ..ir import dims as D
from ..ir.ops import BINARY, COMPARE, UNARY

_ELEMENTWISE = frozenset(UNARY + BINARY + COMPARE + ("where", "cast"))


@dataclass(frozen=True)
class _View:
    """A value as a view of a base value: each base axis and each view axis is the
    row-major merge of a group of atoms (an empty group is an axis of extent 1); an
    atom of extent 1 is in no group."""
    sizes: tuple  # atom extents, by atom id
    base: tuple  # per base axis, its atom ids
    view: tuple  # per view axis, its atom ids

    @staticmethod
    def identity(shape) -> "_View":
        groups = tuple(() if D.is_one(d) else (i,) for i, d in enumerate(shape))
        return _View(tuple(shape), groups, groups)

    def shape(self, groups) -> tuple:
        return tuple(sympy.Mul(*(self.sizes[a] for a in g)) if g else D.dim(1) for g in groups)

    def is_identity(self) -> bool:
        return self.base == self.view

    def permuted(self, perm) -> "_View":
        return replace(self, view=tuple(self.view[p] for p in perm))

    def reshaped(self, shape) -> "_View | None":
        """The view reshaped to `shape` (atoms split where a new axis boundary falls
        inside one), or None when that takes more than splitting atoms."""
        view = self
        order = [a for g in self.view for a in g]
        groups, at = [], 0
        for extent in shape:
            group, prod = [], D.dim(1)
            while not D.equal(prod, extent):
                if at == len(order):
                    return None
                atom = order[at]
                ratio = sympy.simplify(extent / (prod * view.sizes[atom]))
                if ratio.is_integer:
                    group.append(atom)
                    prod, at = prod * view.sizes[atom], at + 1
                    continue
                head = sympy.simplify(extent / prod)  # split the atom: its major part closes the axis
                tail = sympy.simplify(view.sizes[atom] / head)
                if not (head.is_integer and tail.is_integer):
                    return None
                view, (major, minor) = view._split(atom, head, tail)
                order[at:at + 1] = [major, minor]
                group.append(major)
                prod, at = extent, at + 1
            groups.append(tuple(group))
        if at != len(order):
            return None
        return replace(view, view=tuple(groups))

    def _split(self, atom: int, head, tail) -> tuple["_View", tuple[int, int]]:
        major, minor = len(self.sizes), len(self.sizes) + 1
        sizes = self.sizes + (head, tail)

        def split(groups):
            return tuple(tuple(x for a in g for x in ((major, minor) if a == atom else (a,))) for g in groups)
        return _View(sizes, split(self.base), split(self.view)), (major, minor)

    def reduced(self, axis: int, keepdim: bool) -> "tuple[_View, int] | None":
        """(the view of a reduction along view axis `axis`, the base axis it reduces), or
        None when that axis is not one atom that is a base axis of its own."""
        group = self.view[axis]
        if len(group) != 1 or group not in self.base:
            return None
        base_axis = self.base.index(group)
        if keepdim:
            return _View(self.sizes, tuple(() if g == group else g for g in self.base),
                         tuple(() if g == group else g for g in self.view)), base_axis
        return _View(self.sizes, tuple(g for g in self.base if g != group),
                     tuple(g for g in self.view if g != group)), base_axis

    def covers(self, part: "_View") -> bool:
        """`part` is this view with some atoms that are axes of their own, in the base and
        in the view alike, taken out: a value of it broadcasts against one of this."""
        if len(self.base) != len(part.base) or len(self.view) != len(part.view):
            return False
        same: dict[int, int | None] = {}
        for mine, theirs in zip(self.base, part.base):
            if len(mine) == len(theirs):
                if not all(D.equal(self.sizes[a], part.sizes[b]) for a, b in zip(mine, theirs)):
                    return False
                same.update(zip(mine, theirs))
            elif len(mine) == 1 and not theirs:
                same[mine[0]] = None
            else:
                return False
        for mine, theirs in zip(self.view, part.view):
            kept = tuple(same[a] for a in mine if same[a] is not None)
            if kept != theirs or (len(kept) != len(mine) and len(mine) != 1):
                return False
        return True


@dataclass(frozen=True)
class _Carried:
    """A value held as `view` of the node `base` of the new graph; `seeds` are the
    MatMul results whose layout it carries."""
    base: Node
    view: _View
    seeds: frozenset


def sink_layouts(graph: Graph) -> Graph:
    """The graph with MatMul results carried in their own layout where their layout ops
    cancel (see the module doc); the graph itself when none do."""
    first = _Sinker(graph, None)
    first.run()
    if not first.cancelled:
        return graph
    # a seed joined in one value with a seed that cancels is carried too
    seeds = set(first.cancelled)
    while grown := {s for joined in first.joined if joined & seeds for s in joined} - seeds:
        seeds |= grown
    return rebuild(_Sinker(graph, frozenset(seeds)).run())


class _Sinker:
    def __init__(self, graph: Graph, seeds: frozenset | None):
        self.graph, self.allowed = graph, seeds  # None: every MatMul result may seed
        self.out = Graph(graph.name)
        self.plain: dict[int, Node] = {}
        self.carried: dict[int, _Carried] = {}
        self.cancelled: set[int] = set()
        self.joined: list[frozenset] = []  # the seeds of each value computed from several

    def run(self) -> Graph:
        src, out = self.graph, self.out
        for c in src.constraints:
            out._constrain(c)
        for n in src.inputs.values():
            self.plain[n.id] = out.input(n.attrs["name"], n.attrs["shape"], n.attrs["dtype"])
        for n in src.live_nodes():
            if n.op != "input":
                self.visit(n)
        out.output(*(self.as_plain(o) for o in src.outputs), names=src.output_names)
        return out

    def visit(self, n: Node) -> None:
        carried = self.carry(n)
        if carried is None:
            self.plain[n.id] = self.out.add(n.op, *(self.as_plain(x) for x in n.inputs), loc=n.loc, **n.attrs)
        elif carried.view.is_identity():
            self.cancelled |= carried.seeds
            self.plain[n.id] = carried.base
        else:
            self.carried[n.id] = carried

    def carry(self, n: Node) -> _Carried | None:
        """n computed in a carried layout, or None when it is computed plainly."""
        if n.op in ("reshape", "permute"):
            x = n.inputs[0]
            if x.id in self.carried:
                held = self.carried[x.id]
            elif x.op == "matmul" and (self.allowed is None or x.id in self.allowed):
                held = _Carried(self.as_plain(x), _View.identity(x.shape), frozenset({x.id}))
            else:
                return None
            view = held.view.permuted(n.attrs["perm"]) if n.op == "permute" else held.view.reshaped(n.shape)
            return None if view is None else replace(held, view=view)
        if n.op == "reduce" and n.inputs[0].id in self.carried:
            held = self.carried[n.inputs[0].id]
            found = held.view.reduced(n.attrs["axis"], bool(n.attrs["keepdim"]))
            if found is None:
                return None
            view, axis = found
            base = self.out.add("reduce", held.base, loc=n.loc, **{**n.attrs, "axis": axis})
            return _Carried(base, view, held.seeds)
        if n.op in _ELEMENTWISE:
            return self.elementwise(n)
        return None

    def elementwise(self, n: Node) -> _Carried | None:
        held = [self.carried[x.id] for x in n.inputs if x.id in self.carried]
        full = next((h for h in held if _same(h.view.shape(h.view.view), n.shape)), None)
        if full is None or not all(full.view.covers(h.view) for h in held):
            return None
        operands = []
        for x in n.inputs:
            operand = self.carried[x.id].base if x.id in self.carried else self.entering(x, full.view, n.loc)
            if operand is None:
                return None
            operands.append(operand)
        base = self.out.add(n.op, *operands, loc=n.loc, **n.attrs)
        seeds = frozenset().union(*(h.seeds for h in held))
        if len(seeds) > 1:
            self.joined.append(seeds)
        return _Carried(base, full.view, seeds)

    def entering(self, x: Node, view: _View, loc) -> Node | None:
        """x, which broadcasts against a value of `view`, in the view's base layout: each
        view axis x spans is split into its atoms, the atoms permuted into base order,
        a base axis x spans in part broadcast over the rest, then merged."""
        if x.rank == 0:
            return self.as_plain(x)
        if x.rank > len(view.view):
            return None
        shape = (D.dim(1),) * (len(view.view) - x.rank) + tuple(x.shape)
        spans = set()
        for extent, group in zip(shape, view.view):
            if group and _same((extent,), view.shape((group,))):
                spans.update(group)
            elif not D.is_one(extent):
                return None
        order = [a for g in view.view for a in g]
        base_order = [a for g in view.base for a in g]
        one = D.dim(1)
        node = self.as_plain(x)
        node = self.add_shaped("reshape", node, tuple(view.sizes[a] if a in spans else one for a in order), loc)
        if order != base_order:
            node = self.out.add("permute", node, perm=[order.index(a) for a in base_order], loc=loc)
        wide = tuple(view.sizes[a] if a in spans or any(b in spans for b in g) else one
                     for g in view.base for a in g)
        node = self.add_shaped("broadcast", node, wide, loc)
        merged = tuple(sympy.Mul(*(view.sizes[a] for a in g)) if any(a in spans for a in g) else one
                       for g in view.base)
        return self.add_shaped("reshape", node, merged, loc)

    def add_shaped(self, op: str, node: Node, shape: tuple, loc) -> Node:
        return node if _same(node.shape, shape) else self.out.add(op, node, shape=shape, loc=loc)

    def as_plain(self, x: Node) -> Node:
        """x in its own layout: a carried value gets its layout ops back."""
        if x.id in self.plain:
            return self.plain[x.id]
        held = self.carried[x.id]
        view, loc = held.view, x.loc
        base_order = [a for g in view.base for a in g]
        order = [a for g in view.view for a in g]
        node = self.add_shaped("reshape", held.base, tuple(view.sizes[a] for a in base_order), loc)
        if order != base_order:
            node = self.out.add("permute", node, perm=[base_order.index(a) for a in order], loc=loc)
        self.plain[x.id] = self.add_shaped("reshape", node, tuple(x.shape), loc)
        return self.plain[x.id]


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(D.equal(x, y) for x, y in zip(a, b))


__all__ = ["sink_layouts"]
