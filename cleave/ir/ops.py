"""The IR's operators: the one table of op names, arities, kinds and attributes, and
their symbolic shape inference.

Each op is described once here. The graph builder and the text form read the specs;
the DSL, the search's encoding, the verifier, the frontends and codegen read the
names by kind. A table elsewhere that holds one entry per op of a kind (the
interpreter's semantics, codegen's rendering) is built with `per_op`, which names
the ops it lacks at import: adding an op starts in this file, and the import errors
list what else it needs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import sympy

from . import dims as D
from .dims import Dim
from .dtypes import DType, promote
from .errors import DimMismatch, ShapeError

# The elementwise vocabulary, by kind; the structural ops are registered at the end.
UNARY = ("exp", "exp2", "log", "sqrt", "rsqrt", "neg", "recip", "silu", "sigmoid", "tanh",
         "square", "cos", "sin", "abs", "erf", "log1p", "expm1", "inf_to_zero",
         "floor", "ceil", "trunc", "round", "sign", "erfinv", "erfc",
         "bit_not")  # ~x of an integer or bool
BINARY = ("add", "sub", "mul", "div", "max", "min", "pow", "fmod",  # fmod: C's, exact (torch.fmod)
          "idiv",  # integer division truncated toward 0 (C's; torch.div(rounding_mode="trunc"))
          "atan2", "hypot", "copysign",  # torch's: atan2(y, x); copysign reads b's sign bit (-0.0, -NaN)
          "bit_and", "bit_or", "bit_xor", "shl", "shr")  # of integers; shr is arithmetic on signed ones
# Ops of integers (and bools, but for the shifts), never of floats.
BITWISE = ("bit_not", "bit_and", "bit_or", "bit_xor", "shl", "shr")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
# ops one rounding of their operand may move a step
STEPS = ("floor", "ceil", "trunc", "round", "sign")


def reads_half_rounded(op: str, dtype) -> bool:
    """Whether an op of this result dtype reads a half operand rounded to its type, where
    a wider value is held for it (fp64 in the reference, f32 in the kernels): a compare,
    a cast to an integer or bool, a step, fmod (a remainder moves by its divisor where its
    operand moves a step). torch's eager rounds at every half op, and there one rounding
    turns into another answer (an f16 x * 1024 past 65504 is inf; fmod(27.98, 4) is 3.98
    where bf16's 28 gives 0)."""
    return op in COMPARE or op in STEPS or op == "fmod" or op == "cast" and not dtype.is_float


def half_read(node) -> "DType | None":
    """The half type an op that reads its operands rounded (`reads_half_rounded`) reads
    operand `node` in: its own, or the half type a widening cast took it from, as torch
    widens the rounded value (`torch.sgn` and `nan_to_num` of a half tensor compare its
    f32 copy: an f16 1e5 held in f32 was finite to nan_to_num, and stored as inf)."""
    if node.dtype in (DType.bf16, DType.f16):
        return node.dtype
    if node.op == "cast" and node.dtype.is_float and node.inputs[0].dtype in (DType.bf16, DType.f16):
        return node.inputs[0].dtype
    return None
REDUCE_OPS = ("sum", "max", "min", "prod")  # the `op` attribute of `reduce`
# log2(e) as the float the rules write and the kernels use: exp(x) = exp2(x * LOG2E).
LOG2E = 1 / math.log(2.0)
KINDS = {"unary": UNARY, "binary": BINARY, "compare": COMPARE, "reduce": REDUCE_OPS}

# Attribute kinds, used by the text form to print and parse values.
ATTR_KINDS = ("str", "int", "float", "dim", "shape", "ints", "dtype")


@dataclass(frozen=True)
class Result:
    shape: tuple[Dim, ...]
    dtype: DType
    constraints: tuple = ()


@dataclass(frozen=True)
class OpSpec:
    name: str
    arity: int | None  # None: variadic
    attrs: tuple[tuple[str, str], ...]  # (name, kind)
    infer: Callable[..., Result]


SPECS: dict[str, OpSpec] = {}


def _register(name, arity, attrs, infer):
    SPECS[name] = OpSpec(name, arity, tuple(attrs), infer)


def per_op(impls: dict, *kinds: str, where: str) -> dict:
    """`impls`, checked to hold exactly one entry per op of `kinds` (keys of KINDS)."""
    names = [n for k in kinds for n in KINDS[k]]
    missing, unknown = [n for n in names if n not in impls], [n for n in impls if n not in names]
    if missing or unknown:
        raise KeyError(f"{where}: the {'/'.join(kinds)} ops of cleave/ir/ops.py and this table differ: "
                       f"missing {missing}, unknown {unknown}")
    return impls


def _fail(op: str, message: str):
    raise ShapeError(f"{op}: {message}")


def broadcast_shapes(op: str, shapes: Sequence[tuple[Dim, ...]]) -> tuple[Dim, ...]:
    """Right-aligned broadcasting; dims must be equal or 1 (symbolic dims are never 1)."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        chosen, owner = None, None
        for k, s in enumerate(shapes):
            j = len(s) - rank + i
            if j < 0 or D.is_one(s[j]):
                continue
            if chosen is None:
                chosen, owner = s[j], k
            elif not D.equal(chosen, s[j]):
                raise DimMismatch(f"{op}: operand {owner} has shape {D.fmt_shape(shapes[owner])}, "
                                  f"operand {k} has shape {D.fmt_shape(s)}: "
                                  f"dim {i} is {D.fmt(chosen)} vs {D.fmt(s[j])}", (chosen, s[j]))
        out.append(chosen if chosen is not None else D.dim(1))
    return tuple(out)


def _axis(op: str, axis: int, rank: int, operand: str = "operand 0") -> int:
    if not -rank <= axis < max(rank, 1):
        _fail(op, f"axis {axis} is out of range for {operand} of rank {rank}")
    return axis % rank if rank else 0


def _infer_input(*, name, shape, dtype):
    return Result(tuple(shape), dtype)


def _infer_const(*, value, dtype):
    if dtype.is_int:
        low, high = dtype.int_range
        if not (isinstance(value, int) or float(value).is_integer()) or not low <= value <= high:
            _fail("const", f"{value!r} is not a value of {dtype} ({low}..{high}); "
                           f"wrap or round it first, or give the const a float type")
    return Result((), dtype)


def _infer_size(*, value, dtype):
    return Result((), dtype)


def _infer_iota(*, shape, axis, dtype):
    _axis("iota", axis, len(shape), "its shape")
    return Result(tuple(shape), dtype, _extents_nonnegative("iota", shape))


# Unary ops torch computes in floating point: of an integer or bool operand they give
# torch's default float type (torch.exp(int32) is float32), as the kernels compute them.
FLOAT_UNARY = ("exp", "exp2", "log", "sqrt", "rsqrt", "recip", "silu", "sigmoid", "tanh",
               "cos", "sin", "erf", "log1p", "expm1", "erfinv", "erfc")


def _make_unary(op):
    def infer(x):
        _bitwise_operands(op, x.dtype)
        if op in FLOAT_UNARY and not x.dtype.is_float:
            return Result(x.shape, DType.f32)
        return Result(x.shape, x.dtype)
    return infer


def _bitwise_operands(op: str, dtype: DType) -> None:
    if op in BITWISE and (dtype.is_float or (dtype == DType.bool and op in ("shl", "shr"))):
        _fail(op, f"takes {'integer' if op in ('shl', 'shr') else 'integer or bool'} operands, not {dtype}")


def _infer_cast(x, *, dtype):
    return Result(x.shape, dtype)


def _make_binary(op):
    def infer(a, b):
        dtype = promote(a.dtype, b.dtype)
        if op == "idiv" and (dtype.is_float or dtype == DType.bool):
            _fail(op, f"divides integers, not {dtype}")
        if op in ("atan2", "hypot", "copysign") and not dtype.is_float:
            _fail(op, f"takes floating-point operands, not {dtype} (cast them first, as torch does)")
        if op == "pow" and not dtype.is_float:  # the kernels' pow is a float function (exp2 and log2)
            _fail(op, f"of {dtype} operands is not supported: the kernels compute pow in floats "
                      f"(cast to a float type first, or write x * x for a small integer power)")
        _bitwise_operands(op, dtype)
        return Result(broadcast_shapes(op, [a.shape, b.shape]), dtype)
    return infer


def _make_compare(op):
    def infer(a, b):
        return Result(broadcast_shapes(op, [a.shape, b.shape]), DType.bool)
    return infer


def _infer_where(cond, a, b):
    if cond.dtype != DType.bool:
        _fail("where", f"operand 0 (the condition) must be bool, not {cond.dtype}")
    return Result(broadcast_shapes("where", [cond.shape, a.shape, b.shape]), promote(a.dtype, b.dtype))


def _infer_matmul(a, b):
    if len(a.shape) < 2 or len(b.shape) < 2:
        _fail("matmul", f"operands need rank >= 2, got {D.fmt_shape(a.shape)} and {D.fmt_shape(b.shape)}")
    k1, k2 = a.shape[-1], b.shape[-2]
    if not D.equal(k1, k2):
        raise DimMismatch(f"matmul: operand 0 has shape {D.fmt_shape(a.shape)}, operand 1 has shape "
                          f"{D.fmt_shape(b.shape)}: contracted dims {D.fmt(k1)} vs {D.fmt(k2)}", (k1, k2))
    batch = broadcast_shapes("matmul", [a.shape[:-2], b.shape[:-2]])
    return Result(batch + (a.shape[-2], b.shape[-1]), promote(a.dtype, b.dtype))


def _infer_reduce(x, *, op, axis, keepdim):
    if op not in REDUCE_OPS:
        _fail("reduce", f"unknown reduction {op!r}; expected one of {', '.join(REDUCE_OPS)}")
    a = _axis("reduce", axis, len(x.shape))
    shape = list(x.shape)
    if keepdim:
        shape[a] = D.dim(1)
    else:
        del shape[a]
    # a sum of bools counts them (torch.sum gives int64): a bool result would keep only 0/1
    return Result(tuple(shape), DType.i64 if op == "sum" and x.dtype == DType.bool else x.dtype)


def _infer_broadcast(x, *, shape):
    target = tuple(shape)
    if len(target) < len(x.shape):
        _fail("broadcast", f"operand 0 has shape {D.fmt_shape(x.shape)}, target {D.fmt_shape(target)} has lower rank")
    pad = len(target) - len(x.shape)
    for i, d in enumerate(x.shape):
        if not (D.is_one(d) or D.equal(d, target[pad + i])):
            raise DimMismatch(f"broadcast: operand 0 has shape {D.fmt_shape(x.shape)}, target "
                              f"{D.fmt_shape(target)}: dim {i} is {D.fmt(d)} vs {D.fmt(target[pad + i])}",
                              (d, target[pad + i]))
    return Result(target, x.dtype, _extents_nonnegative("broadcast", target))


def _extents_nonnegative(op: str, shape) -> tuple:
    """A constraint per extent not provably >= 0 (`torch.ones(T, L - T)`, a prefix mask
    beside a past of L - T keys): a binding where it is negative has no such tensor."""
    return tuple(("le", D.dim(0), D.dim(d), op) for d in shape if not D.nonnegative(D.dim(d)))


def _product(shape):
    return math.prod(shape, start=D.dim(1))


def _infer_reshape(x, *, shape):
    before, after = _product(x.shape), _product(shape)
    if D.equal(before, after):
        return Result(tuple(shape), x.dtype)
    if before.is_number and after.is_number:
        _fail("reshape", f"operand 0 has shape {D.fmt_shape(x.shape)} ({before} elements), "
                         f"target {D.fmt_shape(shape)} has {after}")
    gap = sympy.expand(before - after)
    if gap.is_number:  # 8*s against 8*s + 8: no binding
        _fail("reshape", f"operand 0 has shape {D.fmt_shape(x.shape)} ({D.fmt(before)} elements), target "
                         f"{D.fmt_shape(shape)} has {D.fmt(after)}: never equal")
    ratio = before / after if not after.is_zero else None  # sympy cancels common factors itself
    if ratio is not None and ratio.is_number and ratio != 1:  # 8*s against 3*s: no binding but empties
        _fail("reshape", f"operand 0 has shape {D.fmt_shape(x.shape)} ({D.fmt(before)} elements), target "
                         f"{D.fmt_shape(shape)} has {D.fmt(after)}: equal only where both are empty")
    # Symbolic and not provably equal: the binding must satisfy it.
    return Result(tuple(shape), x.dtype, (("eq", before, after, "reshape"),))


def _infer_permute(x, *, perm):
    if sorted(perm) != list(range(len(x.shape))):
        _fail("permute", f"{list(perm)} is not a permutation of the {len(x.shape)} axes of operand 0 "
                         f"(shape {D.fmt_shape(x.shape)})")
    return Result(tuple(x.shape[p] for p in perm), x.dtype)


def _infer_slice(x, *, axis, start, stop, step):
    """Python's x[start:stop:step] along one axis: floor((stop - start + step - 1) / step)
    elements (the form torch's shapes take)."""
    a = _axis("slice", axis, len(x.shape))
    extent = x.shape[a]
    if step < 1:
        _fail("slice", f"step {step} must be >= 1")
    span = D.dim(stop) - D.dim(start)
    if (span.is_number and span < 0) or span.is_negative:
        _fail("slice", f"stop {D.fmt(stop)} is before start {D.fmt(start)}")
    length = span if step == 1 else sympy.floor((span + step - 1) / step)
    if (stop - extent).is_number and stop - extent > 0:
        _fail("slice", f"stop {D.fmt(stop)} is past dim {a} of operand 0 (shape {D.fmt_shape(x.shape)})")
    shape = list(x.shape)
    shape[a] = length
    cons = () if (extent - stop).is_number else (("le", stop, extent, "slice"),)
    if not D.nonnegative(span):  # x["m":2] holds where m <= 2 only: an extent is never negative
        cons += (("le", D.dim(start), D.dim(stop), "slice"),)
    if not D.nonnegative(D.dim(start)):  # x["n-3":] holds where n >= 3 only: a start is an index, not Python's -1
        cons += (("le", D.dim(0), D.dim(start), "slice"),)
    return Result(tuple(shape), x.dtype, cons)


def _infer_concat(*xs, axis):
    first = xs[0]
    a = _axis("concat", axis, len(first.shape))
    total = D.dim(0)
    dtype = first.dtype
    for k, x in enumerate(xs):
        if len(x.shape) != len(first.shape):
            _fail("concat", f"operand 0 has shape {D.fmt_shape(first.shape)}, operand {k} has shape "
                            f"{D.fmt_shape(x.shape)}: ranks differ")
        for i, (d0, dk) in enumerate(zip(first.shape, x.shape)):
            if i != a and not D.equal(d0, dk):  # a DimMismatch: the capture may read one symbol as the other
                raise DimMismatch(f"concat: operand 0 has shape {D.fmt_shape(first.shape)}, operand {k} has shape "
                                  f"{D.fmt_shape(x.shape)}: dim {i} is {D.fmt(d0)} vs {D.fmt(dk)}", (d0, dk))
        total += x.shape[a]
        dtype = promote(dtype, x.dtype)
    shape = list(first.shape)
    shape[a] = total
    return Result(tuple(shape), dtype)


def _check_index(op, index):
    if not index.dtype.is_int:
        _fail(op, f"operand 1 (the index) must be an integer tensor, not {index.dtype}")


def _infer_gather(x, index, *, axis):
    """torch.gather: out[i][j] = x[i][index[i][j]] along axis; out has index's shape."""
    _check_index("gather", index)
    a = _axis("gather", axis, len(x.shape))
    if len(index.shape) != len(x.shape):
        _fail("gather", f"operand 0 has shape {D.fmt_shape(x.shape)}, operand 1 has shape "
                        f"{D.fmt_shape(index.shape)}: ranks differ")
    for i, (dx, di) in enumerate(zip(x.shape, index.shape)):
        if i != a and not D.equal(dx, di):
            _fail("gather", f"operand 0 has shape {D.fmt_shape(x.shape)}, operand 1 has shape "
                            f"{D.fmt_shape(index.shape)}: dim {i} is {D.fmt(dx)} vs {D.fmt(di)}")
    return Result(index.shape, x.dtype)


def _infer_take(x, index, *, axis):
    """index_select generalised to any index rank (paged KV: cache[page_table])."""
    _check_index("take", index)
    a = _axis("take", axis, len(x.shape))
    return Result(x.shape[:a] + index.shape + x.shape[a + 1:], x.dtype)


def _infer_topk(x, *, k, axis, which):
    a = _axis("topk", axis, len(x.shape))
    if which not in ("values", "indices"):
        _fail("topk", f"which must be 'values' or 'indices', not {which!r}")
    n = x.shape[a]
    if n.is_number and k > n:
        _fail("topk", f"k={k} exceeds dim {a} ({D.fmt(n)}) of operand 0 (shape {D.fmt_shape(x.shape)})")
    shape = list(x.shape)
    shape[a] = D.dim(k)
    cons = () if n.is_number else (("le", D.dim(k), n, "topk"),)
    return Result(tuple(shape), x.dtype if which == "values" else DType.i64, cons)


def _infer_split(x, *, axis, count, pad):
    """Axis of extent N becomes (count, cdiv(N, count)); the tail of the last chunks
    holds `pad` (the neutral element of the reduction that follows). Without a pad,
    count must divide N."""
    a = _axis("split", axis, len(x.shape))
    if D.dim(count).is_number and D.dim(count) < 1:
        _fail("split", f"count {D.fmt(count)} must be >= 1 (operand 0 has shape {D.fmt_shape(x.shape)})")
    n = x.shape[a]
    inner = D.cdiv(n, count)
    cons = ()
    if pad is None:
        inner = n / count
        cons = (("divides", count, n, "split"),)
    return Result(x.shape[:a] + (count, inner) + x.shape[a + 1:], x.dtype, cons)


_register("input", 0, [("name", "str"), ("shape", "shape"), ("dtype", "dtype")], _infer_input)
_register("const", 0, [("value", "float"), ("dtype", "dtype")], _infer_const)
_register("size", 0, [("value", "dim"), ("dtype", "dtype")], _infer_size)
_register("iota", 0, [("shape", "shape"), ("axis", "int"), ("dtype", "dtype")], _infer_iota)
for _name in UNARY:
    _register(_name, 1, [], _make_unary(_name))
_register("cast", 1, [("dtype", "dtype")], _infer_cast)
for _name in BINARY:
    _register(_name, 2, [], _make_binary(_name))
for _name in COMPARE:
    _register(_name, 2, [], _make_compare(_name))
_register("where", 3, [], _infer_where)
_register("matmul", 2, [], _infer_matmul)
_register("reduce", 1, [("op", "str"), ("axis", "int"), ("keepdim", "int")], _infer_reduce)
_register("broadcast", 1, [("shape", "shape")], _infer_broadcast)
_register("reshape", 1, [("shape", "shape")], _infer_reshape)
_register("permute", 1, [("perm", "ints")], _infer_permute)
_register("slice", 1, [("axis", "int"), ("start", "dim"), ("stop", "dim"), ("step", "int")], _infer_slice)
_register("concat", None, [("axis", "int")], _infer_concat)
_register("gather", 2, [("axis", "int")], _infer_gather)
_register("take", 2, [("axis", "int")], _infer_take)
_register("topk", 1, [("k", "int"), ("axis", "int"), ("which", "str")], _infer_topk)
_register("split", 1, [("axis", "int"), ("count", "dim"), ("pad", "float")], _infer_split)
