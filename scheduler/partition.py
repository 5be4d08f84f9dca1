"""Kernel boundaries: which nodes a kernel computes, which it reads from memory.

Outputs over one grid (one's dims within the other's) start in one kernel. A Split
whose count is bound above 1 is there to be run in parallel, so every per-chunk
reduction (one whose value still varies over the chunk-count label) is materialised by
a producer kernel whose grid includes that label, and the consumer (the combine) reads
it back.

A kernel is cut, and the graph partitioned again with the cut nodes materialised by
producer kernels of their own (read by every kernel that needs them), at the first of
these that applies. Before any tiling is tried:
- at the MatMul operands it computes that cost more to recompute per program along
  the other side than a round trip through memory (`recompute`): normalised rows
  before a projection, rotated keys before attention, silu(gate)·up before the down
  projection, attention's normalised output before the output projection. The
  producer computes them in its epilogue;
- at its nested reductions: a reduction over a long axis (a MatMul's K of 4096, a
  softmax's row of keys) whose value varies over the axis another one reduces (the
  output projection feeding the next norm's row statistic). Short reductions stay
  (the scores' head dim): fused attention keeps its scores in registers, and so do
  reductions a block may still hold whole (`hold_extent`: MLA's scores over a latent
  of 512), unless no tiling fits.
When no tiling fits (`partition`'s `tile` rejects it):
- at its nested reductions over more than `long_extent`;
- at every reduction it computes besides its roots;
- then at every node: one op per kernel, always a partition when each op tiles;
- then, where asked (`split_fusions`, once smaller tiles did not help either), a
  kernel that still stores several roots (a horizontal fusion: 32 chunks' logits,
  each holding its operands in shared memory) is split into two halves of its
  roots, until each fits or stores one root.
Cuts accumulate only as kernels need them: a kernel is re-cut after the cuts before
it took effect. Cheap prologues and epilogues (norm scales, bias, activations,
residual adds, casts) are recomputed by the kernel that reads their producer's output.
"""
from __future__ import annotations

import functools
import math
import re
import weakref
from dataclasses import dataclass

import sympy

from cleave.ir import BindingError, Graph, Node, ShapeError
from cleave.ir.graph import fresh_name
from cleave.ir.dtypes import DType
from cleave.ir import dims as D

from .recompute import operand_cuts
from .target import H200
from .views import ELEMENTWISE, Instance, TooManyInstances, Views, forward_view, peels_cast, store_chain

# Tile instances one kernel may derive: a transformer layer's largest kernel derives
# about 2,600 (Qwen3-32B); past this, recomputation compounds (a walk that would not end).
MAX_INSTANCES = 20_000


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
    return fresh_name(f"t{node.id}", {*graph.inputs, *graph.output_names})  # an input may be called t5


def identifier(name: str) -> str:
    """A graph's name as the stem of its kernels' names, which must be Python identifiers:
    the words of `<lambda>`, `functools.partial(...)` or `my-fn.v2` joined by `_`, no
    leading digit (the `_k0` that follows keeps a keyword such as `if` from being one)."""
    stem = "_".join(re.findall(r"\w+", name, flags=re.ASCII)) or "kernel"
    return f"fn_{stem}" if stem[0].isdigit() else stem


def stored_dtype(node: Node, chunk_symbols: set) -> DType:
    """The dtype a node's buffer holds: its own, as eager stores it, except for a
    partial result over a Split's chunk axis, which keeps f32 (as the combine would
    within one kernel), and an f16 MatMul's result that is only read widened to f32
    (SDPA's scores): a kernel reading it where it is computed keeps the f32
    accumulator, so a plan that stores it does too (in f16, scores past 65504
    overflowed to inf and the softmax gave NaN where eager's f32 scores are finite;
    bf16 has f32's range, and a layer's bf16 products stay bf16 between kernels)."""
    if node.dtype.is_float and any(d.free_symbols & chunk_symbols for d in node.shape):
        return DType.f32
    if node.dtype == DType.f16 and _a_product(node) and _read_widened(node):
        return DType.f32
    return node.dtype


_REGROUPS = ("reshape", "permute")  # views a product's result is read through (a bmm's batch split)


def _a_product(node: Node) -> bool:
    while node.op in _REGROUPS:
        node = node.inputs[0]
    return node.op == "matmul"


def _read_widened(node: Node) -> bool:
    """Whether node is no output and every node reading it casts it to f32, directly or
    through _REGROUPS."""
    graph = node.graph
    if any(o is node for o in graph.outputs):
        return False
    readers = _readers(graph).get(node.id, [])
    return bool(readers) and all(r.op == "cast" and r.dtype == DType.f32 or r.op in _REGROUPS and _read_widened(r)
                                 for r in readers)


_READERS: "weakref.WeakKeyDictionary[Graph, tuple]" = weakref.WeakKeyDictionary()


def _readers(graph: Graph) -> dict[int, list[Node]]:
    """node id -> the live nodes reading it, kept per graph while its node count holds."""
    kept = _READERS.get(graph)
    if kept is None or kept[0] != len(graph.nodes):
        readers: dict[int, list[Node]] = {}
        for n in graph.live_nodes():
            for x in dict.fromkeys(n.inputs):
                readers.setdefault(x.id, []).append(n)
        kept = _READERS[graph] = (len(graph.nodes), readers)
    return kept[1]


def _stored(graph: Graph, out: Node, buffer: str, peel: bool = True) -> tuple[Node, list[Node], list]:
    """The node a root's kernel computes, the chain its store peels, and a key per dim of
    that node (None for a unit dim): dims of equal key across roots share a grid label.
    Without `peel`, only a cast to the stored dtype peels, not the layout ops."""
    dtype = stored_dtype(out, graph.split_counts())
    if peel:
        inner, chain = store_chain(out, dtype)
    elif peels_cast(out, dtype) and out.inputs[0].op != "input":
        inner, chain = out.inputs[0], [out]
    else:
        inner, chain = out, []
    keys, seen = [], {}
    for d in inner.shape:
        if D.is_one(d):
            keys.append(None)
            continue
        # dims of equal extent across roots share a label (roots may order them differently)
        seen[d] = seen.get(d, -1) + 1
        keys.append((d, seen[d]))
    return inner, chain, keys


def _build(graph: Graph, roots: list[tuple[Node, str]], leaves: set, peel: bool = True,
           budget: int | None = None) -> KernelSpec:
    """One kernel storing each root node into its buffer."""
    views = Views(graph, set(leaves), budget=budget)
    by_pos: dict = {}
    stores, order = [], []  # order: the grid's dim keys, outer to inner
    for out, buffer in roots:
        inner, chain, keys = _stored(graph, out, buffer, peel)
        view = []
        for i, key in enumerate(keys):
            if key is None:
                view.append(sympy.Integer(0))
                continue
            if key not in by_pos:
                by_pos[key] = views.label(key[0], "out")
                # in front of the first dim inside it that an earlier root placed, so
                # the last label (the one tiled along its dim) stays an innermost dim:
                # the 2 of x.repeat(2, 3) beside x.repeat_interleave(3, 0) goes first
                after = [order.index(k) for k in keys[i + 1:] if k in order]
                order.insert(min(after, default=len(order)), key)
            view.append(by_pos[key].sym)
        inst = views.get(inner, tuple(view))
        stores.append(Store(inst, buffer, forward_view(chain, tuple(view)), out))
    views.roots = [s.inst for s in stores]
    root_labels = [by_pos[key] for key in order]
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


def partition(graph: Graph, env: dict, tile=None, long_extent: int = 256,
              dynamic=frozenset(), target=H200, hold_extent: int = 0,
              max_instances: int | None = None, split_fusions: bool = False) -> list[tuple[KernelSpec, object]]:
    """Kernels in launch order (producers first), each with what `tile(spec)` returned
    for it (None without `tile`). `tile` raises BindingError or ShapeError when no
    tiling fits; the kernel is then cut (see the module's doc) and the graph partitioned
    again. A reduction is long when its extent at env exceeds `long_extent`, or is
    dynamic: the kernels serve every length, a short first shape included. A nested
    one up to `hold_extent` is first tried whole, and cut only when no tiling fits.
    A stack of layers is first cut between them (`segment_cuts`). A kernel whose walk
    still derives more than `max_instances` (MAX_INSTANCES) instances is cut at every
    segment boundary and partitioned again (else a ShapeError says so). With
    `split_fusions`, a kernel of several roots that no cut makes fit is split into
    halves of its roots (`_halve`), a last resort: it gives up horizontal fusion."""
    max_instances = MAX_INSTANCES if max_instances is None else max_instances
    cuts: set[int] = set(segment_cuts(graph))
    apart: dict[int, tuple] = {}  # root id -> which half of each split fusion it went to
    segmented = False
    tried: dict = {}  # (roots, the leaves they read) -> tile's result: re-partitioning reuses it
    first = functools.partial(_first_cuts, env=env, long_extent=long_extent, hold_extent=max(hold_extent, long_extent),
                              dynamic=set(dynamic), target=target)
    nested = functools.partial(_nested, env=env, long_extent=long_extent, dynamic=set(dynamic))
    while True:
        try:
            return _kernels(graph, env, cuts, tile, tried, first, max_instances, apart)
        except TooManyInstances:
            more = set() if segmented else segment_cuts(graph, nested_only=False) - cuts
            if not more:
                raise ShapeError(f"scheduler: a kernel of {graph.name} derives more than {max_instances} "
                                 f"tile instances even when cut between its layers; raise "
                                 f"cleave.scheduler.partition.MAX_INSTANCES or materialise intermediate values") from None
            segmented = True
            cuts |= more
        except _Rejected as rejected:
            more = _cuts(rejected.spec, cuts, first, nested)
            if more:
                cuts |= more
            elif not (split_fusions and _halve(rejected.spec, apart)):
                raise rejected.error from None


class _Rejected(Exception):
    """A kernel to cut: no tiling fits (`error`), or it has cuts to make first (None)."""

    def __init__(self, spec, error=None):
        super().__init__(str(error))
        self.spec, self.error = spec, error


def _kernels(graph: Graph, env: dict, cuts: set[int], tile, tried: dict, first, budget: int | None = None,
             apart: dict | None = None) -> list:
    apart = {} if apart is None else apart
    kernels: list = []
    stem = identifier(graph.name)

    def visit(roots, leaves, peel=True):
        spec = _build(graph, roots, leaves, peel, budget)
        # a chunk label that is a grid label here already runs in parallel
        chunk = _split_labels(spec.views, env) - {lab.id for lab in spec.root_labels}
        produced = _per_chunk(spec.views, chunk) if chunk else []
        if produced:
            visit([(n, buffer_name(graph, n)) for n in produced], leaves)
            spec = _build(graph, roots, leaves | {n.id for n in produced}, peel, budget)
        spec.name = f"{stem}_k{len(kernels)}"
        options = None
        if tile is not None and first(spec, cuts):
            raise _Rejected(spec)
        if tile is not None:
            # the name too: the kernel's source carries it, and an earlier cut may shift it
            key = (spec.name, peel, tuple((n.id, b) for n, b in roots), frozenset(_upstream(roots, leaves)))
            if key not in tried:
                try:
                    tried[key] = (tile(spec), None)
                except (BindingError, ShapeError) as err:
                    tried[key] = (None, err)
            options, error = tried[key]
            if error is not None:
                raise _Rejected(spec, error)
        kernels.append((spec, options))

    produced_by_cut = [(graph.nodes[i], buffer_name(graph, graph.nodes[i])) for i in sorted(cuts)]
    for roots, peel in _producer_groups(graph, produced_by_cut, apart):
        visit(roots, cuts - {n.id for n, _ in roots}, peel)
    # Outputs by name: one node may be returned under several names, or be an input.
    # A cut output (a hidden state saved for the backward) its producer kernel stored.
    unstored = [root for root in zip(graph.outputs, graph.output_names) if root not in produced_by_cut]
    for roots in _grid_groups(graph, unstored, apart):
        visit(roots, cuts - {n.id for n, _ in roots})
    return kernels


def segment_cuts(graph: Graph, nested_only: bool = True) -> set[int]:
    """The values between a layer stack's segments: the residual stream. Such a value is
    read more than once, carries a projection (a MatMul by a parameter, through
    elementwise and layout ops that keep its size: the o- or down projection plus the
    stream below it), and dominates two reductions or more: every path to them from the
    outputs that read it passes through it. Outputs that do not read it are left out:
    the activations a training forward returns for its backward (a layer's norm
    statistics, its queries) reach into the layers below the hidden state without
    making it any less their boundary. A projection's output alone dominates only its
    own MatMul and stays fusable with what follows (RoPE, an activation); attention's
    scores carry no projection. With `nested_only`, only those whose stream carries
    another one (the hidden state a layer adds to): a single layer is left to the
    cost-based cuts, while in a stack each segment recomputes what one layer does
    instead of compounding below it (each layer reads the one below under 4 tile maps:
    4^layers instances). One may be an output (a hidden state saved for the backward):
    its producer kernel stores it, once (`_kernels`)."""
    reach = {n.id for n in graph.live_nodes()}
    succ = {i: {x.id for x in graph.nodes[i].inputs} for i in reach}
    readers: dict[int, set[int]] = {i: set() for i in reach}
    for i in reach:
        for x in succ[i]:
            readers[x].add(i)
    outputs = {n.id for n in graph.outputs}

    def below(i: int) -> set[int]:
        """The values every path to which from the outputs that read i passes through i."""
        above = _walk(readers, [i]) & outputs
        return _walk(succ, [i]) - _walk(succ, above, avoid=i)

    def reduction(n: Node) -> bool:
        if n.op == "matmul":
            return not D.is_one(n.inputs[0].shape[-1])
        return n.op == "reduce" and not D.is_one(n.inputs[0].shape[n.attrs["axis"]])

    def parameter(n: Node) -> bool:
        while n.op in ("cast", "reshape", "permute", "broadcast"):
            n = n.inputs[0]
        return n.op == "input" and not D.free_symbols(n.shape)

    def stream(n: Node) -> tuple[set[int], bool]:
        """What n carries on elementwise and layout ops of its size, and whether that
        includes a projection."""
        size, stack, seen, projection = math.prod(n.shape), [n], set(), False
        while stack:
            x = stack.pop()
            if x.id in seen or not D.equal(math.prod(x.shape), size):
                continue
            seen.add(x.id)
            projection |= x.op == "matmul" and any(parameter(y) for y in x.inputs)
            if x.op in ELEMENTWISE or x.op in ("reshape", "permute"):
                stack.extend(x.inputs)
        return seen - {n.id}, projection

    reductions = {i for i in reach if reduction(graph.nodes[i])}
    found = {}
    for i in reach:
        if len(readers[i]) >= 2:
            carried, projection = stream(graph.nodes[i])
            if projection and len((below(i) - {i}) & reductions) >= 2:
                found[i] = carried
    # nested: the stream below it carries another one (the hidden state a layer adds to)
    return {i for i, carried in found.items() if not nested_only or carried & found.keys()}


def _walk(edges: dict, starts, avoid: int | None = None) -> set[int]:
    """The vertices reached from `starts` along `edges`, themselves included, without
    entering `avoid`."""
    seen = set(starts) - {avoid}
    stack = list(seen)
    while stack:
        for x in edges[stack.pop()] - seen - {avoid}:
            seen.add(x)
            stack.append(x)
    return seen


def _upstream(roots, leaves: set) -> set[int]:
    """The leaves the roots read (other materialised nodes do not change their kernel)."""
    found, stack, seen = set(), [n for n, _ in roots], set()
    while stack:
        n = stack.pop()
        for x in n.inputs:
            if x.id in seen:
                continue
            seen.add(x.id)
            if x.id in leaves:
                found.add(x.id)
            else:
                stack.append(x)
    return found


def _cuttable(spec: KernelSpec, cuts: set[int]) -> list:
    """The instances a kernel computes that may be materialised instead: not its roots,
    not an output (stored by its own kernel), not an input, constant or index."""
    roots = {id(s.inst) for s in spec.stores}
    outputs = {n.id for n in spec.views.graph.outputs}
    return [i for i in spec.views.memo.values() if not i.leaf and id(i) not in roots and i.node.id not in cuts
            and i.node.id not in outputs and i.node.op not in ("input", "const", "size", "iota")]


def _nested(spec: KernelSpec, cuts: set[int], env: dict, long_extent: int, dynamic: set,
            hold_extent: int = 0) -> set[int]:
    """Its long reductions whose value varies over an axis another reduction reduces:
    a long one (two loops, one inside the other), or any, when its own length is
    dynamic (the kernel must serve long lengths too). Those no longer than
    `hold_extent` are left to a block that holds them whole."""
    def is_dynamic(lab) -> bool:
        return any(s.name in dynamic for s in lab.extent.free_symbols)

    long = functools.partial(_long, env, long_extent, dynamic)
    reduced = {i.reduced.id: i.reduced for i in spec.views.memo.values() if i.reduced is not None}
    out = set()
    for i in _cuttable(spec, cuts):
        if i.reduced is None or not _long(env, max(long_extent, hold_extent), dynamic, i.reduced):
            continue
        # a reduction over one element (a Split's chunk axis at count 1) runs no loop
        outer = [reduced[lab] for lab in i.labels if lab in reduced and lab != i.reduced.id
                 and (is_dynamic(reduced[lab]) or D.evaluate(reduced[lab].extent, env) > 1)]
        if any(long(lab) or is_dynamic(i.reduced) for lab in outer):
            out.add(i.node.id)
    return out


def _first_cuts(spec: KernelSpec, cuts: set[int], env: dict, long_extent: int, hold_extent: int, dynamic: set,
                target) -> set[int]:
    """The cuts a kernel needs before its tiling is tried: at its MatMul operands
    (`recompute.operand_cuts`), else its nested long reductions that no block holds
    whole (no tiling runs two long loops one inside the other). The operands go
    first: once they are cut, the reductions below them are no longer in this kernel."""
    return operand_cuts(spec, _cuttable(spec, cuts), env, target, functools.partial(_long, env, hold_extent, dynamic),
                        dynamic) \
        or _nested(spec, cuts, env, long_extent, dynamic, hold_extent)


def _long(env: dict, long_extent: int, dynamic: set, lab) -> bool:
    """A reduction over this label runs a loop: its extent exceeds `long_extent`, or is
    dynamic (the kernel must serve long lengths too)."""
    return any(s.name in dynamic for s in lab.extent.free_symbols) or D.evaluate(lab.extent, env) > long_extent


def _cuts(spec: KernelSpec, cuts: set[int], first, nested) -> set[int]:
    """The next nodes to materialise for a kernel to cut: its first cuts, else its
    nested long reductions it tried to hold whole, else all its reductions, else
    every node it computes."""
    computed = _cuttable(spec, cuts)
    for level in (first(spec, cuts), nested(spec, cuts), {i.node.id for i in computed if i.reduced is not None},
                  {i.node.id for i in computed}):
        if level:
            return level
    return set()


def _halve(spec: KernelSpec, apart: dict) -> bool:
    """Put the first half of the kernel's roots and the second in kernels of their own
    (`apart`); False when it stores one root (a node stored under several names)."""
    ids = list(dict.fromkeys(st.node.id for st in spec.stores))
    if len(ids) < 2:
        return False
    for k, i in enumerate(ids):
        apart[i] = apart.get(i, ()) + (2 * k >= len(ids),)
    return True


def _producer_groups(graph: Graph, roots: list, apart: dict | None = None) -> list[tuple[list, bool]]:
    """Materialised nodes in kernels of their own, in topological order, each with
    whether its stores peel their layout ops; nodes over one grid share one
    (horizontal fusion: a gate and an up projection; fused attention's output with its
    row max and sum, one loop computing all three). Nodes whose computed values differ
    in layout but whose stored ones share a grid (rotated keys beside the values, both
    [b, heads, s, d]) share one that tiles the stored dims. Nodes `apart` puts in
    different halves of a fusion no tiling fitted never share one."""
    apart = apart or {}
    cuts = {out.id for out, _ in roots}
    groups: list[list] = []  # [peeled dims, stored dims, members, peel, half]
    group_of: dict[int, int] = {}
    for out, buffer in sorted(roots, key=lambda r: r[0].id):
        peeled, stored = (frozenset(k for k in _stored(graph, out, buffer, p)[2] if k is not None)
                          for p in (True, False))
        # it runs after every group it reads from: joining one would make a program
        # compute what it reads (a row's statistic over all of a projection's columns)
        after = max((group_of[i] for i in _upstream([(out, buffer)], cuts)), default=-1)
        joined, half = None, apart.get(out.id, ())
        for i, group in enumerate(groups):
            if group[4] != half:
                continue
            if i > after and group[3] and _same_grid(group[0], peeled):
                joined = i
            elif i > after and _same_grid(group[1], stored):
                joined, group[3] = i, False
            if joined is not None:
                break
        if joined is None:
            joined = len(groups)
            groups.append([frozenset(), frozenset(), [], True, half])
        group = groups[joined]
        group[0], group[1] = group[0] | peeled, group[1] | stored
        group[2].append((out, buffer))
        group_of[out.id] = joined
    return [(members, peel) for _, _, members, peel, _ in groups]


def _same_grid(a: frozenset, b: frozenset) -> bool:
    """One grid serves both: equal dims, or one's dims within the other's (a row
    statistic beside its rows, stored by each program of the row)."""
    return bool(a & b) and (a <= b or b <= a)


def _grid_groups(graph: Graph, roots: list, apart: dict | None = None) -> list[list]:
    """Roots over one grid, in root order: one kernel each. A kernel's grid is the
    product of its roots' dims and each root is stored by every program, so roots whose
    dims merely overlap (a (3n, m) and an (n, 2m) repeat of one (n, m) input) would
    multiply each other's programs (6 n m^2 of them); they share a kernel only when one's
    dims lie within the other's (`_same_grid`: rows beside their row statistic). A root
    joins every group within its dims, else the first group whose dims hold its own.
    Roots without a grid dim share the one program. Roots `apart` puts in different
    halves of a fusion no tiling fitted never share one."""
    apart = apart or {}
    groups: list[tuple[frozenset, list, tuple]] = []  # (dim keys, root indices, half)
    for i, (out, buffer) in enumerate(roots):
        keys = frozenset(k for k in _stored(graph, out, buffer)[2] if k is not None) or frozenset({()})
        half = apart.get(out.id, ())
        mine = [g for g in groups if g[2] == half and _same_grid(g[0], keys)]
        within = [g for g in mine if g[0] <= keys]
        holding = [g for g in mine if keys <= g[0]][:1]
        joined = within or holding
        groups = [g for g in groups if all(g is not j for j in joined)]
        groups.append((keys.union(*(g[0] for g in joined)), sorted([i] + [j for g in joined for j in g[1]]), half))
    return [[roots[j] for j in g[1]] for g in sorted(groups, key=lambda g: g[1][0])]
