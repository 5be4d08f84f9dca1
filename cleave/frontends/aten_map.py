"""The table of aten ops cleave can capture: one Rule per op (or per overload).

A rule is `fn(translator, fx_node, args) -> value` plus an optional `check(args,
fx_node) -> reason | None` for arguments it cannot express (a slice step, a dropout
probability). `is_supported` reads the same table, so the runtime can split an FX
graph into regions cleave compiles and regions left to torch.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import torch

SIZE_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)
# Assertions torch.export inserts on shapes, which it guards: they compute nothing. Not
# `_assert_async`, a check of tensor data (`torch._assert_async`, a Python `assert` on a
# tensor under dynamo): it has no rule, so it runs eagerly (a graph break), and raises.
IGNORED = {"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size"}


@dataclass(frozen=True)
class Rule:
    fn: Callable
    check: Callable | None = None
    # what the IR expresses but kernels would compute inexactly (an integer MatMul):
    # captured, and left to torch by the torch.compile backend
    kernel_check: Callable | None = None

    def unsupported(self, args, fx_node=None) -> str | None:
        return self.check(args, fx_node) if self.check else None

    def unsupported_in_kernels(self, args, fx_node=None) -> str | None:
        return self.unsupported(args, fx_node) or (self.kernel_check(args, fx_node) if self.kernel_check else None)


RULES: dict[str, Rule] = {}


def rule(*names: str, check: Callable | None = None, kernel_check: Callable | None = None):
    """Register fn for aten ops given as 'softmax' (every overload) or 'div.Tensor_mode'."""
    def register(fn):
        for name in names:
            if name in RULES:
                raise ValueError(f"aten op {name} has two rules")
            RULES[name] = Rule(fn, check, kernel_check)
        return fn
    return register


def rule_for(fx_node) -> Rule | None:
    """The rule of an aten op by name, or of a prims op (what some of PyTorch's
    decompositions leave) registered as 'prims.NAME': prims.var is not aten.var."""
    target = fx_node.target
    if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
        return None
    packet = target._schema.name.split("::")[-1]
    if target.namespace == "prims":
        return RULES.get(f"prims.{packet}")
    return RULES.get(f"{packet}.{target._overloadname}") or RULES.get(packet)


def is_ignored(fx_node) -> bool:
    target = fx_node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.name.split("::")[-1] in IGNORED


def is_supported(fx_node) -> bool:
    """Whether the torch.compile backend compiles this FX node: `capture` translates it
    (aten-level graphs, as torch.export or aot_autograd produce) and the kernels compute
    it exactly. Placeholders and outputs always are."""
    return unsupported_reason(fx_node) is None


def unsupported_reason(fx_node) -> str | None:
    """None where `capture` can translate this FX node; otherwise what stops it: "" for
    an op with no rule (or not a function call), else the dtype or the arguments (a
    complex multiply is `aten.mul.Tensor` on complex64, not a missing op)."""
    from ..interpreter import IR_DTYPES
    from .translate import scalar_has_ir_form

    if fx_node.op in ("placeholder", "output"):
        return None
    if fx_node.op != "call_function":
        return ""
    val = fx_node.meta.get("val")
    if isinstance(val, SIZE_TYPES) or fx_node.target is operator.getitem or is_ignored(fx_node):
        return None
    found = rule_for(fx_node)
    if found is None:
        return ""
    vals = val if isinstance(val, (tuple, list)) else [val]
    dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in vals
                     if isinstance(v, torch.Tensor) and v.dtype not in IR_DTYPES})
    if dtypes:
        return f"on {', '.join(dtypes)}"
    args = meta_args(fx_node)
    reason = found.unsupported_in_kernels(args, fx_node)
    operands = [v for a in args.values() for v in (a if isinstance(a, (list, tuple)) else [a])]
    opaque = next((v for v in operands if isinstance(v, (torch.SymInt, torch.SymFloat))
                   and not scalar_has_ir_form(v.node.expr)), None)
    if reason is None and opaque is not None:  # else the whole region fails to translate
        return f"on the scalar {opaque.node.expr}, which has no IR form"
    shaped = [v for v in (*vals, *operands) if isinstance(v, torch.Tensor) and v.dim()]
    if reason is None and (any(map(_is_f64, shaped)) or _f64_of_tensors(fx_node)):
        return "on float64 (cleave's kernels compute floats in f32, which would round it)"
    return reason


def _is_f64(v) -> bool:
    return isinstance(v, torch.Tensor) and v.dtype == torch.float64


def _values(fx_node) -> list:
    val = fx_node.meta.get("val")
    return list(val) if isinstance(val, (tuple, list)) else [val]


def _f64_of_tensors(fx_node) -> bool:
    """Whether the node's float64 value is computed from tensors' values: one of rank > 0
    (`x.sum(dtype=torch.float64)`), or such a value (its `+ 1`, after the sum ran
    eagerly). One of sizes or of a float argument (a placeholder under dynamic=True),
    such as a decomposition's 1/sqrt(d), is taken as a Python number is."""
    if not any(map(_is_f64, _values(fx_node))):
        return False
    return any(any(isinstance(v, torch.Tensor) and v.dim() for v in _values(x)) or _f64_of_tensors(x)
               for x in fx_node.all_input_nodes)


def supported_ops() -> list[str]:
    return sorted(RULES)


def bind_args(fx_node, convert) -> dict:
    """The op's arguments by schema name, defaults filled in, each passed through convert."""
    out = {}
    for i, arg in enumerate(fx_node.target._schema.arguments):
        if i < len(fx_node.args) and not arg.kwarg_only:
            out[arg.name] = convert(fx_node.args[i])
        elif arg.name in fx_node.kwargs:
            out[arg.name] = convert(fx_node.kwargs[arg.name])
        else:
            out[arg.name] = arg.default_value if arg.has_default_value() else None
    return out


def meta_args(fx_node) -> dict:
    def meta(raw):
        if isinstance(raw, torch.fx.Node):
            return raw.meta.get("val")
        if isinstance(raw, (list, tuple)):
            return type(raw)(meta(r) for r in raw)
        return raw

    return bind_args(fx_node, meta)


from . import aten_attention, aten_elementwise, aten_layout, aten_reduce, aten_scatter, aten_windows  # noqa: E402,F401  (they register rules)
