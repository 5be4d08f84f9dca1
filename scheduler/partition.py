"""Kernel boundaries. Outputs that share a grid dim start in one kernel; a Split whose
count is bound above 1 is there to be run in parallel, so every per-chunk reduction
(one whose value still varies over the chunk-count label) is materialised by a
producer kernel whose grid includes that label, and the consumer (the combine) reads
it back."""
from __future__ import annotations

import re
from dataclasses import dataclass

import sympy

from cleave.ir import Graph, Node
from cleave.ir import dims as D

from .views import Instance, Views, forward_view, store_chain


@dataclass
class Store:
    inst: Instance  # the value computed
    buffer: str  # where it goes
    view: tuple  # index of the buffer's dims
    node: Node  # the node whose value the buffer holds (its shape and dtype)


@dataclass
class KernelSpec:
    name: str
    views: Views
    stores: list[Store]
    root_labels: list  # Label, the grid's labels in order of the output dims


def buffer_name(graph: Graph, node: Node) -> str:
    if node.op == "input":
        return node.attrs["name"]
    for name, out in zip(graph.output_names, graph.outputs):
        if out is node:
            return name
    return f"t{node.id}"


def identifier(name: str) -> str:
    """A graph's name as the stem of its kernels' names, which must be Python identifiers:
    the words of `<lambda>`, `functools.partial(...)` or `my-fn.v2` joined by `_`, no
    leading digit (the `_k0` that follows keeps a keyword such as `if` from being one)."""
    stem = "_".join(re.findall(r"\w+", name, flags=re.ASCII)) or "kernel"
    return f"fn_{stem}" if stem[0].isdigit() else stem


def _stored(graph: Graph, out: Node, buffer: str) -> tuple[Node, list[Node], list]:
    """The node a root's kernel computes, the chain its store peels, and a key per dim of
    that node (None for a unit dim): dims of equal key across roots share a grid label."""
    # an output buffer holds the node's own dtype (an intermediate holds f32)
    inner, chain = store_chain(out, out.dtype if buffer in graph.output_names else None)
    keys, seen = [], {}
    for d in inner.shape:
        if D.is_one(d):
            keys.append(None)
            continue
        # dims of equal extent across roots share a label (roots may order them differently)
        seen[d] = seen.get(d, -1) + 1
        keys.append((d, seen[d]))
    return inner, chain, keys


def _build(graph: Graph, roots: list[tuple[Node, str]], leaves: set) -> KernelSpec:
    """One kernel storing each root node into its buffer."""
    views = Views(graph, set(leaves))
    by_pos: dict = {}
    stores, root_labels = [], []
    for out, buffer in roots:
        inner, chain, keys = _stored(graph, out, buffer)
        view = []
        for key in keys:
            if key is None:
                view.append(sympy.Integer(0))
                continue
            if key not in by_pos:
                by_pos[key] = views.label(key[0], "out")
                root_labels.append(by_pos[key])
            view.append(by_pos[key].sym)
        inst = views.get(inner, tuple(view))
        stores.append(Store(inst, buffer, forward_view(chain, tuple(view)), out))
    views.roots = [s.inst for s in stores]
    return KernelSpec(graph.name, views, stores, root_labels)


def _split_labels(views: Views, env: dict) -> set:
    """Labels that index the chunk-count axis of a Split bound above 1."""
    out = set()
    table = views.by_sym()
    for inst in views.memo.values():
        if inst.op == "split":
            e = sympy.sympify(inst.view[inst.node.attrs["axis"]])
            if e in table and D.evaluate(inst.node.attrs["count"], env) > 1:
                out.add(table[e].id)
    return out


def _per_chunk(views: Views, chunk_labels: set) -> list[Node]:
    """The outermost reductions whose value still varies over a chunk-count label."""
    found, seen = {}, set()
    stack = list(views.roots)
    while stack:
        inst = stack.pop()
        if id(inst) in seen:
            continue
        seen.add(id(inst))
        if inst.reduced is not None and inst.labels & chunk_labels and not inst.leaf:
            found[inst.node.id] = inst.node
            continue
        stack.extend(inst.inputs)
    return [found[k] for k in sorted(found)]


def partition(graph: Graph, env: dict) -> list[KernelSpec]:
    """Kernels in launch order (producers first)."""
    kernels: list[KernelSpec] = []

    def visit(roots, leaves):
        spec = _build(graph, roots, leaves)
        # a chunk label that is a grid label here already runs in parallel
        chunk = _split_labels(spec.views, env) - {lab.id for lab in spec.root_labels}
        produced = _per_chunk(spec.views, chunk) if chunk else []
        if produced:
            visit([(n, buffer_name(graph, n)) for n in produced], leaves)
            spec = _build(graph, roots, leaves | {n.id for n in produced})
        spec.name = f"{identifier(graph.name)}_k{len(kernels)}"
        kernels.append(spec)

    # Outputs by name: one node may be returned under several names, or be an input.
    for roots in _grid_groups(graph, list(zip(graph.outputs, graph.output_names))):
        visit(roots, set())
    return kernels


def _grid_groups(graph: Graph, roots: list) -> list[list]:
    """Roots that share a grid dim, transitively, in root order: one kernel each. A
    kernel's grid is the product of its roots' dims and each root is stored by every
    program, so roots over unrelated dims (a (10n,) and an (n, 5)) would multiply each
    other's programs (50n^3 of them). Roots without a grid dim share the one program."""
    groups: list[tuple[set, list]] = []  # (dim keys, root indices)
    for i, (out, buffer) in enumerate(roots):
        keys = {k for k in _stored(graph, out, buffer)[2] if k is not None} or {()}
        joined = [g for g in groups if g[0] & keys]
        groups = [g for g in groups if not g[0] & keys]
        groups.append((keys.union(*(g[0] for g in joined)), sorted([i] + [j for g in joined for j in g[1]])))
    return [[roots[j] for j in g[1]] for g in sorted(groups, key=lambda g: g[1][0])]
