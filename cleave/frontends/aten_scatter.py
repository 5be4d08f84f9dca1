"""Writes at indices (index_put, scatter, scatter_add) as reads: each element of the
result looks up the last index entry naming its position, takes that entry's value, and
keeps its own where none does. A boolean mask is a `where`.

The kernels compare every position with every index entry, so the index must be short
where the comparison runs per element (scatter along an axis, accumulating writes): past
SHORT_INDEX entries, or of a size only known at run time, those stay eager. A write into
an input (a KV cache's `index_copy_`, `k_cache[:, :, pos] = k`) stays eager too: torch
writes those rows alone, where the result of a kernel is a whole new tensor, copied back.
"""
from __future__ import annotations

import math

import torch

from ..ir import dims as D
from ..ir.dtypes import DType
from .aten_elementwise import _cast, binary
from .aten_layout import broadcast, from_the_end, merged_index, reaches, reshape, unsqueeze
from .aten_map import rule
from .scalar_ranges import converting

SHORT_INDEX = 256  # index entries compared per element of the result
# node.meta key: the value is an input's new value (capture._mark_written_back)
WRITTEN_BACK = "cleave_written_back"


def _into_an_input(n) -> bool:
    """Whether the op writes into a graph input in place: its destination is an input (or
    a view of one), and its result is the input's new value, directly or scattered back
    into the input's base (`cache[0].index_copy_`): functionalized, torch.export returns
    that value as an input mutation (capture marks it WRITTEN_BACK). A functional
    `torch.scatter(x, ...)`, returned or read further, compiles."""
    if n is None or not n.args:
        return False
    dest = n.args[0]
    while isinstance(dest, torch.fx.Node) and dest.op == "call_function" \
            and isinstance(dest.target, torch._ops.OpOverload) and dest.target.is_view:
        dest = dest.args[0]
    if not (isinstance(dest, torch.fx.Node) and dest.op == "placeholder"):
        return False
    return reaches(n, lambda user: isinstance(user.target, torch._ops.OpOverload)
                   and user.target._schema.name.endswith("_scatter"), lambda node: node.meta.get(WRITTEN_BACK, False))


def _short(extent, what: str) -> str | None:
    if not isinstance(extent, int):
        return f"{what} has a size known only at run time; each element would compare with all of it"
    if extent > SHORT_INDEX:
        return f"{what} has {extent} entries (over {SHORT_INDEX}); each element would compare with all of them"
    return None


def _broadcasts(shape, onto) -> bool:
    """Whether `shape` broadcasts to `onto` (right-aligned, without growing it)."""
    if len(shape) > len(onto):
        return False
    return all(s == 1 or s == o for s, o in zip(reversed(shape), reversed(onto)))


def _index_put_check(a, n):
    if _into_an_input(n):
        return "a write into an input stays eager: torch writes those elements alone"
    axes = [d for d, i in enumerate(a["indices"]) if i is not None]
    index, values = a["indices"][axes[0]], a["values"]
    if index.dtype == torch.uint8:
        return "a uint8 mask (torch refuses it)"
    if values.dtype != a["self"].dtype:
        return f"values of {values.dtype} written into {a['self'].dtype} (torch refuses it)"
    if index.dtype == torch.bool:
        if len(axes) > 1:
            return "a mask beside other indices"
        trailing = a["self"].shape[axes[0] + index.dim():]
        if values.numel() != 1 and not _broadcasts(values.shape, trailing):
            return "values assigned through a mask one by one (a where takes one value, or one per trailing element)"
        return None
    if axes != list(range(axes[0], axes[0] + len(axes))):
        return "index tensors on axes that are not next to each other"
    if a.get("accumulate"):
        return _short(torch.broadcast_shapes(*(a["indices"][d].shape for d in axes)).numel(), "the index")
    return None


@rule("index_put", check=_index_put_check)
def _index_put(t, node, a):
    """x[..., i, ...] = v: by a boolean mask (its leading axes from there), where(mask, v,
    x), v one value or one per trailing element
    (`x[pad] = embedding`); by integer indices (on one axis, or several adjacent ones
    merged), each position takes the value of the last entry naming it (negative ones
    count from the end), or with `accumulate` adds them all."""
    x, values = a["self"], a["values"]
    axes = [d for d, i in enumerate(a["indices"]) if i is not None]
    axis, last = axes[0], axes[-1]
    values = _cast(t, values, x.dtype)
    index = a["indices"][axis]
    if index.dtype == DType.bool:
        mask = reshape(t, index, (D.dim(1),) * axis + index.shape + (D.dim(1),) * (x.rank - axis - index.rank))
        value = reshape(t, values, ()) if values.rank and math.prod(values.shape) == 1 else values
        return t.add("where", mask, t.add("add", x, value) if a.get("accumulate") else value, x)
    index, entries = _merged_index(t, x, [a["indices"][d] for d in axes], axes)
    merged = math.prod(x.shape[axis:last + 1], start=D.dim(1))
    at = x.shape[:axis] + entries + x.shape[last + 1:]
    values = broadcast(t, reshape(t, values, (D.dim(1),) * (len(at) - values.rank) + values.shape), at)
    flat = math.prod(entries, start=D.dim(1))
    index = reshape(t, index, (flat,))
    values = reshape(t, values, x.shape[:axis] + (flat,) + x.shape[last + 1:])
    flat_x = reshape(t, x, x.shape[:axis] + (merged,) + x.shape[last + 1:])
    return reshape(t, _write_along(t, flat_x, axis, index, values, bool(a.get("accumulate"))), x.shape)


def _along_check(accumulating: bool):
    def check(a, n):
        if _into_an_input(n):
            return "a write into an input stays eager: torch writes those elements alone"
        x, index, source = a["self"], a["index"], a.get("source")
        if x.dim() == 0 or index.dim() != 1:
            return "a 0-d destination or an index that is not 1-d"
        if source is not None and source.dtype != x.dtype:
            return f"a source of {source.dtype} written into {x.dtype} (torch refuses it)"
        return _short(index.shape[0], "the index") if accumulating else None
    return check


@rule("index_copy", check=_along_check(accumulating=False))
@converting("index_fill", scalars=("value",), tensors=True, check=_along_check(accumulating=False))
@rule("index_add", check=_along_check(accumulating=True))
def _index_along(t, node, a):
    """index_copy, index_add (times alpha) and index_fill along `dim` with a 1-d index:
    index_put's write on one axis (the last entry naming a position wins; index_add adds
    them all)."""
    x, index = a["self"], a["index"]
    axis = a["dim"] % x.rank
    name = node.target._schema.name.split("::")[-1]
    if name == "index_fill":
        value = a["value"]
        value = _cast(t, value if hasattr(value, "graph") else t.lift(value, x, rounded=True), x.dtype)
        values = broadcast(t, reshape(t, value, (D.dim(1),) * x.rank),
                           x.shape[:axis] + index.shape + x.shape[axis + 1:])
    else:
        values = a["source"]
        if a.get("alpha", 1) != 1:
            values = _cast(t, binary(t, "mul", values, a["alpha"]), x.dtype)
    return _write_along(t, x, axis, index, values, accumulate=name == "index_add")


def _merged_index(t, x, indices, axes):
    """Index tensors on adjacent axes as one index into those axes merged, and its shape.
    An entry outside its axis gets the merged extent, which names no position (merged, it
    would alias another row)."""
    if len(indices) == 1:
        return indices[0], indices[0].shape
    linear, inside, extent = merged_index(t, x, indices, axes)
    return t.add("where", inside, linear, t.lift(extent, linear)), linear.shape


def _write_along(t, x, axis, index, values, accumulate: bool):
    """x with position k of `axis` replaced by values[..., j, ...] for the last j where
    index[j] names k (index 1-d, its entries along `axis` of values), or with every
    such j added."""
    extent, entries = x.shape[axis], index.shape[0]
    if entries.is_number and int(entries) == 0:  # nothing written (a take from nothing has no value)
        return x
    index = from_the_end(t, index, extent)
    hits = t.add("eq", reshape(t, index, (D.dim(1), entries)), t.add("iota", shape=(extent, D.dim(1)), axis=0,
                                                                       dtype=index.dtype.value))
    last = _last_hit(t, hits, t.add("iota", shape=(D.dim(1), entries), axis=1, dtype="i64"), axis=1)
    written = reshape(t, t.add("ge", last, t.const(0, "i64")),
                      (D.dim(1),) * axis + (extent,) + (D.dim(1),) * (x.rank - axis - 1))
    if accumulate:
        grid = reshape(t, hits, (D.dim(1),) * axis + (extent, entries) + (D.dim(1),) * (x.rank - axis - 1))
        added = t.add("reduce", t.add("where", grid, unsqueeze(t, values, axis), t.lift(0, values)),
                      op="sum", axis=axis + 1, keepdim=0)
        return t.add("where", written, t.add("add", x, _cast(t, added, x.dtype)), x)
    taken = t.add("take", values, t.add("max", last, t.const(0, "i64")), axis=axis)
    return t.add("where", written, taken, x)


def _last_hit(t, hits, positions, axis):
    """Per row, the largest position along `axis` where `hits` holds, or -1."""
    found = t.add("where", hits, positions, t.const(-1, "i64"))
    return t.add("reduce", found, op="max", axis=axis, keepdim=0)


def _scatter_check(a, n):
    if _into_an_input(n):
        return "a write into an input stays eager: torch writes those elements alone"
    x, index = a["self"], a["index"]
    if x.dim() == 0:
        return "a scatter into a 0-d tensor"
    axis = a["dim"] % x.dim()
    if index.dim() != x.dim() or any(index.shape[d] != x.shape[d] for d in range(x.dim()) if d != axis):
        return "an index narrower than its destination off the scattered axis"
    return _short(index.shape[axis], "the index along the scattered axis")


@rule("scatter.src", "scatter_add", check=_scatter_check)
@converting("scatter.value", scalars=("value",), check=_scatter_check)
def _scatter(t, node, a):
    """torch.scatter (the last write of a position wins) and scatter_add along `dim`:
    out[..., k, ...] reads the entries of index's row equal to k."""
    x, index = a["self"], a["index"]
    axis = a["dim"] % x.rank
    src = a.get("src", a.get("value"))
    if not hasattr(src, "graph"):
        src = t.lift(src, x, rounded=True)
    src = _cast(t, src, x.dtype)
    if src.rank:
        for d in range(src.rank):
            if not D.equal(src.shape[d], index.shape[d]):
                src = t.add("slice", src, axis=d, start=D.dim(0), stop=index.shape[d], step=1)
    else:
        src = broadcast(t, reshape(t, src, (D.dim(1),) * index.rank), index.shape)
    extent, entries = x.shape[axis], index.shape[axis]
    index = from_the_end(t, index, extent)
    grid = t.add("eq", unsqueeze(t, index, axis),
                 t.add("iota", shape=(D.dim(1),) * axis + (extent, D.dim(1)) + (D.dim(1),) * (x.rank - axis - 1),
                       axis=axis, dtype=index.dtype.value))
    positions = t.add("iota", shape=(D.dim(1),) * (axis + 1) + (entries,) + (D.dim(1),) * (x.rank - axis - 1),
                      axis=axis + 1, dtype="i64")
    last = _last_hit(t, grid, positions, axis=axis + 1)
    written = t.add("ge", last, t.const(0, "i64"))
    if node.target._schema.name.endswith("scatter_add"):
        added = t.add("reduce", t.add("where", grid, unsqueeze(t, src, axis), t.lift(0, src)),
                      op="sum", axis=axis + 1, keepdim=0)
        out = t.add("where", written, t.add("add", x, _cast(t, added, x.dtype)), x)
    else:
        out = t.add("where", written, t.add("gather", src, t.add("max", last, t.const(0, "i64")), axis=axis), x)
    return out
