"""Errors of the torch frontend, and where in the user's source an FX node came from."""
from __future__ import annotations

import os
import re

from ..ir import CleaveError

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_TORCH_DIR = None


class CaptureError(CleaveError):
    """torch could not trace the function, or its example inputs do not fit `dynamic`."""


class Unify(CaptureError):
    """An op needs two dims equal that the IR reads as different expressions: read the
    IR symbol `.symbol` as `.expr` and translate again (cleave.frontends.unify). SDPA's
    k and v lengths under automatic dynamic shapes are a symbol each; the halves of
    `x.chunk(2)` over a dynamic width s are ceil(s/2) and s - ceil(s/2)."""

    def __init__(self, message: str, symbol: str, expr):
        super().__init__(message)
        self.symbol, self.expr = symbol, expr


class UnsupportedOpError(CaptureError):
    """An aten op (or an argument of it) has no IR mapping. `.op` names the aten op and
    `.source` the user's file:line (None when torch recorded no stack trace); the
    runtime turns this into a graph break."""

    def __init__(self, op: str, source: str | None, reason: str = "has no cleave IR mapping"):
        self.op, self.source, self.reason = op, source, reason
        where = f" (at {source})" if source else ""
        super().__init__(f"cannot capture {op}{where}: {reason}")


def source_of(fx_node) -> str | None:
    """The innermost user frame ('file:line') of the node's recorded stack trace,
    skipping frames inside torch and inside cleave (the wrapper calling a module); torch's
    innermost frame where the op is all torch's (a module of torch.nn called directly)."""
    trace = fx_node.meta.get("stack_trace") if hasattr(fx_node, "meta") else None
    if not trace:
        return None
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames = [(path, line) for path, line in _FRAME.findall(trace) if not os.path.abspath(path).startswith(own)]
    for path, line in reversed(frames):
        if not os.path.abspath(path).startswith(_torch_dir()):
            return f"{path}:{line}"
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else None


def op_name(fx_node) -> str:
    """'aten.softmax.int' for an OpOverload, the Python name for anything else."""
    target = fx_node.target
    if hasattr(target, "_schema"):
        return str(target)
    return getattr(target, "__name__", str(target))


def decomposed_from(fx_node) -> str | None:
    """The function the user called that a decomposition made this op of (`dropout`
    for the `rand_like` of F.dropout, `index_copy_` for an `index_put`), as torch
    records it in the node's source_fn_stack; None where the op is the one called."""
    stack = fx_node.meta.get("source_fn_stack") if hasattr(fx_node, "meta") else None
    if not stack:
        return None
    target = stack[-1][1]  # [0] is dynamo's node name (`float_1`), no name of the user's
    called = target if isinstance(target, str) else getattr(target, "__name__", None)
    packet = fx_node.target._schema.name.split("::")[-1] if hasattr(fx_node.target, "_schema") else ""
    if not isinstance(called, str) or called.strip("_") in packet or packet.strip("_") in called:
        return None
    return called


def _torch_dir() -> str:
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
    return _TORCH_DIR
