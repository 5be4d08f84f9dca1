"""Operator overloading for graph nodes: the builder DSL (`q @ k.T`, `x.exp()`)."""
from __future__ import annotations

import operator
from typing import Sequence

from . import dims as D
from .errors import ShapeError


def _axis(node, op: str, axis, positions: int | None = None) -> int:
    """axis counted from 0, in torch's range -n..n-1 for n positions (the node's rank;
    unsqueeze has one more), or a ShapeError naming the op: a modulo would wrap a wrong
    axis onto another one."""
    n = node.rank if positions is None else positions
    try:
        axis = operator.index(axis)
    except TypeError:
        raise ShapeError(f"{op}: axis {axis!r} is not an int") from None
    if not -n <= axis < n:
        expected = f"expected {-n}..{n - 1}" if n else "a rank-0 node has no axis"
        raise ShapeError(f"{op}: axis {axis} is out of range for operand 0 of rank {node.rank} "
                         f"(shape {D.fmt_shape(node.shape)}; {expected})")
    return axis % n


def _slice_bounds(node, axis: int, start, stop, step):
    """start and stop as Python's slicing reads them where the extent is a number: None
    is an end, a negative int counts from the end, both clamp to the extent. A symbolic
    extent takes no negative int (its value is not known)."""
    extent = node.shape[axis]
    plain = all(v is None or isinstance(v, int) for v in (start, stop))
    if extent.is_number and plain and isinstance(step, int) and step >= 1:
        first, last, _ = slice(start, stop, step).indices(int(extent))
        return first, max(first, last)  # x[5:2] is empty, not negative
    for which, v in (("start", start), ("stop", stop)):
        if isinstance(v, int) and v < 0:
            raise ShapeError(f"slice: {which} {v} counts from the end of axis {axis}, whose extent "
                             f"{D.fmt(extent)} is symbolic; write it as an expression of the extent "
                             f"({which}='{D.fmt(extent)}-{-v}', which needs {D.fmt(extent)} >= {-v})")
    return (0 if start is None else start), (extent if stop is None else stop)


def _lift(node, value):
    """A Python number becomes a scalar const of the node's dtype."""
    if hasattr(value, "graph"):
        return value
    if isinstance(value, bool):
        return node.graph.const(value, "bool")
    if not isinstance(value, (int, float)):
        raise TypeError(f"an operand beside {node.op} %{node.id} is a {type(value).__name__} {value!r:.40}: an "
                        f"operand is a node of graph {node.graph.name!r} or a number")
    dtype = node.dtype if (node.dtype.is_float or isinstance(value, int)) else "f32"
    return node.graph.const(value, dtype)


def _true_div(a, b):
    """`a / b` as Python and torch read it: two integers divide exactly, in f32 (the IR's
    div of integers truncates, as `torch.div(..., rounding_mode="trunc")` does)."""
    if not (a.dtype.is_float or b.dtype.is_float):
        a, b = a.cast("f32"), b.cast("f32")
    return a.graph.add("div", a, b)


class TensorOps:
    __slots__ = ()

    def _op(self, name, *args, **attrs):
        return self.graph.add(name, self, *(_lift(self, a) for a in args), **attrs)

    def _rop(self, name, other):
        return self.graph.add(name, _lift(self, other), self)

    # arithmetic
    def __add__(self, o): return self._op("add", o)
    def __radd__(self, o): return self._rop("add", o)
    def __sub__(self, o): return self._op("sub", o)
    def __rsub__(self, o): return self._rop("sub", o)
    def __mul__(self, o): return self._op("mul", o)
    def __rmul__(self, o): return self._rop("mul", o)
    def __truediv__(self, o): return _true_div(self, _lift(self, o))
    def __rtruediv__(self, o): return _true_div(_lift(self, o), self)
    def __pow__(self, o): return self._op("pow", o)
    def __neg__(self): return self._op("neg")
    def __matmul__(self, o): return self._op("matmul", o)

    # bit operations, of integers
    def __and__(self, o): return self._op("bit_and", o)
    def __or__(self, o): return self._op("bit_or", o)
    def __xor__(self, o): return self._op("bit_xor", o)
    def __invert__(self): return self._op("bit_not")
    def __lshift__(self, o): return self._op("shl", o)
    def __rshift__(self, o): return self._op("shr", o)

    # comparisons (equality is .eq/.ne: == stays identity so nodes can be dict keys)
    def __lt__(self, o): return self._op("lt", o)
    def __le__(self, o): return self._op("le", o)
    def __gt__(self, o): return self._op("gt", o)
    def __ge__(self, o): return self._op("ge", o)
    def eq(self, o): return self._op("eq", o)
    def ne(self, o): return self._op("ne", o)

    # unary
    def exp(self): return self._op("exp")
    def exp2(self): return self._op("exp2")
    def log(self): return self._op("log")
    def sqrt(self): return self._op("sqrt")
    def rsqrt(self): return self._op("rsqrt")
    def recip(self): return self._op("recip")
    def silu(self): return self._op("silu")
    def sigmoid(self): return self._op("sigmoid")
    def tanh(self): return self._op("tanh")
    def square(self): return self._op("square")
    def cos(self): return self._op("cos")
    def sin(self): return self._op("sin")
    def abs(self): return self._op("abs")
    def cast(self, dtype): return self._op("cast", dtype=dtype)
    def maximum(self, o): return self._op("max", o)
    def minimum(self, o): return self._op("min", o)

    # reductions
    def sum(self, axis: int = -1, keepdim: bool = False):
        return self._op("reduce", op="sum", axis=_axis(self, "sum", axis), keepdim=keepdim)

    def max(self, axis: int = -1, keepdim: bool = False):
        return self._op("reduce", op="max", axis=_axis(self, "max", axis), keepdim=keepdim)

    def min(self, axis: int = -1, keepdim: bool = False):
        return self._op("reduce", op="min", axis=_axis(self, "min", axis), keepdim=keepdim)

    def mean(self, axis: int = -1, keepdim: bool = False):
        axis = _axis(self, "mean", axis)
        n = self.shape[axis]
        count = _lift(self, float(n)) if n.is_number else self.graph.add("size", value=n, dtype=self.dtype)
        return self.sum(axis, keepdim) / count

    # layout
    @property
    def T(self):
        return self.transpose(-2, -1)

    def transpose(self, a: int, b: int):
        a, b = _axis(self, "transpose", a), _axis(self, "transpose", b)
        perm = list(range(self.rank))
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(*perm)

    def permute(self, *perm: int):
        if len(perm) == 1 and isinstance(perm[0], (tuple, list)):  # x.permute((1, 0)), as torch takes it
            perm = tuple(perm[0])
        return self._op("permute", perm=tuple(_axis(self, "permute", p) for p in perm))

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return self._op("reshape", shape=shape)

    def unsqueeze(self, axis: int):
        axis = _axis(self, "unsqueeze", axis, self.rank + 1)
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def broadcast_to(self, shape: Sequence):
        return self._op("broadcast", shape=shape)

    def split(self, axis: int, count, pad=None):
        return self._op("split", axis=_axis(self, "split", axis), count=count, pad=pad)

    def slice(self, axis: int, start, stop, step: int = 1):
        """Python's x[start:stop:step] along one axis (None for an end)."""
        axis = _axis(self, "slice", axis)
        start, stop = _slice_bounds(self, axis, start, stop, step)
        return self._op("slice", axis=axis, start=start, stop=stop, step=step)

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        if len(index) > self.rank:
            raise ShapeError(f"slice: {len(index)} indices for operand 0 of rank {self.rank} "
                             f"(shape {D.fmt_shape(self.shape)})")
        out = self
        for axis, sl in enumerate(index):
            if sl is Ellipsis:
                raise TypeError("use explicit axes instead of ... in a cleave slice")
            if not isinstance(sl, slice) or (sl.step is not None and sl.step < 1):
                raise TypeError(f"cleave slices take start:stop:step (step >= 1) on each axis, got {sl!r}")
            step = sl.step or 1
            if sl.start is None and sl.stop is None and step == 1:
                continue
            out = out.slice(axis, sl.start, sl.stop, step)
        return out
