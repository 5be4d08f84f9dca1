"""The torch.compile backend: `torch.compile(model, backend="cleave")`.

Registered through the `torch_dynamo_backends` entry point in pyproject.toml.
Dynamo hands over an FX graph per frame; supported runs of nodes become cleave
operators, unsupported ones run eagerly (partition.py). Dims dynamo made
symbolic (mark_dynamic, automatic dynamic) are the operators' dynamic axes. All
graphs of a process share one Context, so a dynamo recompile of the same graph
reuses its operator: `context()` gives it, `reset()` starts a fresh one.
"""
from __future__ import annotations

from .context import Context
from .partition import build

_CONTEXT = Context()


def context() -> Context:
    return _CONTEXT


def reset() -> Context:
    global _CONTEXT
    _CONTEXT = Context()
    return _CONTEXT


def partitioning_backend(ctx: Context, unsupported: set[str] = frozenset()):
    def backend(gm, example_inputs):
        return build(gm, ctx, set(unsupported))
    return backend


def cleave_backend(gm, example_inputs):
    return build(gm, _CONTEXT, set())
