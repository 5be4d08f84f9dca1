"""The decomposition table the torch.compile backend lowers dynamo's graph with.

Coverage comes from PyTorch's own decompositions, not from mapping ops by hand:
every op with a decomposition in `torch._decomp` (core ATen's, and the wider table)
is lowered, recursively, to the ops cleave maps, unless cleave maps the op itself.
Those keep their own rule: softmax stays one op whose safe form the rules know,
and scaled_dot_product_attention (or the fused kernel it dispatches to) one
attention, not the math fallback's masked bmm chain. PyTorch's fused layer kernels
that no table decomposes (nn.TransformerEncoderLayer's fast path) are written out in
the ops their slow path runs (`fused_layers.py`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from . import aten_map


@functools.cache
def table() -> dict:
    from torch._decomp import core_aten_decompositions, decomposition_table

    from .fused_layers import TABLE as FUSED_LAYERS

    merged = {**decomposition_table, **core_aten_decompositions(), **FUSED_LAYERS}
    scatter = merged[torch.ops.aten.slice_scatter.default]
    merged[torch.ops.aten.slice_scatter.default] = functools.partial(_slice_scatter_in_its_layout, scatter)
    return {op: _checked_against_eager_kernel(op, fn) for op, fn in merged.items()
            if not _mapped(op) and not _kept_whole(op)}


def _slice_scatter_in_its_layout(scatter, input, src, dim=0, start=None, end=None, step=1):
    """torch's slice_scatter keeps its input's layout; its decomposition (a `where` over
    a broadcast mask) gives a row-major result. Written through a transposed view of an
    intermediate (`y = x.clone(); y.t()[1:] = 0; return y`), the result came back with
    the view's strides, (1, 5) for eager's (7, 1), and the caller's `y.view(-1)` raised.
    An input dense in another order is scattered into in that order and permuted back."""
    from .output_layout import eager_order

    order = eager_order(input) if input.dim() == src.dim() else None
    if order is None:
        return _slice_scatter(scatter, input, src, dim, start, end, step)
    back = [order.index(i) for i in range(len(order))]
    moved = _slice_scatter(scatter, input.permute(order), src.permute(order), order.index(dim % input.dim()), start,
                           end, step)
    return moved.permute(back)


def _slice_scatter(scatter, input, src, dim, start, end, step):
    """torch's decomposition, or over a symbolic size the same mask without its branches:
    torch's compares the slice's bounds with the size in Python, each compare a guard, and
    on the synthetic base AOTAutograd makes for arguments that alias (a KV cache written
    beside a view of it passed too) such a guard has no source: dynamo's guard builder
    raised IndexError at the call."""
    dim = dim % input.dim()
    size = input.shape[dim]
    if not any(isinstance(v, torch.SymInt) for v in (size, start, end)):
        return scatter(input, src, dim, start, end, step)
    start = _bound(start, 0, 0, size, size)
    end = _bound(end, size, start, size, size)
    if src.dim() != input.dim():  # else it is the slice's shape already: an expand would need that proven
        src = src.expand([*input.shape[:dim], (end - start + step - 1) // step, *input.shape[dim + 1:]])
    idx = torch.arange(size, device=input.device)
    mask = (idx >= start) & (idx < end)
    if step != 1:
        mask = mask & ((idx - start) % step == 0)
    indices = [None] * input.dim()
    indices[dim] = (idx - start) // step
    mask = mask.view([-1 if d == dim else 1 for d in range(input.dim())])
    return torch.ops.aten.where(mask, torch.ops.aten._unsafe_masked_index(src, mask, indices, 0), input)


_END = 2 ** 62


def _bound(value, default, lower, upper, size):
    """A slice bound clamped into [lower, upper], a negative one from the end, as torch's
    decomposition reads it, without a guard on a symbolic size (sym_min, sym_max)."""
    if value is None or isinstance(value, int) and value >= _END:  # `x[2:]` slices up to sys.maxsize
        return default
    if value < 0:
        value = value + size
    return torch.sym_min(torch.sym_max(value, lower), upper)


# Ops left undecomposed although a table decomposes them:
# - lift, lift_fresh: the tracer turns a tensor constant of the user's code
#   (`torch.tensor([1, 3])`, the scalar `y[0, 0] = nan` writes) into a fake tensor when it
#   meets these; decomposed first, the real constant reaches fake-tensor dispatch and
#   tracing fails.
# - complex, polar: they decompose into an empty complex tensor whose real and imaginary
#   views are written in place, on which AOTAutograd's functionalization fails an
#   internal assertion (the whole frame ran eagerly, its warning that assertion). Kept
#   whole, they are graph breaks named by the op (cleave has no complex dtype).
# - native_dropout, bernoulli, and every other op that draws from the generator (torch
#   tags them nondeterministic_seeded: exponential_, cauchy_, geometric_, log_normal_,
#   normal, uniform, rrelu...): cleave runs them eagerly; decomposed, they draw through
#   rand_like in another order or transform than torch's kernels, so a seeded dropout
#   mask or a gumbel_softmax differed from eager's. Kept whole, they draw as eager does.
# - diagonal_scatter: the wider table's decomposition (torch._refs) writes the diagonal of
#   a clone with prims.copy_to, which AOTAutograd refuses as not functional: a frame with
#   `x.diagonal().fill_(0)` ran eagerly, its warning that assertion. Kept whole, it is a
#   graph break named by the op, and the rest of the frame compiles.
KEPT_WHOLE = {"lift", "lift_fresh", "complex", "polar", "native_dropout", "bernoulli", "diagonal_scatter"}


# Ops whose decomposition in torch computes another value than torch's own kernel, and
# which torch applies while AOTAutograd traces (a Python kernel at the Autograd key, so
# no table leaves them whole): multilabel_margin_loss gives 2.05 where its kernel and
# its definition give 0.85 (rows [0.1, 0.2, 0.4, 0.8], labels {3, 0}; torch 2.13,
# inductor too). A frame calling one runs eagerly, with a warning naming it.
WRONGLY_DECOMPOSED = ("multilabel_margin_loss", "multilabel_margin_loss_forward")


def wrongly_decomposed(node) -> str | None:
    """Why a call of dynamo's graph cannot be lowered through torch's decompositions
    (None where it can): it calls an op of WRONGLY_DECOMPOSED, as a function
    (F.multilabel_margin_loss, nn.MultiLabelMarginLoss inlined) or an aten op."""
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, torch._ops.OpOverload):  # torch.ops.aten.X.overload, a custom op's overload
        name = target._schema.name.split("::")[-1] if target.namespace == "aten" else ""
    elif isinstance(target, torch._ops.OpOverloadPacket):  # torch.ops.aten.X
        namespace, _, name = target._qualified_op_name.partition("::")
        name = name if namespace == "aten" else ""
    else:  # torch's own functions only: a user's function of that name is theirs
        name = target.__name__ if getattr(target, "__module__", "").startswith("torch") else ""
    if name in WRONGLY_DECOMPOSED:
        return (f"{name}: torch's decomposition of it computes another value than its kernel, so the frame "
                f"runs as torch's kernels")
    return None


# Ops torch tags as drawing from the generator whose draws are only their dropout's
# (p = 0 in inference); their decompositions draw through native_dropout, kept whole.
RANDOM_BY_DROPOUT = {"scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                     "_scaled_dot_product_flash_attention_for_cpu", "lstm", "gru", "rnn_relu", "rnn_tanh"}


def _kept_whole(op) -> bool:
    if not isinstance(op, torch._ops.OpOverload):
        return False
    name = op._schema.name.split("::")[-1]
    return name in KEPT_WHOLE or (torch.Tag.nondeterministic_seeded in op.tags and name not in RANDOM_BY_DROPOUT)


def _mapped(op) -> bool:
    """Whether cleave has a rule for this op (its packet or this overload); higher-order
    ops in the table (no schema) are not aten ops cleave could map."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return False
    packet = op._schema.name.split("::")[-1]
    return f"{packet}.{op._overloadname}" in aten_map.RULES or packet in aten_map.RULES


def _checked_against_eager_kernel(op, decompose):
    """An op's decomposition that raises torch's own error where torch's CPU kernel
    refuses the integer or bool dtypes it is given: softplus, mish and hardswish of
    integers decompose into integer arithmetic that runs, where eager raises "not
    implemented for 'Long'"; lerp of integers and addcdiv of bools into float arithmetic.
    The trace fails, and the frame runs eagerly, raising there. Operands of float types
    are not probed: the decompositions compute as torch does."""
    if not isinstance(op, torch._ops.OpOverload):
        return decompose

    @functools.wraps(decompose)
    def checked(*args, **kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if tensors and all(not t.dtype.is_floating_point and not t.dtype.is_complex for t in tensors):
            refusal = _eager_refusal(op, tuple(map(_probed, args)),
                                     tuple(sorted((k, _probed(v)) for k, v in kwargs.items())))
            if refusal is not None:
                raise refusal
        return decompose(*args, **kwargs)
    return checked


class _Probe(NamedTuple):
    """An integer or bool tensor argument as the probe makes it again: one element per
    axis, so that the call's dims index it as they index the argument."""
    dtype: torch.dtype
    ndim: int


def _probed(a):
    """An argument as the probe passes it (hashable): an integer or bool tensor as a
    _Probe, another tensor as its dtype, a number or
    flag as itself, anything else (a symbolic size, a list, a large int, which could
    allocate without bound) as _UNKNOWN, which leaves the probe to the tensors alone."""
    if isinstance(a, torch.Tensor):
        return _Probe(a.dtype, a.dim()) if a.dtype in _PROBED_DTYPES else a.dtype
    if isinstance(a, int) and not isinstance(a, bool):
        return a if abs(a) <= _LARGEST_PROBED_INT else _UNKNOWN
    return a if isinstance(a, (bool, float, str, torch.dtype)) or a is None else _UNKNOWN


_UNKNOWN = object()
_LARGEST_PROBED_INT = 16
_PROBED_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _probe_error(op, args: tuple, kwargs: tuple, float_tensors: bool) -> Exception | None:
    """What torch's kernel raises on one-element tensors of the probed dtypes (or of f32,
    with `float_tensors`) and the call's numbers; None where it runs."""
    def value(a):
        if isinstance(a, _Probe):
            return torch.ones((1,) * a.ndim, dtype=torch.float32 if float_tensors else a.dtype)
        return a
    values = [value(a) for a in args]
    named = {k: value(v) for k, v in kwargs}
    if _UNKNOWN in values or _UNKNOWN in named.values():
        values, named = [a for a in values if isinstance(a, torch.Tensor)], {}
    try:
        op(*values, **named)
    except Exception as err:  # the probe only informs: whatever it raises is weighed, never raised here
        return err
    return None


@functools.cache
def _eager_refusal(op, args: tuple, kwargs: tuple) -> Exception | None:
    """The error torch's kernel for `op` raises on one-element tensors of these dtypes
    (with the call's own numbers and flags) where it runs on f32 ones, or one that names
    a dtype it does not implement: a refusal of the dtype. None where it runs, or fails
    for another reason (a TypeError: an op that needs more arguments). Run with the
    tracer's modes set aside: under fake tensors only the meta function, which checks no
    dtype, would run."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        err = _probe_error(op, args, kwargs, float_tensors=False)
        if err is None or isinstance(err, TypeError):
            return None
        if "not implemented for" in str(err) or _probe_error(op, args, kwargs, float_tensors=True) is None:
            return err
    return None
