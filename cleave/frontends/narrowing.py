"""In-place writes whose result type the written tensor cannot hold (an int64 tensor's
`mul_(2.5)`): eager raises "result type Float can't be cast to the desired output
type Long", while torch's meta kernels, and functionalization after them, let the op
through, and the compiled code wrote the truncated product. Each in-place op of a
traced graph runs once on one-element tensors of its operands' types, which raises
torch's own error where eager would."""
from __future__ import annotations

import operator

import torch

CAST_REFUSAL = "can't be cast to the desired output type"

# Python's augmented assignments, which dynamo records as functions (`x *= 2.5`).
INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                     operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift,
                     operator.irshift}


def refusal(op, args, kwargs, value_of) -> str | None:
    """torch's error for `op` on stand-ins of its operands (`value_of` reads an FX node's
    traced value) where it refuses the write's type; None where it runs, or fails for
    any other reason (the stand-ins' shapes)."""
    def stand_in(arg):
        if isinstance(arg, (list, tuple)):
            return type(arg)(stand_in(a) for a in arg)
        val = value_of(arg) if isinstance(arg, torch.fx.Node) else arg
        if isinstance(val, torch.Tensor):
            return torch.ones(() if val.dim() == 0 else (1,), dtype=val.dtype)
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return type(val.node.hint)(val.node.hint) if val.node.hint is not None else 1
        return val

    try:
        op(*stand_in(tuple(args)), **{k: stand_in(v) for k, v in kwargs.items()})
    except RuntimeError as err:
        return str(err) if CAST_REFUSAL in str(err) else None
    except Exception:  # noqa: BLE001 - not a dtype refusal: the op is judged elsewhere
        return None
    return None


def aten_refusal(node) -> str | None:
    """refusal() of an in-place elementwise aten op of an exported graph."""
    tags = getattr(node.target, "tags", ())
    if node.op != "call_function" or torch.Tag.inplace not in tags or torch.Tag.pointwise not in tags:
        return None
    return refusal(node.target, node.args, node.kwargs, lambda n: n.meta.get("val"))


def dynamo_refusal(node) -> str | None:
    """refusal() of an in-place method call or augmented assignment of dynamo's graph."""
    if node.op == "call_method" and node.target.endswith("_") and not node.target.startswith("_"):
        op = getattr(torch.Tensor, node.target, None)
    elif node.op == "call_function" and node.target in INPLACE_OPERATORS:
        op = node.target
    else:
        return None
    if op is None:
        return None
    return refusal(op, node.args, node.kwargs, lambda n: n.meta.get("example_value"))
