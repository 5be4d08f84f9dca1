"""torch's checked conversion of a number to a tensor's dtype: clamp, masked_fill, full,
where, index_fill, scatter and F.pad raise ("value cannot be converted to type int8_t
without overflow") where `+` and `==` wrap the number into the type. Their rules are
registered through `converting`, so that a number out of range leaves the op to torch,
which raises."""
from __future__ import annotations

import math

import sympy
import torch

from ..ir.graph import Constraint
from .aten_map import rule


def _overflows(value, dtype: torch.dtype) -> bool:
    """Whether torch's checked conversion of a Python number to `dtype` fails (c10's
    `overflows`): past a float type's finite range (inf and NaN convert), or past an
    integer type's, where an unsigned one also takes a negative int down to -max
    (u8.masked_fill(m, -1) holds 255)."""
    if dtype == torch.bool or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        return math.isfinite(value) and not info.min <= value <= info.max
    info = torch.iinfo(dtype)
    if not math.isfinite(value):
        return True
    low = -info.max if info.min == 0 and isinstance(value, int) else info.min
    return not low <= value <= info.max


def _int_range(dtype: torch.dtype) -> tuple[int, int] | None:
    """The ints torch converts to `dtype` without raising, where an int64 can fall
    outside them (f16, and the integer types narrower than 64 bits)."""
    if dtype == torch.float16:
        return -65504, 65504
    if dtype.is_floating_point or dtype in (torch.bool, torch.int64):
        return None
    info = torch.iinfo(dtype)
    return (-info.max if info.min == 0 else info.min), info.max


def _may_overflow(source: torch.dtype, dtype: torch.dtype) -> bool:
    """Whether some value of a `source` tensor fails the conversion to `dtype` (a 0-d
    tensor's value is converted as its number is): the data decides, so the op is left
    to torch."""
    if source in (dtype, torch.bool) or dtype == torch.bool:
        return False
    if source.is_floating_point:
        return not dtype.is_floating_point or torch.finfo(source).max > torch.finfo(dtype).max
    bounds, info = _int_range(dtype), torch.iinfo(source)
    return bounds is not None and not bounds[0] <= info.min <= info.max <= bounds[1]


def _conversion_dtype(node, in_op_math: bool) -> torch.dtype:
    dtype = node.meta["val"].dtype
    return torch.float32 if in_op_math and dtype in (torch.float16, torch.bfloat16) else dtype


def _fit(names, in_op_math: bool, tensors: bool):
    """`where` and `scalar_tensor` convert a half's number in f32 (torch.where(m, x_f16,
    1e6) is inf); masked_fill and index_fill check a 0-d tensor's value too (`tensors`),
    where `where` and clamp wrap it."""
    def check(a, n):
        dtype = _conversion_dtype(n, in_op_math)
        for name in names:
            value = a.get(name)
            if _overflows(value, dtype):
                return f"{name}={value!r} is out of the range of {dtype} (torch raises)"
            if tensors and isinstance(value, torch.Tensor) and value.dim() == 0 and _may_overflow(value.dtype, dtype):
                return (f"{name} is a {value.dtype} tensor whose value may be out of the range of {dtype} "
                        f"(torch raises then)")
        return None
    return check


def converting(*ops, scalars, in_op_math=False, tensors=False, check=None):
    """`rule` for ops that convert their number (with `tensors`, also 0-d tensor)
    arguments `scalars` to the result's dtype with torch's overflow check, after `check`
    if given. An int that dynamo made symbolic is no number when the graph is built, so
    its range becomes a constraint of the graph: a call with an int out of the range runs
    eagerly, where torch raises (a fill of 300 into an int8 tensor wrapped to 44)."""
    fit = _fit(scalars, in_op_math, tensors)

    def checked(a, n):
        return (check(a, n) if check else None) or fit(a, n)

    def register(fn):
        def constrained(t, node, a):
            bounds = _int_range(_conversion_dtype(node, in_op_math))
            for name in scalars if bounds else ():
                value = a.get(name)
                if isinstance(value, sympy.Expr) and value.free_symbols:
                    origin = f"{t.op}'s {name} in the range of {node.meta['val'].dtype} (eager raises)"
                    t.graph._constrain(Constraint("le", sympy.Integer(bounds[0]), value, origin))
                    t.graph._constrain(Constraint("le", value, sympy.Integer(bounds[1]), origin))
            return fn(t, node, a)
        rule(*ops, check=checked)(constrained)
        return fn
    return register
