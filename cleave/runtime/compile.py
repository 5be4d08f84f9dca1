"""`cleave.compile(fn, dynamic=...)`: compile once, serve every shape.

The first call captures `fn` whole. When the frontend meets an op it cannot map,
the function is run through torch.compile with cleave's partitioning backend
instead: dynamo gives the FX graph, the supported runs are compiled, the rest runs
eagerly. Calls whose shapes differ only along dynamic axes reuse the operator;
a new shape along a static axis recaptures (cheap) and reuses the search.
"""
from __future__ import annotations

import inspect
import os

import torch

from .. import passes
from ..ir import CleaveError
from .context import Context
from .graph_breaks import Launcher, constant_getters, exact_key, remember_fast


class CompiledFunction:
    def __init__(self, fn, dynamic=None, device=None, top_k: int = 4, artifact=None, verbose=None, rules=None,
                 candidates: int = 1):
        self.fn = fn
        self.name = _function_name(fn)
        self.dynamic = dynamic
        self.ctx = Context(device, top_k, artifact, verbose, rules, candidates)
        self.calls = 0
        self._signature_of = _call_signature(fn)
        self._runners: dict[tuple, object] = {}
        self._seen: dict[tuple, object] = {}  # exact argument shapes -> runner: skips the signature
        self._dynamo = None
        # Why torch.export did not take the function whole (it then runs through dynamo's
        # graphs, its first call eagerly); None when it did, or has not been tried.
        self.capture_error: str | None = None

    @property
    def stats(self) -> dict:
        return {"calls": self.calls, **self.ctx.stats()}

    @property
    def operators(self):
        return list(self.ctx.operators.values())

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if kwargs:
            args, kwargs = self._positional(args, kwargs)
        if self._dynamo is not None or kwargs:
            return self._call_dynamo(args, kwargs)
        exact = exact_key(args)
        runner = self._seen.get(exact)
        if runner is not None:
            return runner(*args)
        sig = self._signature(args)
        runner = self._runners.get(sig)
        if runner is None:
            runner = self._build(args)
            if isinstance(runner, _Ran):
                return runner.result
            if runner is None:
                return self._call_dynamo(args, {})
            self._runners[sig] = runner
        result = runner(*args)
        remember_fast(self._seen, exact, runner, args)
        return result

    def prepare(self, *args):
        """Search (or load) and schedule for the shapes of `args` without running: the
        tensors may be on the meta device. Writes the artifact; returns the operator."""
        sig = self._signature(args)
        runner = self._runners.get(sig)
        if runner is None:
            runner = self._build(args)
        if not isinstance(runner, Launcher):
            why = self.capture_error or ", ".join(self.ctx.stats()["unsupported"]) or "graph break"
            raise CleaveError(f"{self.name} does not capture whole ({why}): nothing to prepare")
        self._runners[sig] = runner
        runner.op.prepare({k: tuple(v.shape) for k, v in runner.inputs(args).items()})
        return runner.op

    def _positional(self, args, kwargs) -> tuple[tuple, dict]:
        """Keyword arguments moved to their positions where the signature allows; the
        rest (keyword-only ones) stay keywords, which whole-function capture cannot take."""
        if self._signature_of is None:
            return args, kwargs
        try:
            bound = self._signature_of.bind(*args, **kwargs)
        except TypeError:
            return args, kwargs  # the call itself is wrong: eager raises Python's own error
        return tuple(bound.args), dict(bound.kwargs)

    # -- whole-function capture -------------------------------------------
    def _params(self, count: int) -> list[str]:
        from ..frontends.capture import param_names

        return param_names(self.fn, count)

    def _axes(self, name: str, tensor: torch.Tensor) -> dict[int, str]:
        if self.dynamic == "all":
            return {i: f"{name}_{i}" for i in range(tensor.dim())}
        return dict((self.dynamic or {}).get(name, {}))

    def _signature(self, args) -> tuple:
        sig = []
        for name, a in zip(self._params(len(args)), args):
            if isinstance(a, torch.Tensor):
                dyn = self._axes(name, a)
                sig.append((a.dtype, a.device.type, tuple(-1 if k in dyn else s for k, s in enumerate(a.shape))))
            else:
                sig.append(a)
        return tuple(sig)

    def _build(self, args):
        from ..frontends.capture import capture_program
        from ..frontends.errors import CaptureError, UnsupportedOpError

        try:
            with passes.recording(self.ctx.pass_seconds), passes.timed("capture"):
                captured = capture_program(self.fn, *args, dynamic=self.dynamic, name=self.name)
        except UnsupportedOpError:  # dynamo cuts the function around that op (its warning names it)
            self._dynamo = _dynamo_compile(self.fn, self.ctx, self.name)
            return None
        except CaptureError as err:
            captured = None
            self.capture_error = str(err)
        if captured is not None and captured.views:
            # eager returns these outputs as views of an input (writing to one writes the
            # input); dynamo's graphs, through AOTAutograd, regenerate them as views
            self.capture_error = f"output(s) {', '.join(captured.views)} are views of an input"
            self._dynamo = _dynamo_compile(self.fn, self.ctx, self.name)
            return None
        if captured is None:
            # Either fn is wrong for these inputs (a shape error), and eager raises its own
            # error here, or torch.export cannot take it whole: dynamo splits it into graphs
            # it can. This call's eager result is kept (running fn twice would repeat its
            # in-place ops); no runner is kept until it has run.
            result = self.fn(*args)
            self._dynamo = _dynamo_compile(self.fn, self.ctx, self.name)
            return _Ran(result)
        params = self._params(len(args))
        graph = captured.graph
        symbols = _dynamic_symbols(graph, self.dynamic, params)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        op = self.ctx.operator(graph, symbols, device)
        module = self.fn if isinstance(self.fn, torch.nn.Module) else None
        user_outputs = len(graph.outputs) - len(captured.writes)
        return Launcher(op, self.ctx, params, user_outputs != 1, self.fn, self.name,
                        state=_state_getters(module, captured.state) | constant_getters(captured.constants, device),
                        writes=captured.writes)

    # -- graph breaks through dynamo --------------------------------------
    def _call_dynamo(self, args, kwargs):
        if self._dynamo is None:
            self._dynamo = _dynamo_compile(self.fn, self.ctx, self.name)
        for name, a in zip(self._params(len(args)), args):
            if isinstance(a, torch.Tensor):
                for axis in self._axes(name, a):
                    torch._dynamo.maybe_mark_dynamic(a, axis)
        return self._dynamo(*args, **kwargs)


class _Ran:
    """What a first call that ran eagerly returned."""

    def __init__(self, result):
        self.result = result


def _dynamo_compile(fn, ctx: Context, name: str):
    from .backend import partitioning_backend

    return torch.compile(fn, backend=partitioning_backend(ctx, name), dynamic=None)


def _dynamic_symbols(graph, dynamic, params) -> set[str]:
    """The graph symbols on the axes the user marked dynamic."""
    if dynamic is None:
        return set()
    symbols = set()
    for name, node in graph.inputs.items():
        if name not in params:
            continue  # a module's parameter or buffer: static
        axes = range(node.rank) if dynamic == "all" else (dynamic.get(name) or {})
        for axis in axes:
            symbols |= {s.name for s in node.shape[axis].free_symbols}
    return symbols


def _state_getters(module, state: dict[str, str]) -> dict:
    """graph input -> a function reading that parameter or buffer off the module at
    call time (an optimizer step or load_state_dict between calls is seen)."""
    def getter(path):
        *owners, attr = path.split(".")

        def get():
            owner = module
            for name in owners:
                owner = getattr(owner, name)
            return getattr(owner, attr)
        return get

    return {name: getter(key) for name, key in state.items()}


def _call_signature(fn):
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def _function_name(fn) -> str:
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return getattr(fn, "__name__", None) or type(fn).__name__


def compile(fn, dynamic=None, device=None, top_k: int = 4, artifact=None, verbose=None,
            rules=None, candidates: int = 1) -> CompiledFunction:
    """Wrap `fn` so that its first call compiles it with cleave and later calls reuse the result.

    `dynamic` names the axes that vary between calls, per argument name:
    `{"q": {0: "b"}, "k": {2: "L"}}`, or "all". `compiled.stats` counts calls,
    searches, compiles, cache hits and graph breaks. `artifact` is a directory built
    elsewhere (`cleave trace build`) to load operators from, whatever machine built it.
    `verbose`: True shows this function's progress lines (search, compile, tuning),
    False hides them; None leaves it to the "cleave" logger's level (INFO shows them).
    `rules`: rule files (paths) to search with beside the library, as `cleave optimize
    --rules`: their rules are proven here, before anything runs (UnsoundRule names an
    unsound one with its counterexample), and they are part of the operators' cache key.
    `candidates`: how many of the search's first candidates each operator schedules and
    ranks by the cost model (`cleave trace build` ranks 3; each costs a schedule)."""
    if dynamic is not None and dynamic != "all" and not isinstance(dynamic, dict):
        raise TypeError(f"dynamic must be None, 'all' or a dict of axes per argument, not {dynamic!r}")
    if not (isinstance(top_k, int) and top_k >= 1):
        raise ValueError(f"top_k must be an int >= 1, not {top_k!r}")
    if not (isinstance(candidates, int) and candidates >= 1):
        raise ValueError(f"candidates must be an int >= 1, not {candidates!r}")
    if verbose not in (None, True, False):
        raise TypeError(f"verbose must be None, True or False, not {verbose!r}")
    return CompiledFunction(fn, dynamic, device, top_k, artifact, verbose, _proven_rules(rules), candidates)


def _proven_rules(files) -> list | None:
    """The library plus the rules of `files` (a path or a list of paths), those proven;
    None without files (the search's default, the library)."""
    if files is None:
        return None
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    from ..verify import with_proven_files

    return with_proven_files(list(files))[0]
