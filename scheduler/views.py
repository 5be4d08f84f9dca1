"""Tile maps, derived backwards from a kernel's outputs (the inter-block pass).

Every dimension of every value a kernel computes is indexed by an affine
expression over *labels*: one label per output dimension and one fresh label per
reduced axis (a reduction, a MatMul's contraction, a top-k). Walking the graph
from the outputs, each op maps its result's index expressions to its operands'
(elementwise: same; MatMul: rows from A, columns from B, a fresh contracted
label; reduction: a fresh label on the reduced axis; reshape/slice/concat/split:
affine re-indexing; take and gather: the operand's axis is indexed by the index tensor's
value, `gathered(index, view)`). A node reached under two different maps becomes two
instances (it is recomputed, unless one is the other's tile with its halves swapped:
RoPE's rotated halves, half_swap.py); one reached twice under the same map is one
instance, computed once.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import sympy
from sympy.core.function import AppliedUndef

from cleave.ir import Graph, Node, ShapeError
from cleave.ir import dims as D
from cleave.ir.ops import BINARY, COMPARE, UNARY, half_read, reads_half_rounded

ELEMENTWISE = {*UNARY, *BINARY, *COMPARE, "cast", "where", "broadcast"}


@dataclass(eq=False)
class Label:
    id: int
    extent: sympy.Expr  # over graph symbols
    origin: str  # "out" (an output dim) or the op that reduces it: "reduce", "matmul", "topk"

    @functools.cached_property
    def sym(self) -> sympy.Symbol:  # cached: codegen asks millions of times for a layer
        return sympy.Symbol(f"X{self.id}", integer=True, nonnegative=True)


@dataclass(eq=False)
class Instance:
    """One node computed under one tile map (`view`: an index expression per dim)."""
    node: Node
    view: tuple
    inputs: list["Instance"]
    labels: frozenset  # label ids the value varies over
    reduced: Label | None = None  # the label this instance reduces (reduce, matmul, topk)
    leaf: bool = False  # read from memory: a graph input or a materialised node
    # its own index over its node's dims (`view` of a re-indexing op is its operand's)
    at: tuple | None = None

    @property
    def op(self) -> str:
        return "load" if self.leaf else self.node.op


class TooManyInstances(Exception):
    """A kernel's walk derived more than its budget of instances."""


@dataclass
class Views:
    """The instances of one kernel, built from its roots."""
    graph: Graph
    leaves: set  # node ids read from memory
    labels: list[Label] = field(default_factory=list)
    memo: dict = field(default_factory=dict)
    roots: list = field(default_factory=list)  # (instance, store view over the stored node's dims)
    gathers: dict = field(default_factory=dict)  # gathered(index, view) -> the index's instance there
    # gathered(index, view) -> the extent of the axis it indexes: a negative index counts
    # from the end of that axis, as torch's x[index] does
    gather_extents: dict = field(default_factory=dict)
    # index node id -> the extents it indexes, in the order met: one application per extent
    # (a[i] + b[i] over tables of 10 and 7 rows wraps -1 to 9 in one, 6 in the other)
    index_extents: dict = field(default_factory=dict)
    # most instances one kernel may derive: a node read under k maps is k instances, and
    # below a stack of layers that compounds (k^layers) before any cut is made
    budget: int | None = None
    _by_sym: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self._by_sym.update((lab.sym, lab) for lab in self.labels)

    def label(self, extent, origin) -> Label:
        lab = Label(len(self.labels), D.dim(extent), origin)
        self.labels.append(lab)
        self._by_sym[lab.sym] = lab
        return lab

    def by_sym(self) -> dict:
        """symbol -> label."""
        return self._by_sym

    def gathered_into(self, index: Node, view: tuple, extent, inst: Instance) -> sympy.Expr:
        """index's value at view, as the index of an axis of `extent`: one application per
        extent it indexes, so each wraps a negative entry into its own axis. Reads of one
        extent share it (K and V pages through one page list)."""
        extents = self.index_extents.setdefault(index.id, [])
        k = next((i for i, e in enumerate(extents) if _eq(e, extent)), None)
        if k is None:
            k = len(extents)
            extents.append(extent)
        f = gathered(index, view, k)
        self.gathers[f] = inst
        self.gather_extents[f] = extent
        return f

    def labels_of(self, exprs) -> frozenset:
        table = self.by_sym()
        out = set()
        for e in exprs:
            out |= {table[s].id for s in sympy.sympify(e).free_symbols if s in table}
        return frozenset(out)

    # -- the backward walk ------------------------------------------------
    def get(self, node: Node, view: tuple) -> Instance:
        key = (node.id, view)
        inst = self.memo.get(key)
        if inst is None:
            if self.budget is not None and len(self.memo) >= self.budget:
                raise TooManyInstances(self.budget)
            inst = self._derive(node, view)
            inst.at = view
            self.memo[key] = inst
        return inst

    def _derive(self, n: Node, view: tuple) -> Instance:
        if n.id in self.leaves or n.op == "input":
            return Instance(n, view, [], self.labels_of(view), leaf=True)
        op = n.op
        if op in ("const", "size"):
            return Instance(n, view, [], frozenset())
        if op == "iota":
            return Instance(n, view, [], self.labels_of([view[n.attrs["axis"]]]))
        if op in ELEMENTWISE:
            ins = [self.get(x, broadcast_view(view, n.shape, x.shape)) for x in n.inputs]
            return Instance(n, view, ins, frozenset().union(*(i.labels for i in ins)))
        if op == "matmul":
            a, b = n.inputs
            k = self.label(a.shape[-1], "matmul")
            batch = view[:-2]
            va = broadcast_view(batch, n.shape[:-2], a.shape[:-2]) + (view[-2], k.sym)
            vb = broadcast_view(batch, n.shape[:-2], b.shape[:-2]) + (k.sym, view[-1])
            ins = [self.get(a, va), self.get(b, vb)]
            return Instance(n, view, ins, (ins[0].labels | ins[1].labels) - {k.id}, reduced=k)
        if op == "reduce":
            x, axis = n.inputs[0], n.attrs["axis"]
            r = self.label(x.shape[axis], "reduce")
            inner = list(view)
            if n.attrs["keepdim"]:
                inner[axis] = r.sym
            else:
                inner.insert(axis, r.sym)
            inst = self.get(x, tuple(inner))
            return Instance(n, view, [inst], inst.labels - {r.id}, reduced=r)
        if op == "topk":
            x, axis = n.inputs[0], n.attrs["axis"]
            r = self.label(x.shape[axis], "topk")
            inner = list(view)
            inner[axis] = r.sym
            inst = self.get(x, tuple(inner))
            return Instance(n, view, [inst], (inst.labels - {r.id}) | self.labels_of([view[axis]]), reduced=r)
        if op == "permute":
            perm = n.attrs["perm"]
            inner = [None] * len(perm)
            for i, p in enumerate(perm):
                inner[p] = view[i]
            return self._through(n, tuple(inner))
        if op == "reshape":
            return self._through(n, self.in_range(reshape_back(n.inputs[0].shape, n.shape, view, n)))
        if op == "slice":
            inner = list(view)
            inner[n.attrs["axis"]] = view[n.attrs["axis"]] * n.attrs["step"] + n.attrs["start"]
            return self._through(n, tuple(inner))
        if op == "concat":
            axis, offset, ins = n.attrs["axis"], D.dim(0), []
            for x in n.inputs:
                inner = list(view)
                inner[axis] = view[axis] - offset
                ins.append(self.get(x, tuple(inner)))
                offset = offset + x.shape[axis]
            return Instance(n, view, ins, frozenset().union(*(i.labels for i in ins)) | self.labels_of([view[axis]]))
        if op == "take":
            x, index = n.inputs
            axis, rank = n.attrs["axis"], n.inputs[1].rank
            at = view[axis:axis + rank]
            idx = self.get(index, at)
            f = self.gathered_into(index, at, x.shape[axis], idx)
            inst = self.get(x, view[:axis] + (f,) + view[axis + rank:])
            return Instance(n, view, [inst, idx], inst.labels | idx.labels)
        if op == "gather":  # torch.gather: the index has the result's shape
            x, index = n.inputs
            axis = n.attrs["axis"]
            idx = self.get(index, view)
            f = self.gathered_into(index, view, x.shape[axis], idx)
            inst = self.get(x, view[:axis] + (f,) + view[axis + 1:])
            return Instance(n, view, [inst, idx], inst.labels | idx.labels)
        if op == "split":
            axis = n.attrs["axis"]
            inner_extent = n.shape[axis + 1]
            merged = view[axis] * inner_extent + view[axis + 1]
            inst = self.get(n.inputs[0], view[:axis] + (merged,) + view[axis + 2:])
            return Instance(n, view, [inst], inst.labels | self.labels_of(view[axis:axis + 2]))
        raise ShapeError(f"scheduler: op {op!r} (node %{n.id}{' at ' + n.loc if n.loc else ''}) "
                         f"has no tiling rule")

    def in_range(self, view: tuple) -> tuple:
        """`view` with the div/mod of a label by its own extent folded: floor(X/e) is 0 and
        X mod e is X, since 0 <= X < e (a tile's lanes past the extent are clamped before
        they index anything). Flattening (b, s) into rows and back, as a layer does
        around each projection, then leaves the rows affine in b and s, which tiles them."""
        if not any(isinstance(e, sympy.Basic) and e.has(sympy.floor, sympy.Mod) for e in view):
            return view  # the common case
        table = self.by_sym()
        return tuple(_fold_in_range(e, tuple(sorted(((x, table[x].extent) for x in e.free_symbols if x in table),
                                                    key=lambda p: p[0].name)))
                     if isinstance(e, sympy.Basic) else e for e in view)

    def _through(self, n: Node, inner: tuple) -> Instance:
        """A pure re-indexing op: the value is its operand's under the new map."""
        inst = self.get(n.inputs[0], inner)
        return Instance(n, inner, [inst], inst.labels)


@functools.lru_cache(maxsize=8192)
def _fold_in_range(e, extents: tuple):
    """Views.in_range for one index; `extents` holds (label symbol, extent) of e's labels.
    Cached: a layer's views are rebuilt for every partition tried, with the same indices."""
    extent = dict(extents)

    def own(x, bound) -> bool:
        return x in extent and _eq(extent[x], bound)

    def split(num, den):
        """(q, r) with num = q*den + r, q the terms den divides; None when r is no label
        of extent den (so 0 <= r < den is not known)."""
        num = sympy.expand(num)
        whole = sum((t for t in sympy.Add.make_args(num) if sympy.fraction(sympy.cancel(t / den))[1] == 1),
                    sympy.Integer(0))
        rest = num - whole
        if rest == 0 or own(rest, den):
            return sympy.cancel(whole / den), rest
        return None

    def fold(x):
        if isinstance(x, sympy.floor):
            found = split(*sympy.fraction(sympy.together(x.args[0])))
            return found[0] if found else x
        found = split(*x.args)  # a Mod
        return found[1] if found else x

    for _ in range(4):  # folding an inner floor can expose an outer mod
        folded = e.replace(lambda x: isinstance(x, (sympy.floor, sympy.Mod)), fold)
        if folded == e:
            break
        e = folded
    return e


def merged_offset(offset, extents: dict):
    """A linear buffer offset with a merged index split back into its dims folded:
    storing rows r < b*s of a [b*s, n] value into a [b, s, n] buffer addresses
    (r // s % b) * s*n + (r % s) * n, which is r * n. The `% b` goes when r's extent is
    b*s (every lane that stores is in range), then r % s = r - s*(r // s) cancels the
    quotient. None when nothing folds (the offset's own form is kept)."""
    def divmods(e) -> int:
        return len(e.atoms(sympy.floor, sympy.Mod))

    before = divmods(offset)
    if not before:
        return None
    for m in list(offset.atoms(sympy.Mod)):
        q, b = m.args
        if isinstance(q, sympy.floor):
            num, den = sympy.fraction(sympy.together(q.args[0]))
            if num in extents and _eq(extents[num], den * b):
                offset = offset.xreplace({m: q})
    for m in list(offset.atoms(sympy.Mod)):
        x, a = m.args
        folded = sympy.expand(offset.xreplace({m: x - a * sympy.floor(x / a)}))
        if divmods(folded) < divmods(offset):
            offset = folded
    return offset if divmods(offset) < before else None


GATHER = "take_index_"


def gathered(index: Node, view: tuple, extent_number: int = 0) -> sympy.Expr:
    """The value of node `index` at `view`, as an index expression: an application of a
    function named after the node and which of the extents it indexes this is (its
    arguments are remapped with the labels)."""
    suffix = f"_{extent_number}" if extent_number else ""
    return sympy.Function(f"{GATHER}{index.id}{suffix}", integer=True)(*view)


def gathers(e) -> list:
    """The gathered values (applications made by `gathered`) inside an index expression."""
    return [f for f in sympy.sympify(e).atoms(AppliedUndef) if f.func.__name__.startswith(GATHER)]


def broadcast_view(view, out_shape, in_shape) -> tuple:
    """Right-aligned broadcasting: an operand dim of 1 is indexed by 0."""
    pad = len(out_shape) - len(in_shape)
    return tuple(sympy.Integer(0) if D.is_one(d) else view[pad + i] for i, d in enumerate(in_shape))


def _eq(a, b) -> bool:
    return a == b or sympy.expand(a - b) == 0


def reshape_groups(src, dst, node) -> list[tuple[list[int], list[int]]]:
    """Pair contiguous groups of non-unit dims of equal product (symbolically)."""
    groups = _reshape_groups(tuple(src), tuple(dst))
    if groups is None:
        # h heads of floor(d/h): a reshape's total sizes are equal at every binding (its
        # constraint), and q*floor(p/q) <= p, so where the exact quotients pair groups of
        # dims, each group's sizes are equal
        groups = _reshape_groups(*(tuple(D.exact_quotients(d) for d in shape) for shape in (src, dst)))
    if groups is None:
        raise ShapeError(f"scheduler: reshape %{node.id} from {D.fmt_shape(src)} to {D.fmt_shape(dst)} "
                         f"does not split into groups of equal size")
    return groups


@functools.lru_cache(maxsize=4096)
def _reshape_groups(src: tuple, dst: tuple):
    """reshape_groups by shapes (None when they do not pair): a layer's views reshape
    the same few shapes thousands of times, and each pairing cancels products in sympy."""
    a = [i for i, d in enumerate(src) if not D.is_one(d)]
    b = [i for i, d in enumerate(dst) if not D.is_one(d)]
    if a and b and any(d == 0 for d in (*src, *dst)):  # no element: one group, its index never used
        return [(a, b)]
    groups, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        ga, gb = [a[i]], [b[j]]
        pa, pb = src[a[i]], dst[b[j]]
        i, j = i + 1, j + 1
        while not _eq(pa, pb):
            num, den = sympy.fraction(sympy.cancel(pa / pb))
            if (den == 1 or i == len(a)) and j < len(b):
                gb.append(b[j]); pb = pb * dst[b[j]]; j += 1
            elif i < len(a):
                ga.append(a[i]); pa = pa * src[a[i]]; i += 1
            else:
                break
        if not _eq(pa, pb):
            return None
        groups.append((ga, gb))
    if i != len(a) or j != len(b):
        return None
    return groups


def _strides(shape, idx):
    out, acc = [], sympy.Integer(1)
    for i in reversed(idx):
        out.append(acc)
        acc = acc * shape[i]
    return list(reversed(out))


def reshape_back(src, dst, view, node) -> tuple:
    """Index of the reshape's operand (shape src) from its result's index (shape dst)."""
    inner = [sympy.Integer(0)] * len(src)
    for ga, gb in reshape_groups(src, dst, node):
        flat = sum((view[k] * s for k, s in zip(gb, _strides(dst, gb))), sympy.Integer(0))
        empty = any(src[k] == 0 for k in ga) or any(dst[k] == 0 for k in gb)
        for k, s in zip(ga, _strides(src, ga)):
            # no element to index in an empty group: any index over the same labels serves
            inner[k] = flat if len(ga) == 1 or empty else sympy.Mod(sympy.floor(flat / s), src[k])
    return tuple(inner)


def store_chain(out: Node, stored_dtype=None) -> tuple[Node, list[Node]]:
    """Peel trailing reshapes/permutes off an output: the kernel computes the inner
    node and stores it through the chain's forward index map (a merge stays affine).
    A cast to `stored_dtype` peels too: the store converts to it anyway, and the
    kernel then tiles the inner node's dims (GQA decode's [b, kv heads, group, d]
    rather than the merged [b, heads, d] of the output)."""
    chain = []
    while (out.op in ("reshape", "permute") or peels_cast(out, stored_dtype)) and out.inputs[0].op != "input":
        chain.append(out)
        out = out.inputs[0]
    return out, chain


def peels_cast(out: Node, stored_dtype) -> bool:
    """Whether a cast to `stored_dtype` peels into the store's conversion: not one that
    reads a half value rounded (to an integer: a bf16 MatMul's f32 accumulator
    truncated to int32 was one off where the bf16 product was a whole number)."""
    return out.op == "cast" and out.dtype == stored_dtype and not (
        reads_half_rounded("cast", out.dtype) and half_read(out.inputs[0]) is not None)


def forward_view(chain: list[Node], view: tuple) -> tuple:
    """Map an index of the inner node through the peeled chain to the output's index."""
    for n in reversed(chain):
        if n.op == "cast":
            continue
        if n.op == "permute":
            view = tuple(view[p] for p in n.attrs["perm"])
        else:  # the operand's index to the result's: reshape_back with the shapes swapped
            view = reshape_back(n.shape, n.inputs[0].shape, view, n)
    return view
