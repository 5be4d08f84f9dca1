"""Average pooling (aten.avg_pool2d; avg_pool1d decomposes to it): each window a take
from the flattened, zero-padded input at its row-major offsets, then a sum over the
window and a division by its count. PyTorch has no decomposition for it: it was a
graph break in every CNN that averages."""
from __future__ import annotations

import sympy

from ..ir import dims as D
from .aten_layout import pad_constant, reshape
from .aten_map import rule


def _pairs(value, default):
    value = list(value) if value else list(default)
    return value * 2 if len(value) == 1 else value


def _pool_check(a, n):
    if a.get("ceil_mode"):
        return "ceil_mode (windows past the padded input)"
    if not a["self"].is_floating_point():
        return "an integer input (eager refuses it)"
    return None


def window_sum(t, x, kernel, stride, out_hw):
    """Sum over each kh x kw window of x's last two axes at `stride`, the windows
    laid out as out_hw: a take of the flattened x at lead·H·W + (i·sh + a)·W + j·sw + b."""
    lead, (h, w) = x.shape[:-2], x.shape[-2:]
    (kh, kw), (sh, sw) = kernel, stride
    shape = tuple(lead) + tuple(out_hw) + (D.dim(kh), D.dim(kw))
    # strides (in elements of the flattened x) of each axis of `shape`
    strides, step = [], h * w
    for d in reversed(lead):
        strides.insert(0, step)
        step = step * d
    strides += [sh * w, sw, w, sympy.Integer(1)]
    index = None
    for axis, stride in enumerate(strides):
        lanes = t.add("iota", shape=shape, axis=axis, dtype="i64")
        term = lanes if stride == 1 else t.add("mul", lanes, t.lift(stride, lanes))
        index = term if index is None else t.add("add", index, term)
    numel = sympy.Mul(*x.shape)
    windows = t.add("take", reshape(t, x, (numel,)), index, axis=0)
    rank = len(shape)
    return t.add("reduce", t.add("reduce", windows, op="sum", axis=rank - 1, keepdim=False),
                 op="sum", axis=rank - 2, keepdim=False)


@rule("avg_pool2d", check=_pool_check)
def _avg_pool2d(t, node, a):
    x = a["self"]
    kernel = _pairs(a["kernel_size"], ())
    stride = _pairs(a.get("stride"), kernel)
    ph, pw = _pairs(a.get("padding"), (0,))
    out_hw = t.out_shape(node)[-2:]
    padded = pad_constant(t, x, [pw, pw, ph, ph], 0) if ph or pw else x
    total = window_sum(t, padded, kernel, stride, out_hw)
    if a.get("divisor_override"):
        return t.add("div", total, t.const(float(a["divisor_override"]), total.dtype))
    if a.get("count_include_pad", True) or not (ph or pw):
        return t.add("div", total, t.const(float(kernel[0] * kernel[1]), total.dtype))
    # without the padding in the count: each window's count of input elements, the same
    # window sum over ones padded with zeros
    ones = t.add("broadcast", t.const(1.0, x.dtype), shape=tuple(x.shape[-2:]))
    counts = window_sum(t, pad_constant(t, ones, [pw, pw, ph, ph], 0), kernel, stride, out_hw)
    return t.add("div", total, counts)
