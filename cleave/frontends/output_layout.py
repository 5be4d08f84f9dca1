"""Eager's layout of a function's results. An elementwise op keeps a transposed or
channels-last input's stride order, and code after it may rely on that (an NHWC
`y.permute(0, 2, 3, 1).view(-1, C)` works on eager's result and raises on a row-major
one). The kernels write each output row-major, so an output that eager lays out
densely in another order is computed permuted into eager's order, and the launcher
returns the inverse permutation of it: eager's strides, with no copy."""
from __future__ import annotations

import torch

from ..ir import Graph


def _hint(value) -> int | None:
    """The value torch traced a size, stride or offset at."""
    if isinstance(value, torch.SymInt):
        hint = getattr(value.node, "hint", None)
        return None if hint is None else int(hint)
    return int(value)


def _dense_order(val) -> tuple[int, ...] | None:
    """The permutation p for which val.permute(p) is row-major (dims of extent 1 last:
    their strides are free), where val is dense from offset 0; None where it is not (gaps,
    overlaps, an offset, a size torch did not trace)."""
    sizes, strides = [_hint(s) for s in val.shape], [_hint(s) for s in val.stride()]
    if None in sizes or None in strides or _hint(val.storage_offset()) != 0:
        return None
    spread = sorted((i for i in range(val.dim()) if sizes[i] != 1), key=lambda i: -strides[i])
    step = 1
    for i in reversed(spread):
        if strides[i] != step:
            return None
        step *= sizes[i]
    return tuple(spread) + tuple(i for i in range(val.dim()) if sizes[i] == 1)


def eager_order(val) -> tuple[int, ...] | None:
    """The permutation p for which eager's `val.permute(p)` is row-major, where val is
    dense from offset 0 in another order; None where val is row-major (dims of extent 1
    aside), laid out otherwise (gaps, overlaps, an offset), empty, or no tensor."""
    if not isinstance(val, torch.Tensor) or val.dim() < 2 or 0 in [_hint(s) for s in val.shape]:
        return None
    order = _dense_order(val)
    spread = [i for i in order or () if _hint(val.shape[i]) != 1]
    return order if spread != sorted(spread) else None


def kernels_lay_out(val) -> bool:
    """Whether the kernels can give val as eager lays it out: row-major from offset 0, or
    dense in another order (eager_order). An empty tensor has no layout to keep."""
    if not isinstance(val, torch.Tensor):
        return False
    return 0 in [_hint(s) for s in val.shape] or _dense_order(val) is not None


def permute_outputs(graph: Graph, orders: dict[str, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """Make each output named in `orders` (eager_order's) its permutation, which the
    kernels write row-major; returns output index -> the permutation that gives back
    eager's shape (and so eager's strides), for the launcher."""
    inverse = {}
    for k, name in enumerate(graph.output_names):
        order = orders.get(name)
        if order is not None:
            graph.outputs[k] = graph.add("permute", graph.outputs[k], perm=order)
            inverse[k] = tuple(order.index(i) for i in range(len(order)))
    return inverse
