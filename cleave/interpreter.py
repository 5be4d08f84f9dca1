"""The reference interpreter: runs any IR graph with torch eager ops.

It is the single source of truth for tests and verification. With
`compute_dtype=torch.float64` every float is computed in fp64; a cast that
widens is a value identity there, but a cast that narrows (to bf16, f16, f32)
still rounds, as the program asks: `x.to(bf16).float()` is not `x`. Values an op
merely computes in a narrow type (a bf16 add) are exact in fp64.
"""
from __future__ import annotations

import math

from typing import Mapping

import torch

from .ir import BindingError, CleaveError, Graph, Node
from .ir import dims as D
from .ir.dtypes import DType, rounds
from .ir.ops import COMPARE, half_read, per_op, reads_half_rounded

TORCH_DTYPES = {d: getattr(torch, d.torch_name) for d in DType}
IR_DTYPES = {v: k for k, v in TORCH_DTYPES.items()}

def _fmod(x, y):
    """torch.fmod, and 0 for an integer divided by 0 (an error in eager PyTorch on the CPU,
    undefined on the GPU): the search evaluates candidates on random integers."""
    if x.dtype.is_floating_point or y.dtype.is_floating_point:
        return torch.fmod(x, y)
    return torch.where(y == 0, 0, torch.fmod(x, torch.where(y == 0, 1, y)))


def _wrapped(index: torch.Tensor, extent: int) -> torch.Tensor:
    index = index.long()
    return torch.where(index < 0, index + extent, index)


def _idiv(x, y):
    """torch.div(x, y, rounding_mode="trunc") of integers, and 0 for a division by 0 (as _fmod)."""
    return torch.where(y == 0, 0, torch.div(x, torch.where(y == 0, 1, y), rounding_mode="trunc"))


_UNARY = per_op({
    "exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "neg": torch.neg,
    "recip": torch.reciprocal, "silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "square": torch.square, "cos": torch.cos, "sin": torch.sin, "abs": torch.abs,
    "erf": torch.erf, "log1p": torch.log1p, "expm1": torch.expm1,
    "inf_to_zero": lambda x: torch.where(torch.isinf(x), torch.zeros_like(x), x),
    "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "round": torch.round, "sign": torch.sign,
    "erfinv": torch.erfinv, "erfc": torch.erfc, "bit_not": torch.bitwise_not,
}, "unary", where="interpreter")
_BINARY = per_op({
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
    "min": torch.minimum, "pow": torch.pow, "fmod": _fmod, "idiv": _idiv,
    "atan2": torch.atan2, "hypot": torch.hypot, "copysign": torch.copysign, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
    "ge": torch.ge, "eq": torch.eq, "ne": torch.ne, "bit_and": torch.bitwise_and, "bit_or": torch.bitwise_or,
    "bit_xor": torch.bitwise_xor, "shl": torch.bitwise_left_shift, "shr": torch.bitwise_right_shift,
}, "binary", "compare", where="interpreter")
_EMPTY_REDUCE = per_op(  # a reduction over nothing
    {"sum": 0.0, "max": float("-inf"), "min": float("inf"), "prod": 1.0}, "reduce", where="interpreter")


def interpret(graph: Graph, inputs: Mapping[str, torch.Tensor], compute_dtype: torch.dtype | None = None,
              env: Mapping[str, int] | None = None, exact: set[int] = frozenset()) -> list[torch.Tensor]:
    """Evaluate the graph's outputs. `env` binds symbols no input shape determines
    (a split count); the others are read from the inputs. With a `compute_dtype`,
    the casts whose node ids are in `exact` are value identities even if they round
    (the candidate check compares graphs whose MatMul operands round in other places)."""
    if not isinstance(graph, Graph):
        raise TypeError(f"interpret: graph must be a cleave Graph (cleave.parse_graph(text) reads a text form), "
                        f"got {type(graph).__name__}")
    if not isinstance(inputs, Mapping):
        raise TypeError(f"interpret: inputs must be a dict of input name -> torch.Tensor, got {type(inputs).__name__}")
    wrong = next((k for k, v in inputs.items() if not isinstance(v, torch.Tensor)), None)
    if wrong is not None:
        raise TypeError(f"interpret: input {wrong!r} must be a torch.Tensor, got {type(inputs[wrong]).__name__}")
    env = graph.bind({k: tuple(v.shape) for k, v in inputs.items()}, extra=dict(env or {}))
    unbound = sorted(s.name for s in graph.symbols() if s.name not in env)
    if unbound:  # a split count: no input's shape holds it
        raise BindingError(f"interpret: no value for {', '.join(unbound)} (no input's shape gives it): pass "
                           f"env={{{unbound[0]!r}: ...}}")
    values: dict[int, torch.Tensor] = {}
    device = next(iter(inputs.values())).device if inputs else None

    def float_type(dtype: DType) -> torch.dtype:
        if compute_dtype is not None and dtype.is_float:
            return compute_dtype
        return TORCH_DTYPES[dtype]

    for node in graph.live_nodes():
        args = [values[x.id] for x in node.inputs]
        if node.op == "cast" and compute_dtype is not None and node.id not in exact \
                and rounds(node.inputs[0].dtype, node.dtype):
            values[node.id] = args[0].to(TORCH_DTYPES[node.dtype]).to(compute_dtype)
            continue
        value = _eval(node, args, inputs, env, float_type, device)
        if not (node.dtype.is_float or value.dtype.is_floating_point):
            # torch widens an integer sum or product to int64; the IR's type wraps it, as the kernels do
            value = value.to(TORCH_DTYPES[node.dtype])
        values[node.id] = value
    return [values[o.id] for o in graph.outputs]


def _as_stored(x: torch.Tensor, dtype: DType) -> torch.Tensor:
    """x rounded to dtype where it is a half type x is held wider than."""
    if dtype in (DType.f16, DType.bf16) and x.is_floating_point() and x.dtype != TORCH_DTYPES[dtype]:
        return x.to(TORCH_DTYPES[dtype]).to(x.dtype)
    return x


def _eval(node: Node, args, inputs, env, float_type, device) -> torch.Tensor:
    op, a = node.op, node.attrs
    if op == "input":
        return inputs[a["name"]].to(float_type(node.dtype))
    if op == "const":  # a half const is the number torch computes with, in f32 (a 0-d tensor: no promotion)
        dtype = float_type(node.dtype)
        return torch.tensor(a["value"], dtype=torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype,
                            device=device)
    if op == "size":
        return torch.tensor(D.evaluate(a["value"], env), dtype=float_type(node.dtype), device=device)
    if op == "iota":
        shape = [D.evaluate(d, env) for d in a["shape"]]
        axis = a["axis"]
        index = torch.arange(shape[axis], dtype=float_type(node.dtype), device=device)
        view = [1] * len(shape)
        view[axis] = shape[axis]
        return index.reshape(view).expand(shape)
    if reads_half_rounded(op, node.dtype):
        args = [_as_stored(x, half_read(n)) for x, n in zip(args, node.inputs)]
    if op in _UNARY:
        x = args[0]
        if node.dtype.is_float and not x.is_floating_point():  # exp of an integer: a float function
            x = x.to(float_type(node.dtype))
        return _UNARY[op](x)
    if op == "cast":
        return args[0].to(float_type(node.dtype))
    if op in _BINARY:
        x, y = args
        if node.dtype.is_float or op in COMPARE:
            common = torch.promote_types(x.dtype, y.dtype)
            x, y = x.to(common), y.to(common)
        return _BINARY[op](x, y).to(float_type(node.dtype))
    if op == "where":
        return torch.where(args[0], args[1], args[2]).to(float_type(node.dtype))
    if op == "matmul":
        x, y = args
        common = torch.promote_types(x.dtype, y.dtype)
        return torch.matmul(x.to(common), y.to(common))
    if op == "reduce":
        x, axis, keep = args[0], a["axis"], bool(a["keepdim"])
        if x.shape[axis] == 0:
            fill = _EMPTY_REDUCE[a["op"]]
            if not x.is_floating_point() and math.isinf(fill):  # an integer max/min over nothing: its bound
                low, high = (False, True) if x.dtype == torch.bool else (torch.iinfo(x.dtype).min,
                                                                         torch.iinfo(x.dtype).max)
                fill = low if fill < 0 else high
            shape = list(x.shape)
            shape[axis] = 1
            out = torch.full(shape, fill, dtype=x.dtype, device=x.device)
            return out if keep else out.squeeze(axis)
        if a["op"] == "sum":
            return x.sum(axis, keepdim=keep)
        if a["op"] == "prod":
            return x.prod(axis, keepdim=keep)
        fn = torch.amax if a["op"] == "max" else torch.amin
        return fn(x, dim=axis, keepdim=keep)
    if op == "broadcast":
        return args[0].expand([D.evaluate(d, env) for d in a["shape"]])
    if op == "reshape":
        return args[0].reshape([D.evaluate(d, env) for d in a["shape"]])
    if op == "permute":
        return args[0].permute(*a["perm"])
    if op == "slice":
        index = [slice(None)] * args[0].dim()
        index[a["axis"]] = slice(D.evaluate(a["start"], env), D.evaluate(a["stop"], env), a["step"])
        return args[0][tuple(index)]
    if op == "concat":
        common = args[0].dtype
        for x in args[1:]:
            common = torch.promote_types(common, x.dtype)
        return torch.cat([x.to(common) for x in args], dim=a["axis"])
    if op == "gather":  # a negative index counts from the end of the axis, as in x[index]
        return torch.gather(args[0], a["axis"], _wrapped(args[1], args[0].shape[a["axis"]]))
    if op == "take":
        x, axis = args[0], a["axis"]
        index = _wrapped(args[1], x.shape[axis])
        flat = torch.index_select(x, axis, index.reshape(-1))
        return flat.reshape(x.shape[:axis] + index.shape + x.shape[axis + 1:])
    if op == "topk":
        values, indices = torch.topk(args[0], a["k"], dim=a["axis"])
        return values if a["which"] == "values" else indices
    if op == "split":
        return _split(args[0], a["axis"], D.evaluate(a["count"], env), a["pad"])
    raise CleaveError(f"the interpreter has no rule for op {op!r}")


def _split(x: torch.Tensor, axis: int, count: int, pad) -> torch.Tensor:
    n = x.shape[axis]
    inner = -(-n // count)
    missing = count * inner - n
    if missing:
        shape = list(x.shape)
        shape[axis] = missing
        if not x.dtype.is_floating_point and math.isinf(pad):  # a max's or min's neutral element
            pad = torch.iinfo(x.dtype).min if pad < 0 else torch.iinfo(x.dtype).max
        x = torch.cat([x, torch.full(shape, pad, dtype=x.dtype, device=x.device)], dim=axis)
    return x.reshape(x.shape[:axis] + (count, inner) + x.shape[axis + 1:])
