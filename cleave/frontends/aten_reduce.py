"""Reductions and the composite ops built on them: sum/mean/prod/amax/amin/var/std,
softmax (as *safe* softmax, exactly the workloads' `safe_softmax`), log_softmax,
logsumexp, topk."""
from __future__ import annotations

import math

import sympy
import torch

from ..interpreter import TORCH_DTYPES
from ..ir import dims as D
from ..ir.dtypes import DType
from ..ir.graph import Constraint

from .aten_elementwise import binary, floats_only
from .aten_layout import unsqueeze
from .aten_map import rule
from .errors import CaptureError


def axes(dims, rank: int) -> list[int]:
    """Normalized reduction axes; None or [] means every axis."""
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return list(range(rank))
    dims = [dims] if isinstance(dims, int) else dims
    if rank == 0:  # a 0-d tensor's dim 0 or -1: over nothing, as torch reduces it
        return []
    return sorted({d % rank for d in dims})


def reduce(t, x, op: str, dims: list[int], keepdim: bool):
    for axis in sorted(dims, reverse=True):  # last first, so earlier axis numbers stay valid
        x = t.add("reduce", x, op=op, axis=axis, keepdim=bool(keepdim))
    return x


def count(t, x, dims: list[int], minus=0):
    """The number of elements reduced over, as a scalar of x's dtype (a `size` node
    when symbolic, like the DSL's mean)."""
    n = math.prod((x.shape[d] for d in dims), start=sympy.Integer(1)) - minus
    if n.is_number:
        return t.const(float(max(n, 0)), x.dtype)  # torch divides by max(0, n - correction): 0/0 is NaN
    size = t.add("size", value=n, dtype=x.dtype)
    return t.add("max", size, t.const(0.0, x.dtype)) if minus else size


def _cast_arg(t, x, dtype):
    return x if dtype is None else t.add("cast", x, dtype=str(dtype))


def _widened(t, node, x):
    """An integer or bool operand of a sum or product in torch's result type (int64): the
    reduction then runs in it, as torch's does, and an int32 sum past 2^31 does not wrap."""
    want = node.meta["val"].dtype
    if x.dtype.is_float or want.is_floating_point or TORCH_DTYPES[x.dtype] == want:
        return x
    return _cast_arg(t, x, want)


@rule("sum")
def _sum(t, node, a):
    x = _widened(t, node, _cast_arg(t, a["self"], a.get("dtype")))
    return reduce(t, x, "sum", axes(a.get("dim"), x.rank), a.get("keepdim", False))


@rule("mean")
def _mean(t, node, a):
    x = _cast_arg(t, a["self"], a.get("dtype"))
    dims = axes(a.get("dim"), x.rank)
    n = count(t, x, dims)  # before the sum, as the DSL's mean builds it (graph keys follow node order)
    return t.add("div", reduce(t, x, "sum", dims, a.get("keepdim", False)), n)


def _extreme(op):
    def fn(t, node, a):
        x = a["self"]
        dims = axes(a.get("dim"), x.rank)
        _refuse_empty(t, x, dims)
        return reduce(t, x, op, dims, a.get("keepdim", False))
    return fn


def _refuse_empty(t, x, dims) -> None:
    """A max over nothing raises in eager: a call with an empty axis runs eagerly."""
    for axis in dims:
        if x.shape[axis] == 0:  # traced static at 0 (torch's meta kernel lets it through)
            raise CaptureError(f"{t.op} over axis {axis}, which is empty: eager refuses a max over nothing")
        if not x.shape[axis].is_number:
            where = f" at {t.loc}" if t.loc else ""
            t.graph._constrain(Constraint("le", D.dim(1), x.shape[axis],
                                          f"{t.op} over axis {axis}, which eager refuses empty{where}"))


def _float_result(a, n):
    dtype = n.meta["val"].dtype
    return None if dtype.is_floating_point else f"a product in {dtype} is not supported (kernels multiply in f32)"


@rule("prod", check=_float_result)
def _prod(t, node, a):
    x = _cast_arg(t, a["self"], a.get("dtype"))
    dims = axes(a.get("dim"), x.rank)
    return reduce(t, x, "prod", dims, a.get("keepdim", False))


rule("amax", "max.default")(_extreme("max"))
rule("amin", "min.default")(_extreme("min"))


def _prim_reduction(op):
    """prims.sum/prod/amax/amin, what PyTorch's own decompositions leave (cumsum and
    cumprod are a sum or product over a triangular mask): no keepdim, and the result in
    `output_dtype` where one is given."""
    def fn(t, node, a):
        x = _widened(t, node, a["inp"]) if op in ("sum", "prod") else a["inp"]
        out = reduce(t, x, op, axes(a.get("dims"), x.rank), False)
        dtype = a.get("output_dtype")
        return out if dtype is None else _cast_arg(t, out, dtype)
    return fn


rule("prims.sum")(_prim_reduction("sum"))
rule("prims.prod", check=_float_result)(_prim_reduction("prod"))
rule("prims.amax")(_prim_reduction("max"))
rule("prims.amin")(_prim_reduction("min"))


def variance(t, x, dims, correction, keepdim):
    """The variance as (v, scale), the variance being v * scale^2 and the std sqrt(v) * scale.

    Two passes, corrected for the mean's rounding: with d = x - mean, Σd² - (Σd)²/n.
    The plain Σd² of an f32-rounded mean was 5e-3 relative off on rows of 1e6 ± 1,
    where torch's is exact to f32's rounding. The deviations are squared in units of
    the row's largest |x| (the scale, read in the mean's pass): torch accumulates in
    f64 on the CPU, where f32 squares overflow past 1.8e19 (a finite std came out inf)
    and underflow below 1e-19 (a std of 1e-30 came out 0). Left as torch.mean's in
    f32: a row whose sum overflows (|mean| past 3.4e38 / n) is NaN."""
    n = count(t, x, dims)
    d = t.add("sub", x, t.add("div", reduce(t, x, "sum", dims, True), n))
    kept = row_scale(t, x, dims)  # one max of |x|: a second reduction, keepdim=False, took a second accumulator
    scale = kept if keepdim else t.add("reshape", kept, shape=tuple(e for k, e in enumerate(x.shape) if k not in dims))
    drift = t.add("div", t.add("square", t.add("mul", reduce(t, d, "sum", dims, keepdim), t.add("recip", scale))), n)
    units = t.add("mul", d, t.add("recip", kept))
    squares = t.add("sub", reduce(t, t.add("square", units), "sum", dims, keepdim), drift)
    return t.add("div", squares, count(t, x, dims, minus=correction)), scale


def row_scale(t, x, dims):
    """The largest |x| over dims (kept), at least the smallest normal float: a row of
    zeros or of subnormals keeps a finite reciprocal."""
    tiny = torch.finfo(torch.float64 if x.dtype == DType.f64 else torch.float32).tiny  # halves compute in f32
    return t.add("max", reduce(t, t.add("abs", x), "max", dims, True), t.const(tiny, x.dtype))


def _correction(a) -> int:
    if a.get("correction") is not None:
        return a["correction"]
    return 1 if a.get("unbiased", True) else 0


def _NON_INT_CORRECTION(a, n):
    val = n.meta["val"]
    if not (val[0] if isinstance(val, (tuple, list)) else val).dtype.is_floating_point:
        return "var and std of integers (torch raises)"
    if a.get("correction") is not None and a["correction"] != int(a["correction"]):
        return "a fractional correction is not supported"
    return None


def _scaled_variance(t, a):
    x = a["self"]
    return variance(t, x, axes(a.get("dim"), x.rank), int(_correction(a)), a.get("keepdim", False))


@rule("var", check=_NON_INT_CORRECTION)
def _var(t, node, a):
    v, scale = _scaled_variance(t, a)
    return t.add("mul", t.add("mul", v, scale), scale)  # v * scale first: scale^2 alone overflows past 1.8e19


@rule("std", check=_NON_INT_CORRECTION)
def _std(t, node, a):
    v, scale = _scaled_variance(t, a)
    return t.add("mul", t.add("sqrt", v), scale)


def _mean_of(t, a):
    x = a["self"]
    dims = axes(a.get("dim"), x.rank)
    return t.add("div", reduce(t, x, "sum", dims, a.get("keepdim", False)), count(t, x, dims))


@rule("var_mean", check=_NON_INT_CORRECTION)
def _var_mean(t, node, a):
    return _var(t, node, a), _mean_of(t, a)


@rule("std_mean", check=_NON_INT_CORRECTION)
def _std_mean(t, node, a):
    return _std(t, node, a), _mean_of(t, a)


def _normalized_axes(a, x):
    return list(range(x.rank - len(a["normalized_shape"]), x.rank))


def _affine(t, y, a):
    if a.get("weight") is not None:
        y = t.add("mul", y, a["weight"])
    if a.get("bias") is not None:
        y = t.add("add", y, a["bias"])
    return y


def _normalize(t, a):
    """layer_norm's (output, mean, 1/std), the statistics kept over the normalized axes."""
    x = a["input"]
    dims = _normalized_axes(a, x)
    n = count(t, x, dims)
    mean = t.add("div", reduce(t, x, "sum", dims, True), n)
    centered = t.add("sub", x, mean)
    var = t.add("div", reduce(t, t.add("square", centered), "sum", dims, True), n)
    eps = a.get("eps")
    eps = t.const(1e-5 if eps is None else float(eps), x.dtype)  # eps=0.0 is a choice, not a default
    rstd = t.add("rsqrt", t.add("add", var, eps))
    return _affine(t, t.add("mul", centered, rstd), a), mean, rstd


rule("layer_norm")(lambda t, node, a: _normalize(t, a)[0])
rule("native_layer_norm")(lambda t, node, a: _normalize(t, a))  # what AOTAutograd leaves of layer_norm


@rule("rms_norm")
def _rms_norm(t, node, a):
    x = a["input"]
    dims = _normalized_axes(a, x)
    n = count(t, x, dims)
    mean_square = t.add("div", reduce(t, t.add("square", x), "sum", dims, True), n)
    eps = a.get("eps")
    if eps is None:  # torch's default: the machine epsilon of the type it computes in (f32 for a half:
        # bf16's 0.0078 normalised rows of size 0.05 49% off)
        eps = torch.finfo(TORCH_DTYPES[x.dtype] if x.dtype == DType.f64 else torch.float32).eps
    return _affine(t, t.add("mul", x, t.add("rsqrt", t.add("add", mean_square, t.const(float(eps), x.dtype)))), a)


def safe_softmax(t, x, axis: int):
    """softmax as max-subtracted exp over its sum: the same nodes as
    cleave.workloads.attention.safe_softmax."""
    m = t.add("reduce", x, op="max", axis=axis, keepdim=True)
    e = t.add("exp", t.add("sub", x, m))
    return t.add("div", e, t.add("reduce", e, op="sum", axis=axis, keepdim=True))


def log_sum_exp(t, x, axis, keepdim: bool):
    """log(sum(exp(x - m))) + m over one axis or a list of them, an infinite max read as
    0, as torch's logsumexp computes it: a row of -inf gives -inf (not -inf - -inf =
    NaN), a row holding +inf gives +inf. (log_softmax subtracts its max unguarded, NaN
    there, in `_log_softmax`.)"""
    dims = [axis] if isinstance(axis, int) else list(axis)

    def row_max(keep):
        return t.add("inf_to_zero", reduce(t, x, "max", dims, keep))

    m = row_max(True)
    total = reduce(t, t.add("exp", t.add("sub", x, m)), "sum", dims, keepdim)
    return t.add("add", t.add("log", total), m if keepdim else row_max(False))


def _softmax_input(t, a):
    x = a.get("self", a.get("input"))
    if a.get("half_to_float"):
        return t.add("cast", x, dtype="f32")
    return _cast_arg(t, x, a.get("dtype"))


def _dim_in_range(a, n):
    """torch's softmax takes a dim in [-rank, rank) (a 0-d tensor's: -1 or 0) and raises
    IndexError past it; its meta function does not check, and dim % rank is another axis."""
    rank = max(a.get("self", a.get("input")).dim(), 1)
    dim = a["dim"]
    return None if -rank <= dim < rank else f"dim {dim} is out of range for a tensor of rank {rank} (torch raises)"


def _softmax_check(a, n):
    return _dim_in_range(a, n) or floats_only(a, n)


@rule("softmax", "_softmax", check=_softmax_check)
def _softmax(t, node, a):
    x = _softmax_input(t, a)
    return _on_a_vector(t, x, lambda v, axis: safe_softmax(t, v, axis), a["dim"])


@rule("_safe_softmax", check=_softmax_check)
def _safe_softmax_rule(t, node, a):
    """torch's _safe_softmax (SDPA's math path): a row that is all -inf gives 0, where
    softmax gives NaN (exp(-inf - -inf)). A select on the row max after the softmax
    leaves the softmax as the rules match it."""
    x = _softmax_input(t, a)

    def guarded(v, axis):
        m = t.add("reduce", v, op="max", axis=axis, keepdim=True)
        empty = t.add("eq", m, t.const(float("-inf"), m.dtype))
        return t.add("where", empty, t.const(0.0, v.dtype), safe_softmax(t, v, axis))
    return _on_a_vector(t, x, guarded, a["dim"])


@rule("log_softmax", "_log_softmax", check=_softmax_check)
def _log_softmax(t, node, a):
    """(x - max) - log(sum(exp(x - max))), as torch computes it: x - (max + log(sum))
    rounds the sum of a large max and a small log to f32 first (logits around 1e4 came
    out 3e-4 relative off)."""
    x = _softmax_input(t, a)

    def shifted(v, axis):
        d = t.add("sub", v, reduce(t, v, "max", [axis], True))
        return t.add("sub", d, t.add("log", reduce(t, t.add("exp", d), "sum", [axis], True)))
    return _on_a_vector(t, x, shifted, a["dim"])


def _on_a_vector(t, x, fn, dim):
    """fn(x, axis) over `dim`; a 0-d x as a vector of one element (torch's softmax of a
    scalar is 1)."""
    if x.rank:
        return fn(x, dim % x.rank)
    return t.add("reshape", fn(t.add("reshape", x, shape=(D.dim(1),)), 0), shape=())


def _rank0_as_vector(fn):
    """A rule over `dim` taking a 0-d tensor's dim 0 or -1, as torch does: x as a vector
    of one element, each result reshaped back to 0-d."""
    def wrapped(t, node, a):
        x = a["self"]
        if x.rank or a.get("dim") is None:
            return fn(t, node, a)
        out = fn(t, node, {**a, "self": t.add("reshape", x, shape=(D.dim(1),)), "dim": 0, "keepdim": False})
        scalar = [o if not o.rank else t.add("reshape", o, shape=()) for o in (out if isinstance(out, tuple) else (out,))]
        return tuple(scalar) if isinstance(out, tuple) else scalar[0]
    return wrapped


@rule("logsumexp")
def _logsumexp(t, node, a):
    x = a["self"]
    if not x.dtype.is_float:  # torch takes integers and bools in the default float type
        x = _cast_arg(t, x, t.out_dtype(node))
    return log_sum_exp(t, x, axes(a["dim"], x.rank), a.get("keepdim", False))


def _arg_extreme(t, x, axis: int, largest: bool, keepdim: bool):
    """argmax/argmin: the first index holding the extreme, or the first NaN (torch's
    choice), as a min over the indices that hit it. Two reductions, so a dynamic axis
    tiles in a loop (a top-1 keeps the whole axis in one tile)."""
    best = t.add("reduce", x, op="max" if largest else "min", axis=axis, keepdim=True)
    hit = t.add("where", t.add("ne", x, x), t.const(True, "bool"), t.add("eq", x, best))
    n = x.shape[axis]
    at = t.add("iota", shape=tuple(x.shape), axis=axis, dtype="i64")
    # no hit reads n, one past the end: as index 0 + n, so that the graph requires index 0
    # (the slice's constraint 1 <= n): over an axis empty at run time no plan serves and
    # eager raises its IndexError, as a top-1's k <= n did
    first = t.add("slice", at, axis=axis, start=D.dim(0), stop=D.dim(1), step=1)
    past = t.add("add", first, t.const(int(n), "i64") if n.is_number else t.add("size", value=n, dtype="i64"))
    return t.add("reduce", t.add("where", hit, at, past), op="min", axis=axis, keepdim=bool(keepdim))


def _prefix(t, x, axis: int, fill):
    """x over the triangle j <= i of its axis, `fill` elsewhere: [.., n_j, n_i, ..], the
    form PyTorch's own cumsum decomposition takes. Its reduction over j is the prefix
    reduction; the tiles past the diagonal are outside the loop's bounds, and a loop over
    a dynamic axis serves every extent."""
    n = x.shape[axis]
    before = _as_j(t, x, axis)
    upto = t.add("le", t.add("iota", shape=(n, n), axis=0, dtype="i64"), t.add("iota", shape=(n, n), axis=1, dtype="i64"))
    upto = t.add("reshape", upto, shape=(n, n) + (D.dim(1),) * (x.rank - axis - 1))
    return t.add("where", upto, before, t.lift(fill, x))


def _as_j(t, x, axis: int):
    """x indexed by j: a unit axis after `axis`, where the triangle's i goes."""
    return t.add("reshape", x, shape=x.shape[:axis + 1] + (D.dim(1),) + x.shape[axis + 1:])


def _lowest(x, largest: bool):
    """The neutral element of a running max (min): -inf (inf), False (True), or the
    integer type's end."""
    if x.dtype.is_float:
        return float("-inf") if largest else float("inf")
    if x.dtype is DType.bool:
        return not largest
    return x.dtype.int_range[0 if largest else 1]


def _prefix_reduction(op, fill):
    """cumsum/cumprod: the reduction over the triangle, in torch's result dtype (an integer
    or bool input accumulates in int64), as PyTorch's decomposition writes it."""
    def fn(t, node, a):
        x, dtype = a["self"], node.meta["val"].dtype
        x = x if TORCH_DTYPES[x.dtype] == dtype else _cast_arg(t, x, dtype)
        if not x.rank:  # a 0-d tensor is its own prefix
            return x
        axis = a["dim"] % x.rank
        return t.add("reduce", _prefix(t, x, axis, fill), op=op, axis=axis, keepdim=False)
    return fn


def _no_bool_result(a, n):
    """cumsum(dtype=torch.bool): torch's CPU kernel raises ("not implemented for 'Bool'")."""
    return "a running sum into bools is not implemented in torch" if n.meta["val"].dtype == torch.bool else None


rule("cumsum", check=_no_bool_result)(_prefix_reduction("sum", 0))
rule("cumprod", check=_float_result)(_prefix_reduction("prod", 1))


@rule("logcumsumexp", check=floats_only)
@_rank0_as_vector
def _logcumsumexp(t, node, a):
    x = a["self"]
    axis = a["dim"] % x.rank
    return log_sum_exp(t, _prefix(t, x, axis, float("-inf")), axis, keepdim=False)


def _running_extreme(largest: bool):
    """cummax/cummin: the running extreme (NaN once one is seen), and the last index
    holding it, or the last NaN, as torch's kernels choose (they update on >= / <=)."""
    def fn(t, node, a):
        x = a["self"]
        axis = a["dim"] % x.rank
        seen = _prefix(t, x, axis, _lowest(x, largest))
        best = t.add("reduce", seen, op="max" if largest else "min", axis=axis, keepdim=True)
        before = _as_j(t, x, axis)
        hit = t.add("where", t.add("ne", before, before), t.const(True, "bool"), t.add("eq", seen, best))
        at = t.add("iota", shape=tuple(seen.shape), axis=axis, dtype="i64")
        # a j past i fills `seen` with the neutral element, which may equal the extreme:
        # it is not a candidate (the upper triangle is outside the loop's bounds anyway)
        upto = t.add("le", at, t.add("iota", shape=tuple(seen.shape), axis=axis + 1, dtype="i64"))
        last = t.add("where", t.add("where", upto, hit, t.const(False, "bool")), at, t.const(-1, "i64"))
        index = t.add("reduce", last, op="max", axis=axis, keepdim=False)
        if not x.dtype.is_float:
            return t.add("reshape", best, shape=tuple(x.shape)), index
        # read back at the index, as torch's value is: over 0.0 and -0.0 the max keeps
        # either sign, while the index is the last of the tie
        return t.add("gather", x, index, axis=axis), index
    return _rank0_as_vector(fn)


rule("cummax")(_running_extreme(True))
rule("cummin")(_running_extreme(False))


def _extreme_dim(op):
    def fn(t, node, a):
        x, keep = a["self"], a.get("keepdim", False)
        axis = a["dim"] % x.rank
        _refuse_empty(t, x, [axis])  # also where only the values are used (the indices' own check is dead code then)
        values = t.add("reduce", x, op=op, axis=axis, keepdim=bool(keep))
        return values, _arg_extreme(t, x, axis, op == "max", keep)
    return _rank0_as_vector(fn)


def _arg(largest):
    def fn(t, node, a):
        x = a["self"]
        if a.get("dim") is None:
            x = t.add("reshape", x, shape=(math.prod(x.shape, start=sympy.Integer(1)),))
            index = _arg_extreme(t, x, 0, largest, False)
            return t.add("reshape", index, shape=t.out_shape(node)) if a.get("keepdim") else index
        return _arg_extreme(t, x, a["dim"] % x.rank, largest, a.get("keepdim", False))
    return _rank0_as_vector(fn)


def _no_bool(a, n):
    return "argmax and argmin of bool (torch raises)" if a["self"].dtype == torch.bool else None


rule("max.dim")(_extreme_dim("max"))
rule("min.dim")(_extreme_dim("min"))
rule("argmax", check=_no_bool)(_arg(True))
rule("argmin", check=_no_bool)(_arg(False))


def _topk_check(a, n):
    """topk's kernel holds its axis whole in one tile: over an axis of dynamic size no
    tile serves every size, and the op runs eagerly (the rest of the graph compiles;
    the whole function ran eagerly when the scheduler found it)."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    if not isinstance(a["k"], int):
        # the user's int, made a symbol by dynamo (dynamic=True, or changed between calls)
        return "k is a dynamic size here; its kernel needs k fixed at compile time"
    x = a["self"]
    if x.dim() and not is_concrete_int(x.shape[a.get("dim", -1) % x.dim()]):
        return "over an axis of dynamic size (its kernel holds the whole axis in one tile)"
    return None


@rule("topk", check=_topk_check)
@_rank0_as_vector
def _topk(t, node, a):
    x, k = a["self"], a["k"]
    axis = a["dim"] % x.rank
    if a.get("largest", True):
        return (t.add("topk", x, k=k, axis=axis, which="values"), t.add("topk", x, k=k, axis=axis, which="indices"))
    # The smallest k of x are the largest k of -x, with NaN (torch's largest value, so
    # the last of the smallest) below every number: -inf; the values are read back from
    # x, a NaN as itself. +inf goes just above it, to -FLT_MAX: as -inf it tied with NaN,
    # and a NaN earlier in the row took its place. In f32 that ties +inf with FLT_MAX
    # itself (f32 has no value between); a half is flipped in f32, below all of its own.
    # Integers flip by ~x = -x - 1, which no value overflows (-x wrapped: uint8's 0 and
    # int8's -128 are their own negation).
    if x.dtype.is_float:
        wide = t.add("cast", x, dtype=DType.f32) if x.dtype in (DType.bf16, DType.f16) else x
        flipped = t.add("neg", wide)
        flipped = t.add("where", t.add("eq", wide, t.const(float("inf"), wide.dtype)),
                        t.const(-torch.finfo(torch.float32).max, wide.dtype), flipped)
        flipped = t.add("where", t.add("ne", x, x), t.const(float("-inf"), wide.dtype), flipped)
    else:
        flipped = t.add("bit_not", x)
    indices = t.add("topk", flipped, k=k, axis=axis, which="indices")
    return t.add("gather", x, indices, axis=axis), indices



def _cdist_check(a, n):
    if not a["x1"].is_floating_point():
        return "an integer input (eager refuses it)"
    if a["p"] < 0:
        return "a negative p (eager refuses it)"
    if a["p"] == math.inf and a["x1"].shape[-1] == 0:
        return "p = inf over no features"
    return None


@rule("_cdist_forward", check=_cdist_check)
def _cdist(t, node, a):
    """torch.cdist as its definition: per pair of rows the p-norm of their difference,
    x1[..., i, None, :] - x2[..., None, j, :] reduced over the features in one kernel.
    torch's own form for p = 2 past 25 rows (|x|² + |y|² - 2·x·y through a MatMul)
    cancels; this one does not, and agrees with it within its rounding."""
    x1, x2, p = a["x1"], a["x2"], float(a["p"])
    d = binary(t, "sub", unsqueeze(t, x1, x1.rank - 1), unsqueeze(t, x2, x2.rank - 2))
    last = d.rank - 1
    if p == 0:  # the count of differing features
        ne = t.add("cast", binary(t, "ne", d, 0), dtype=d.dtype)
        return t.add("reduce", ne, op="sum", axis=last, keepdim=False)
    size = t.add("abs", d)
    if p == math.inf:
        return t.add("reduce", size, op="max", axis=last, keepdim=False)
    if p == 1:
        return t.add("reduce", size, op="sum", axis=last, keepdim=False)
    if p == 2:
        return t.add("sqrt", t.add("reduce", t.add("square", d), op="sum", axis=last, keepdim=False))
    total = t.add("reduce", binary(t, "pow", size, p), op="sum", axis=last, keepdim=False)
    return binary(t, "pow", total, 1.0 / p)
