"""Ops over sliding windows: average pooling (aten.avg_pool2d; avg_pool1d decomposes to
it) and convolution (aten.convolution, 1-D to 3-D, grouped). Each window is a take
from the flattened, zero-padded input at its row-major offsets; a pool sums it and
divides by its count, a convolution contracts it with the weight (im2col, a MatMul).
PyTorch decomposes none of them: each was a graph break in every CNN.

Convolutions are compiled only when asked (`CLEAVE_CONVOLUTIONS=compile`): cleave's
im2col kernels compute each window's offsets per element and step (integer divisions
and remainders of the padded, flattened input), and on an H100 they ran 3-42x slower
than the cuDNN convolutions eager PyTorch and torch.compile call (a ResNet-50 3x3 at
56 x 56: 2.53 ms against 0.060; RESULTS.md, session 41). By default a convolution runs
eagerly, on cuDNN, with a warning, and the rest of the function compiles."""
from __future__ import annotations

import math
import os

import sympy

from ..ir import dims as D
from .aten_layout import _contraction_check, matmul, pad_constant, permute, reshape, strided_take, swap
from .aten_map import rule


def windows(t, x, kernel, stride, dilation, out_sizes):
    """The windows of x's last len(kernel) axes: shape lead + out_sizes + kernel, element
    [..., o, k] = x[..., o·stride + k·dilation] (taken from the flattened x)."""
    r = len(kernel)
    lead, spatial = x.shape[:-r], x.shape[-r:]
    inner = [sympy.Mul(*spatial[d + 1:]) for d in range(r)]  # row-major strides of the window axes
    outer, step = [], sympy.Mul(*spatial)
    for d in reversed(lead):
        outer.insert(0, step)
        step = step * d
    shape = tuple(lead) + tuple(out_sizes) + tuple(D.dim(k) for k in kernel)
    strides = outer + [s * i for s, i in zip(stride, inner)] + [dl * i for dl, i in zip(dilation, inner)]
    return strided_take(t, x, shape, strides)


def _pairs(value, default, n=2):
    value = list(value) if value else list(default)
    return value * n if len(value) == 1 else value


def _padded(t, x, padding):
    pad = [p for p in reversed(padding) for _ in (0, 1)]
    return pad_constant(t, x, pad, 0) if any(padding) else x


def _window_sum(t, x, kernel, stride, out_sizes):
    w = windows(t, x, kernel, stride, [1] * len(kernel), out_sizes)
    for _ in kernel:
        w = t.add("reduce", w, op="sum", axis=w.rank - 1, keepdim=False)
    return w


def _pool_check(a, n):
    if a.get("ceil_mode"):
        return "ceil_mode (windows past the padded input)"
    if not a["self"].is_floating_point():
        return "an integer input (eager refuses it)"
    return None


@rule("avg_pool2d", check=_pool_check)
def _avg_pool2d(t, node, a):
    x = a["self"]
    kernel = _pairs(a["kernel_size"], ())
    stride = _pairs(a.get("stride"), kernel)
    padding = _pairs(a.get("padding"), (0,))
    out_sizes = t.out_shape(node)[-2:]
    total = _window_sum(t, _padded(t, x, padding), kernel, stride, out_sizes)
    if a.get("divisor_override"):
        return t.add("div", total, t.const(float(a["divisor_override"]), total.dtype))
    if a.get("count_include_pad", True) or not any(padding):
        return t.add("div", total, t.const(float(math.prod(kernel)), total.dtype))
    # without the padding in the count: each window's count of input elements, the same
    # window sum over ones padded with zeros
    ones = t.add("broadcast", t.const(1.0, x.dtype), shape=tuple(x.shape[-2:]))
    return t.add("div", total, _window_sum(t, _padded(t, ones, padding), kernel, stride, out_sizes))


# The environment switch that compiles convolutions (see above)
COMPILE_CONVOLUTIONS = ("CLEAVE_CONVOLUTIONS", "compile")


def _conv_check(a, n):
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    name, value = COMPILE_CONVOLUTIONS
    if os.environ.get(name) != value:
        return (f"cuDNN's convolution runs 3-42x faster than cleave's im2col kernels (H100, RESULTS.md session 41); "
                f"{name}={value} compiles it")
    if a.get("transposed"):
        return "a transposed convolution"
    if a["input"].dim() != a["weight"].dim():
        return "an input without a batch axis"
    if not all(is_concrete_int(k) for k in a["weight"].shape[1:]):
        return "a kernel of dynamic size"
    return _contraction_check(a, n)


@rule("convolution", check=_conv_check)
def _convolution(t, node, a):
    """im2col: the windows [N, C, *out, *kernel] as rows [N·out, C·kernel] (per group),
    times the weight [O, C/g·kernel] transposed; then [N, O, *out] and the bias."""
    x, w, groups = a["input"], a["weight"], a["groups"]
    r = x.rank - 2
    kernel = [int(k) for k in w.shape[2:]]
    stride, padding, dilation = (_pairs(a[k], (1,), r) for k in ("stride", "padding", "dilation"))
    out_sizes = t.out_shape(node)[2:]
    win = windows(t, _padded(t, x, padding), kernel, stride, dilation, out_sizes)
    n, c, o = x.shape[0], x.shape[1], w.shape[0]
    rows = n * sympy.Mul(*out_sizes)
    per = c / groups * math.prod(kernel)
    # [N, *out, C, *kernel]: a window's elements in the weight's order (channel, then kernel)
    win = permute(t, win, [0] + [2 + i for i in range(r)] + [1] + [2 + r + i for i in range(r)])
    if groups == 1:
        y = matmul(t, reshape(t, win, (rows, per)), swap(t, reshape(t, w, (o, per)), 0, 1))
    else:
        lhs = permute(t, reshape(t, win, (rows, D.dim(groups), per)), [1, 0, 2])
        rhs = swap(t, reshape(t, w, (D.dim(groups), o / groups, per)), 1, 2)
        y = reshape(t, permute(t, matmul(t, lhs, rhs), [1, 0, 2]), (rows, o))
    y = permute(t, reshape(t, y, (n,) + tuple(out_sizes) + (o,)), [0, r + 1] + [1 + i for i in range(r)])
    if a.get("bias") is not None:
        y = t.add("add", y, reshape(t, a["bias"], (D.dim(1), o) + (D.dim(1),) * r))
    return y
