"""`cleave.compile(fn, dynamic=...)`: compile once, serve every shape.

The first call captures `fn` whole. When the frontend meets an op it cannot map,
the function is run through torch.compile with cleave's partitioning backend
instead: dynamo gives the FX graph, the supported runs are compiled, the rest runs
eagerly. Calls whose shapes differ only along dynamic axes reuse the operator;
a new shape along a static axis recaptures (cheap) and reuses the search.
"""
from __future__ import annotations

import inspect

import torch

from ..ir import CleaveError
from .context import Context
from .partition import Launcher, exact_key, remember_fast


class CompiledFunction:
    def __init__(self, fn, dynamic=None, device=None, top_k: int = 4, artifact=None):
        self.fn = fn
        self.dynamic = dynamic
        self.ctx = Context(device, top_k, artifact)
        self.calls = 0
        self._params = _param_names(fn)
        self._runners: dict[tuple, object] = {}
        self._seen: dict[tuple, object] = {}  # exact argument shapes -> runner: skips the signature
        self._dynamo = None

    @property
    def stats(self) -> dict:
        return {"calls": self.calls, **self.ctx.stats()}

    @property
    def operators(self):
        return list(self.ctx.operators.values())

    def __call__(self, *args):
        self.calls += 1
        if self._dynamo is not None:
            return self._call_dynamo(args)
        exact = exact_key(args)
        runner = self._seen.get(exact)
        if runner is not None:
            return runner(*args)
        sig = self._signature(args)
        runner = self._runners.get(sig)
        if runner is None:
            runner = self._runners[sig] = self._build(args)
            if runner is None:
                return self._call_dynamo(args)
        result = runner(*args)
        remember_fast(self._seen, exact, runner, args)
        return result

    def prepare(self, *args):
        """Search (or load) and schedule for the shapes of `args` without running: the
        tensors may be on the meta device. Writes the artifact; returns the operator."""
        sig = self._signature(args)
        runner = self._runners.get(sig)
        if runner is None:
            runner = self._runners[sig] = self._build(args)
        if not isinstance(runner, Launcher):
            raise CleaveError(f"{getattr(self.fn, '__name__', 'fn')} does not capture whole "
                              f"({', '.join(self.ctx.stats()['unsupported']) or 'graph break'}): nothing to prepare")
        runner.op.prepare({k: tuple(a.shape) for k, a in zip(runner.names, args) if k in runner.op.graph.inputs})
        return runner.op

    # -- whole-function capture -------------------------------------------
    def _axes(self, index: int, tensor: torch.Tensor) -> dict[int, str]:
        if self.dynamic == "all":
            return {i: f"{self._params[index]}_{i}" for i in range(tensor.dim())}
        return dict((self.dynamic or {}).get(self._params[index], {}))

    def _signature(self, args) -> tuple:
        sig = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                dyn = self._axes(i, a)
                sig.append((a.dtype, a.device.type, tuple(-1 if k in dyn else s for k, s in enumerate(a.shape))))
            else:
                sig.append(a)
        return tuple(sig)

    def _build(self, args):
        from .. import capture
        from ..frontends.errors import CaptureError, UnsupportedOpError

        try:
            graph = capture(self.fn, *args, dynamic=self.dynamic, name=getattr(self.fn, "__name__", None))
        except UnsupportedOpError as err:
            self.ctx.warn_unsupported(err.op, getattr(self.fn, "__name__", "fn"))
            self._dynamo = _dynamo_compile(self.fn, self.ctx, {err.op})
            return None
        except CaptureError:  # torch.export cannot take fn whole: dynamo splits it into graphs it can
            self._dynamo = _dynamo_compile(self.fn, self.ctx, set())
            return None
        symbols = _dynamic_symbols(graph, self.dynamic, self._params)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        op = self.ctx.operator(graph, symbols, device)
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return Launcher(op, self.ctx, self._params[:len(args)], len(graph.outputs) != 1, self.fn, name)

    # -- graph breaks through dynamo --------------------------------------
    def _call_dynamo(self, args):
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                for axis in self._axes(i, a):
                    torch._dynamo.maybe_mark_dynamic(a, axis)
        return self._dynamo(*args)


def _dynamo_compile(fn, ctx: Context, unsupported: set[str]):
    from .backend import partitioning_backend
    from .partition import op_name

    return torch.compile(fn, backend=partitioning_backend(ctx, {op_name(o) for o in unsupported}), dynamic=None)


def _dynamic_symbols(graph, dynamic, params) -> set[str]:
    """The graph symbols on the axes the user marked dynamic."""
    if dynamic is None:
        return set()
    symbols = set()
    for name, node in graph.inputs.items():
        axes = range(node.rank) if dynamic == "all" else (dynamic.get(name) or {})
        for axis in axes:
            symbols |= {s.name for s in node.shape[axis].free_symbols}
    return symbols


def _param_names(fn) -> list[str]:
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        return [p.name for p in inspect.signature(target).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return []


def compile(fn, dynamic=None, device=None, top_k: int = 4, artifact=None) -> CompiledFunction:
    """Wrap `fn` so that its first call compiles it with cleave and later calls reuse the result.

    `dynamic` names the axes that vary between calls, per argument name:
    `{"q": {0: "b"}, "k": {2: "L"}}`, or "all". `compiled.stats` counts calls,
    searches, compiles, cache hits and graph breaks. `artifact` is a directory built
    elsewhere (`cleave trace build`) to load operators from, whatever machine built it."""
    if dynamic is not None and dynamic != "all" and not isinstance(dynamic, dict):
        raise TypeError(f"dynamic must be None, 'all' or a dict of axes per argument, not {dynamic!r}")
    return CompiledFunction(fn, dynamic, device, top_k, artifact)
