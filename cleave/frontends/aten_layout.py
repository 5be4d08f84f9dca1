"""Layout and indexing aten ops: views, permutes, expands, repeats, slices, splits,
cat/stack, gather/index_select/index/embedding, and the matmul family."""
from __future__ import annotations

import operator

import sympy
import torch

from ..ir import Constraint
from ..ir import dims as D
from .aten_elementwise import binary, fill
from .aten_map import meta_args, rule
from .errors import CaptureError, UnsupportedOpError
from .scalar_ranges import converting

_BIG = 2 ** 62  # torch spells "to the end" as INT64_MAX


def reshape(t, x, shape):
    shape = tuple(shape)
    if x.op == "reshape":  # a reshape of a reshape is one reshape of the source (row-major)
        x = x.inputs[0]
    if len(shape) == x.rank and all(D.equal(a, b) for a, b in zip(shape, x.shape)):
        return x
    return t.add("reshape", x, shape=shape)


def permute(t, x, perm):
    perm = [p % x.rank for p in perm]
    return x if perm == list(range(x.rank)) else t.add("permute", x, perm=perm)


def swap(t, x, a, b):
    perm = list(range(x.rank))
    if x.rank:
        a, b = a % x.rank, b % x.rank
        perm[a], perm[b] = perm[b], perm[a]
    return permute(t, x, perm)


def unsqueeze(t, x, axis):
    return reshape(t, x, x.shape[:axis] + (D.dim(1),) + x.shape[axis:])


def broadcast(t, x, shape):
    return reshape(t, x, shape) if tuple(shape) == x.shape else t.add("broadcast", x, shape=tuple(shape))


def repeat_interleave(t, x, repeats, axis):
    """Each slice along axis repeated `repeats` times in place: insert an axis after
    it, broadcast it to `repeats`, merge the two."""
    if repeats == 1:
        return x
    wide = unsqueeze(t, x, axis + 1)
    shape = list(wide.shape)
    shape[axis + 1] = D.dim(repeats)
    merged = list(x.shape)
    merged[axis] = x.shape[axis] * repeats
    return reshape(t, t.add("broadcast", wide, shape=tuple(shape)), merged)


# Pure views: the output shape torch computed is the reshape target.
rule("flatten", "unsqueeze", "view_as", "reshape_as")(lambda t, n, a: reshape(t, a["self"], t.out_shape(n)))


@rule("view", "_unsafe_view", "reshape", "unflatten",
      check=lambda a, n: "view as another dtype is not supported" if "dtype" in a and "size" not in a else None)
def _view(t, n, a):
    """The shape torch computed, each size the code wrote as a number held to it: torch
    writes the 2 of view(-1, 2, 3) as floor(n / floor(n / 2)) of the traced sizes, which
    is 3 at n = 3, where eager raises (the binding then refuses n = 3 and eager does)."""
    shape = t.out_shape(n)
    written, at = a.get("size", a.get("shape")), 0
    if "sizes" in a:  # unflatten(dim, sizes): the sizes of the axes dim splits into
        written, at = a["sizes"], a["dim"] % max(a["self"].rank, 1)
    if isinstance(written, (list, tuple)):
        for size, given in zip(shape[at:at + len(written)], written):
            if isinstance(given, int) and given >= 0 and not D.equal(size, given):
                t.graph._constrain(Constraint("eq", size, D.dim(given), f"{t.op}'s size {given} as written"))
        inferred = [isinstance(given, int) and given == -1 for given in written]
        if any(inferred):  # torch infers the -1 dividing by the others, traced as positive; eager raises at 0
            known = sympy.Mul(*(size for size, minus_one in zip(shape[at:], inferred) if not minus_one))
            if known.free_symbols:
                t.graph._constrain(Constraint("le", D.dim(1), known, f"{t.op}'s -1 beside {D.fmt(known)}"))
    return reshape(t, a["self"], shape)


@rule("squeeze")
def _squeeze(t, n, a):
    """A view; a dynamic axis it may drop was traced at an extent other than 1 and kept,
    so the graph holds where it is not 1: at 1 eager drops it (x.squeeze(0) of (n, 3) is
    (3,) at n = 1), and such a binding runs eagerly. Guarded as 2 <= n, which also sends
    n = 0 to eager, where squeeze keeps the axis too."""
    x = a["self"]
    dims = a.get("dim", range(x.rank))
    for axis in ([dims] if isinstance(dims, int) else dims):
        if sympy.sympify(x.shape[axis]).free_symbols:
            _guard(t, 2, x.shape[axis])
    return reshape(t, x, t.out_shape(n))
rule("transpose.int", "swapaxes")(lambda t, n, a: swap(t, a["self"], a.get("dim0", a.get("axis0")),
                                                       a.get("dim1", a.get("axis1"))))
rule("t", "numpy_T", "mT")(lambda t, n, a: swap(t, a["self"], -2, -1) if a["self"].rank >= 2 else a["self"])
rule("permute")(lambda t, n, a: permute(t, a["self"], a["dims"]))
rule("expand", "expand_as", "broadcast_to")(lambda t, n, a: broadcast(t, a["self"], t.out_shape(n)))
# functional copy (what `z[:, 0] = v` leaves after functionalization, beside the scatter's
# decomposition): src broadcast to self's shape; the translator casts to self's dtype
rule("copy")(lambda t, n, a: broadcast(t, a["src"], t.out_shape(n)))


# Ops whose result depends on how their input lies in memory (strides and offset into
# its storage), not only on its values (torch.diag lowers to as_strided over a slice of
# the input: over a contiguous copy of the slice it read past the end, and within
# bounds it would read the wrong elements).
STORAGE_DEPENDENT = {"as_strided"}


def storage_dependent(n: torch.fx.Node) -> bool:
    target = n.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.name.split("::")[-1] in STORAGE_DEPENDENT


def _strided_reads(a, n):
    """Why an as_strided cannot be read from its input's values. It can where the input
    is contiguous from offset 0, so that eager's storage holds its elements in row-major
    order as a region's output does, and every element it reads lies inside the input
    (over a longer storage, eager would read past the view). Where that is not proven
    for every size (a diagonal's Min(n, m - 1) elements) but holds where torch traced,
    the rule keeps it as a constraint of the graph (_reads_inside)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    src = a["self"]
    if not src.is_contiguous() or src.storage_offset() != 0:
        return "as_strided over a non-contiguous input or a view at an offset"
    if _returned_as_view(n):
        return "as_strided returned as a view of another value"
    sizes, strides, offset = a["size"], a["stride"], a.get("storage_offset") or 0
    if any(statically_known_true(size == 0) for size in sizes):
        return None
    last = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides))
    try:
        last, numel = _traced(last), _traced(src.numel())
    except CaptureError:
        return "as_strided over a data-dependent size"
    if last >= numel:
        return f"as_strided reading past its input: element {last} of {numel} where torch traced"
    return None


def _reads_inside(t, x, shape, strides, offset) -> None:
    """The last element an as_strided reads lies inside x, as a constraint of the graph
    unless sympy proves it: a binding where it does not hold runs eagerly."""
    if any(size == 0 for size in shape):
        return
    last = offset + sum(((size - 1) * stride for size, stride in zip(shape, strides)), sympy.Integer(0))
    numel = sympy.Mul(*x.shape)
    if not sympy.simplify(numel - 1 - last).is_nonnegative:
        t.graph._constrain(Constraint("le", D.dim(last + 1), D.dim(numel), f"{t.op} reading inside its input"))


def _returned_as_view(n) -> bool:
    """Whether n, or a view of it, is a result of the graph: eager returns it as a view of
    its input (y.diagonal() beside y shares y's memory), which a compiled copy is not."""
    return reaches(n, lambda user: getattr(user.target, "is_view", False) or user.target is operator.getitem,
                   lambda node: node.op == "output")


def reaches(n, through, found) -> bool:
    """Whether n, or a node reached from it through users for which `through(user)`
    holds, is `found` (a found user ends the walk whether `through` holds for it or not)."""
    stack, seen = [n], {n}
    while stack:
        node = stack.pop()
        if found(node):
            return True
        for user in node.users:
            if user not in seen and (found(user) or through(user)):
                seen.add(user)
                stack.append(user)
    return False


def _traced_equal(t, a, b) -> bool:
    """a = b for every binding, or where torch traced (only there, without its sizes)."""
    if D.equal(a, b):
        return True
    hints = t.symbols.hints
    free = sympy.sympify(a - b).free_symbols
    return bool(hints) and free <= set(hints) and D.evaluate(a, hints) == D.evaluate(b, hints)


@rule("as_strided", check=_strided_reads)
def _as_strided(t, node, a):
    """Row-major from offset 0 over the whole input (group_norm's decomposition views its
    [n, g, c/g, 1] scale as [n, c] so), a reshape; any other strides (torch.diag,
    einsum("ii->i"), sliding windows), a take from the flattened input at offset +
    sum(i_k * stride_k)."""
    x, shape = a["self"], t.out_shape(node)
    strides, offset = [t.size(s) for s in a["stride"]], t.size(a.get("storage_offset") or 0)
    numel = sympy.Mul(*x.shape)
    expect, row_major = sympy.Integer(1), True
    for size, stride in reversed(list(zip(shape, strides))):
        row_major &= D.is_one(size) or D.equal(stride, expect)
        expect = expect * size
    if row_major and offset == 0 and _traced_equal(t, expect, numel):
        return reshape(t, x, shape)  # as a constraint where only equal as traced (C = g * (C // g))
    _reads_inside(t, x, shape, strides, offset)
    return strided_take(t, x, shape, strides, offset)


def strided_take(t, x, shape, strides, offset=0):
    """The elements of x, read row-major as one flat axis, at offset + Σ i_k·stride_k for
    each index i of `shape`: a strided view (as_strided), or sliding windows."""
    offset = sympy.sympify(offset)
    index = t.const(offset, "i64") if offset.is_number else t.add("size", value=offset, dtype="i64")
    for axis, stride in enumerate(strides):
        if stride != 0:
            lanes = t.add("iota", shape=tuple(shape), axis=axis, dtype="i64")
            index = t.add("add", index, lanes if stride == 1 else t.add("mul", lanes, t.lift(stride, lanes)))
    return t.add("take", reshape(t, x, (sympy.Mul(*x.shape),)), index, axis=0)


@rule("movedim.int")
def _movedim(t, node, a):
    x = a["self"]
    order = [d for d in range(x.rank) if d != a["source"] % x.rank]
    order.insert(a["destination"] % x.rank, a["source"] % x.rank)
    return permute(t, x, order)


def _count(value) -> bool:
    """An int, or a size torch traced symbolically (GQA's group q.shape[1] // k.shape[1]
    under dynamic heads), not one read off the data."""
    return isinstance(value, int) and not isinstance(value, bool) or \
        isinstance(value, torch.SymInt) and value.node.hint is not None


@rule("repeat_interleave.self_int",
      check=lambda a, n: None if _count(a["repeats"]) else "repeats must be an int or a size, not one read off the data")
def _repeat_interleave(t, node, a):
    x = a["self"]
    if a.get("dim") is None:
        x = reshape(t, x, (t.out_shape(node)[0] / a["repeats"],))
        return repeat_interleave(t, x, a["repeats"], 0)
    return repeat_interleave(t, x, a["repeats"], a["dim"] % x.rank)


@rule("repeat", check=lambda a, n: None if all(map(_count, a["repeats"])) else
      "repeats must be ints or sizes, not read off the data")
def _repeat(t, node, a):
    """Tiling: out[..., i] = x[..., i % n]; a new axis of extent r before each one."""
    reps = list(a["repeats"])
    x = a["self"]
    x = reshape(t, x, (D.dim(1),) * (len(reps) - x.rank) + x.shape)
    tiled = [s for r, d in zip(reps, x.shape) for s in (D.dim(r), d)]
    merged = [d * r for r, d in zip(reps, x.shape)]
    wide = reshape(t, x, [s for d in x.shape for s in (D.dim(1), d)])
    return reshape(t, broadcast(t, wide, tiled), merged)


def _traced(value) -> int:
    """The value torch traced a size or slice bound at (a SymInt's hint)."""
    if isinstance(value, torch.SymInt):
        if value.node.hint is None:
            raise CaptureError(f"a slice bound {value} with no traced value (a data-dependent size)")
        return int(value.node.hint)
    return int(value)


def _guard(t, lhs, rhs) -> None:
    """lhs <= rhs as a constraint of the graph, unless it always holds: a symbolic slice
    bound keeps the branch torch took where it traced, and a binding where another
    branch applies runs eagerly."""
    lhs, rhs = sympy.sympify(lhs), sympy.sympify(rhs)
    if not (rhs - lhs).is_nonnegative:
        t.graph._constrain(Constraint("le", lhs, rhs, f"{t.op} as traced"))


def _index(t, value, traced: int, extent, size: int):
    """A slice bound as torch reads it, and its value where torch traced: a negative one
    counts from the end, then it is clamped to [0, extent] (`x[-4:]` of 3 rows starts
    at 0). `traced` and `size` are the bound and the extent where torch traced; a
    symbolic bound (`x[-n:]`, `x[-(len // 2):]`) takes torch's branch there, guarded."""
    value = sympy.sympify(value)
    if traced < 0:
        _guard(t, value, -1)
        value, traced = extent + value, traced + size
    if traced < 0:
        _guard(t, value, 0)
        return D.dim(0), 0
    if traced > size:
        _guard(t, extent, value)
        return extent, size
    _guard(t, 0, value)
    _guard(t, value, extent)
    return value, traced


def _start(t, node, a, key):
    """(axis, extent, its traced size, the bound a[key] as _index reads it)."""
    x, meta = a["self"], meta_args(node)
    axis = a["dim"] % x.rank
    size = _traced(meta["self"].shape[axis])
    bound = _index(t, 0 if a[key] is None else a[key], _traced(0 if meta[key] is None else meta[key]),
                   x.shape[axis], size)
    return axis, x.shape[axis], size, bound


@rule("slice.Tensor")
def _slice(t, node, a):
    """torch's x[start:end:step]: each bound clamped into the axis (_index), an end
    before the start an empty slice."""
    x, end = a["self"], a.get("end")
    axis, extent, size, (start, first) = _start(t, node, a, "start")
    if end is None or (isinstance(end, int) and end >= _BIG):
        stop, last = extent, size
    else:
        stop, last = _index(t, end, _traced(meta_args(node)["end"]), extent, size)
    if last < first:
        _guard(t, stop, start)
        stop = start
    else:
        _guard(t, start, stop)
    step = a.get("step", 1)
    if step == 1 and start == 0 and D.equal(stop, extent):
        return x
    return t.add("slice", x, axis=axis, start=start, stop=stop, step=step)


@rule("narrow")
def _narrow(t, node, a):
    axis, _, _, (start, _) = _start(t, node, a, "start")
    return t.add("slice", a["self"], axis=axis, start=start, stop=start + D.dim(a["length"]), step=1)


@rule("select.int")
def _select(t, node, a):
    axis, _, _, (start, _) = _start(t, node, a, "index")
    return reshape(t, t.add("slice", a["self"], axis=axis, start=start, stop=start + 1, step=1), t.out_shape(node))


@rule("split", "split_with_sizes", "chunk", "unbind", "tensor_split.sections")
def _pieces(t, node, a):
    """Consecutive slices along an axis, lengths as torch computed them. Over a dynamic
    axis torch's pieces hold at the traced size only, but for a fixed list of sizes and
    chunk's pieces (_chunks)."""
    x = a["self"]
    axis = a.get("dim", 0) % x.rank
    name = node.target._schema.name.split("::")[-1]
    pieces = node.meta["val"]
    if not x.shape[axis].is_number and name != "split_with_sizes":
        _chunks(t, node, a, axis, len(pieces))
    keep = name != "unbind"
    out, start = [], D.dim(0)
    for piece in pieces:
        shape = tuple(t.symbols.to_dim(d) for d in piece.shape)
        length = shape[axis] if keep else D.dim(1)
        part = t.add("slice", x, axis=axis, start=start, stop=start + length, step=1)
        out.append(reshape(t, part, shape))
        start = start + length
    return tuple(out)


def _chunks(t, node, a, axis: int, count: int) -> None:
    """Check that `count` pieces over a dynamic extent n are torch's at every n the graph
    binds: chunk(c)'s (split_size ceil(n/c), as torch.compile passes split) where their
    number is c from the least extent bound on. Any other count changes with n (split(2),
    unbind, chunk(3) at n = 4) or the widths with n % c (tensor_split): that op runs
    eagerly."""
    name, n = node.target._schema.name.split("::")[-1], a["self"].shape[axis]
    size = sympy.floor((n + count - 1) / count)
    chunked = name == "chunk" and a["chunks"] == count or name == "split" and D.equal(D.dim(a["split_size"]), size)
    # ceil(m / ceil(m/c)) is c for every m past c(c - 1) (the remainder then fits in
    # the last piece): the least m from which it holds
    low = 1 + max((m for m in range(1, count * count) if -(-m // -(-m // count)) != count), default=0)
    least = 2 if t.symbols.hints else 1  # dynamo specializes extents 0 and 1; a whole capture binds 1
    if not chunked or low > least:
        raise UnsupportedOpError(t.op, t.loc, f"its {count} pieces over a dynamic extent {D.fmt(n)} change in "
                                              f"number or width with it")


@rule("cat")
def _cat(t, node, a):
    # torch skips legacy empty (0,) operands; all of them such, the result is one (an IndexError here)
    xs = [x for x in a["tensors"] if not (x.rank == 1 and x.shape[0] == 0)] or a["tensors"][:1]
    axis = a["dim"] % xs[0].rank
    # An operand empty along the axis adds nothing; kept, it would be a load from a
    # buffer of no element (an empty KV cache's first append).
    kept = [x for x in xs if x.shape[axis] != 0] or xs[:1]
    return concat(t, kept, axis)


def concat(t, parts, axis):
    """parts joined along axis, as concats of at most 3 operands each (what the search
    encodes of an op it does not rewrite), nested."""
    if len(parts) == 1:
        return parts[0]
    if len(parts) > 3:
        size = -(-len(parts) // 3)
        parts = [concat(t, parts[i:i + size], axis) for i in range(0, len(parts), size)]
    return t.add("concat", *parts, axis=axis)


@converting("constant_pad_nd", scalars=("value",))
def _constant_pad(t, node, a):
    """F.pad's constant mode: per axis from the last, a negative pad crops (a slice) and
    a positive one concatenates a block holding the value. Its wider decomposition
    writes into a new tensor (prims.copy_to), which AOTAutograd rejects."""
    return pad_constant(t, a["self"], a["pad"], a.get("value", 0))


def pad_constant(t, x, pad, value):
    """x padded as F.pad's constant mode pads it: `pad` from the last axis, (before,
    after) each."""
    pads = [_signed(t, sympy.Integer(p) if isinstance(p, int) else D.dim(p)) for p in pad]
    for k in range(len(pads) // 2):
        axis = x.rank - 1 - k
        (before, grow_before), (after, grow_after) = pads[2 * k], pads[2 * k + 1]
        if not (grow_before and grow_after):  # a negative side crops
            start = 0 if grow_before else -before
            stop = x.shape[axis] + (0 if grow_after else after)
            x = t.add("slice", x, axis=axis, start=D.dim(start), stop=stop, step=1)
        # a dynamic width (up to a multiple: (-n) % 4) may be 0 on a call: its block is then empty
        left = _pad_block(t, x, axis, before, value) if grow_before and not D.equal(before, 0) else None
        right = _pad_block(t, x, axis, after, value) if grow_after and not D.equal(after, 0) else None
        parts = [part for part in (left, x, right) if part is not None]
        if len(parts) > 1:
            x = t.add("concat", *parts, axis=axis)
    return x


def _pad_block(t, x, axis, width, value):
    """A block of x's shape, `width` wide along axis, holding value."""
    shape = tuple(width if i == axis else d for i, d in enumerate(x.shape))
    return t.add("broadcast", _fill(t, value, x), shape=shape)


def _fill(t, value, x):
    """value in x's dtype, as torch converts a fill (7.9 truncates to 7 in an integer
    tensor). Lifted as a float, an integer pad made the whole result float: int64
    values past 2**24 rounded."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and x.dtype.is_int:
        return t.const(int(value), x.dtype)
    v = t.lift(value, x, rounded=True)  # a half's pad value is the half's (torch converts it)
    return v if v.dtype == x.dtype else t.add("cast", v, dtype=x.dtype)


def _signed(t, p):
    """(p, True) for a pad that adds (p >= 0), (p, False) for one that crops; a dynamic
    amount of unknown sign cannot be lowered."""
    if D.nonnegative(p):
        return p, True
    if D.nonnegative(-p):
        return p, False
    raise CaptureError(f"{t.op}: pad amount {D.fmt(p)} may be negative or positive" + (f" (at {t.loc})" if t.loc else "")
                       + "; its sign decides between padding and cropping")


@rule("stack")
def _stack(t, node, a):
    xs = a["tensors"]
    axis = a["dim"] % (xs[0].rank + 1)
    return concat(t, [unsqueeze(t, x, axis) for x in xs], axis)


@rule("gather")
def _gather(t, node, a):
    """torch.gather reads x[..., index[i], ...] at every position i of index, which may
    be shorter than x along the other axes (torch checks it is not longer): x is cut
    to index's extent there first."""
    x, index, axis = a["self"], a["index"], a["dim"] % a["self"].rank
    for d in range(x.rank):
        if d != axis and not D.equal(x.shape[d], index.shape[d]):
            x = t.add("slice", x, axis=d, start=D.dim(0), stop=index.shape[d], step=1)
    return t.add("gather", x, index, axis=axis)


@rule("index_select")
def _index_select(t, node, a):
    x, index = a["self"], a["index"]
    if index.rank == 0:  # index_select keeps the axis, of extent 1, where take would drop it
        index = t.add("reshape", index, shape=(1,))
    return t.add("take", x, index, axis=a["dim"] % x.rank)


@rule("embedding")
def _embedding(t, node, a):
    return t.add("take", a["weight"], a["indices"], axis=0)


@rule("flip", "prims.rev")
def _flip(t, node, a):
    """Each axis read backwards: take(x, n - 1 - i) over an iota of its extent n (a
    dynamic extent as a `size` value, an integer there)."""
    x = a.get("self", a.get("a"))
    if x.rank == 0:  # torch takes dim 0 (or -1) of a scalar: nothing to reverse
        return x
    for d in sorted({d % x.rank for d in a["dims"]}):
        n = x.shape[d]
        last = t.const(int(n) - 1, "i64") if n.is_number else \
            t.add("sub", t.add("size", value=n, dtype="i64"), t.const(1, "i64"))
        back = t.add("sub", last, t.add("iota", shape=(n,), axis=0, dtype="i64"))
        x = t.add("take", x, back, axis=d)
    return x


def _int_indices(a, n):
    import torch

    present = [(d, i) for d, i in enumerate(a["indices"]) if i is not None]
    if not present:
        return "indexing with no index tensor"
    for _, i in present:
        if i.dtype not in (torch.int64, torch.int32):
            return f"only integer index tensors are supported, not {i.dtype}"
    dims = [d for d, _ in present]
    if dims != list(range(dims[0], dims[0] + len(dims))):
        return "index tensors on axes that are not next to each other"
    return None


def from_the_end(t, i, extent):
    """Index entries counted from the end of an axis of `extent` where negative, as
    advanced indexing counts them."""
    return t.add("where", binary(t, "lt", i, 0), t.add("add", i, t.lift(extent, i)), i)


def merged_index(t, x, indices, dims):
    """Index tensors on the adjacent axes `dims` of x as one index into those axes merged,
    row-major (i * n_j + j, in the indices' broadcast shape), each counted from the end
    when negative; with whether each entry lies inside its axes, and the merged extent."""
    linear, inside, stride = None, None, sympy.Integer(1)
    for d, i in reversed(list(zip(dims, indices))):
        n = x.shape[d]
        i = from_the_end(t, i, n)
        ok = t.add("where", binary(t, "ge", i, 0), t.add("lt", i, t.lift(n, i)), t.const(False, "bool"))
        inside = ok if inside is None else t.add("where", inside, ok, t.const(False, "bool"))
        term = i if stride == 1 else t.add("mul", i, t.lift(stride, i))
        linear = term if linear is None else t.add("add", linear, term)
        stride = stride * n
    return linear, inside, stride


@rule("index.Tensor", check=_int_indices)
def _index_tensor(t, node, a):
    """x[i] along one axis is a take. x[i, j] (index tensors on adjacent axes, broadcast
    together: a row's last token, logits[arange(b), lengths - 1]) takes from those axes
    merged, at i * n_j + j, each index counted from the end when negative. An index
    outside its axis reads 0, as one past a single take's axis does (torch raises)."""
    x, idx = a["self"], a["indices"]
    dims = [d for d, i in enumerate(idx) if i is not None]
    if len(dims) == 1:
        return t.add("take", x, idx[dims[0]], axis=dims[0])
    linear, inside, stride = merged_index(t, x, [idx[d] for d in dims], dims)
    linear = t.add("where", inside, linear, t.lift(0, linear))
    merged = reshape(t, x, x.shape[:dims[0]] + (stride,) + x.shape[dims[-1] + 1:])
    taken = t.add("take", merged, linear, axis=dims[0])
    keep = reshape(t, inside, (D.dim(1),) * dims[0] + inside.shape + (D.dim(1),) * (x.rank - dims[-1] - 1))
    return t.add("where", keep, taken, t.lift(0, x))


# -- matmul family ---------------------------------------------------------------
def matmul(t, x, y):
    """torch.matmul, including its rank-1 rules (a vector gets a unit axis, dropped after)."""
    if x.dtype != y.dtype:  # torch's fake tensors accept it, its kernels do not
        raise CaptureError(f"{t.op}: operands have dtypes {x.dtype} and {y.dtype}"
                           + (f" (at {t.loc})" if t.loc else "") + "; torch's matmul needs equal dtypes")
    xv, yv = x.rank == 1, y.rank == 1
    if xv:
        x = unsqueeze(t, x, 0)
    if yv:
        y = unsqueeze(t, y, 1)
    batch = _batch_axes(x, y)
    if batch is not None:
        out = t.add("matmul", reshape(t, x, batch + x.shape[-2:]), reshape(t, y, batch + y.shape[-2:]))
        return reshape(t, out, x.shape[:-1] + y.shape[-1:])
    out = t.add("matmul", x, y)
    if xv or yv:
        shape = list(out.shape)
        if yv:
            del shape[-1]
        if xv:
            del shape[-1 if yv else -2]
        out = reshape(t, out, shape)
    return out


def _batch_axes(x, y):
    """The leading axes a bmm's batch merges, when an operand is a view of a tensor
    batched by them (aten's matmul views [b, h, m, k] as [b*h, m, k]); None otherwise.
    The product then keeps those axes, so the softmax after it stays in the layout the
    search's rules and the GQA regrouping match."""
    if x.rank != 3 or y.rank != 3:
        return None
    for v in (x, y):
        src = v.inputs[0] if v.op == "reshape" else v
        if src.rank >= 4 and all(D.equal(i, j) for i, j in zip(src.shape[-2:], v.shape[-2:])):
            return src.shape[:-2]
    return None


def _contraction_check(a, n):
    """Kernels contract in f32 (a tl.dot, or products summed in f32): an integer or f64
    product would come back rounded (int64 past 2**24, f64 to f32's 1e-7), so the
    backend leaves those to torch (the IR and its interpreter compute them exactly)."""
    val = n.meta.get("val")
    dtype = getattr(val, "dtype", None)
    if dtype is not None and (dtype == torch.float64 or not (dtype.is_floating_point or dtype.is_complex)):
        return f"a contraction on {str(dtype).removeprefix('torch.')} is computed in f32 by the kernels"
    return None


rule("matmul", "mm", "bmm", kernel_check=_contraction_check)(
    lambda t, n, a: matmul(t, a["self"], a["other"] if "other" in a else a["mat2"]))


@rule("linear", kernel_check=_contraction_check)
def _linear(t, node, a):
    out = matmul(t, a["input"], swap(t, a["weight"], -2, -1) if a["weight"].rank >= 2 else a["weight"])
    return out if a.get("bias") is None else t.add("add", out, a["bias"])


@rule("addmm", "baddbmm", "addmv", kernel_check=_contraction_check)
def _addmm(t, node, a):
    if a.get("alpha", 1) == 0 and "batch1" not in a:
        # addmm and addmv skip the product then (BLAS): a NaN or inf in it does not
        # propagate; baddbmm computes it on the CPU
        if a.get("beta", 1) == 0:
            return fill(t, node, 0)
        kept = a["self"] if a.get("beta", 1) == 1 else binary(t, "mul", a["self"], a["beta"])
        return broadcast(t, kept, t.out_shape(node))
    left, right = next((a[x], a[y]) for x, y in (("mat1", "mat2"), ("batch1", "batch2"), ("mat", "vec")) if x in a)
    prod = matmul(t, left, right)
    if a.get("alpha", 1) != 1:
        prod = binary(t, "mul", prod, a["alpha"])
    if a.get("beta", 1) == 0:  # torch ignores the input then: a NaN or inf in it does not propagate
        return prod
    bias = a["self"] if a.get("beta", 1) == 1 else binary(t, "mul", a["self"], a["beta"])
    return t.add("add", bias, prod)


@rule("einsum", kernel_check=_contraction_check)
def _einsum(t, node, a):
    from .einsum import einsum

    return einsum(t, a["equation"], list(a["tensors"]))

