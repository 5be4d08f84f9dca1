"""`cleave.compile(fn, dynamic=...)`: compile once, serve every shape.

The first call captures `fn` whole. When the frontend meets an op it cannot map,
the function is run through torch.compile with cleave's partitioning backend
instead: dynamo gives the FX graph, the supported runs are compiled, the rest runs
eagerly. Calls whose shapes differ only along dynamic axes reuse the operator;
a new shape along a static axis recaptures and searches again (its sizes are numbers
of the graph: another graph), and after a third such shape cleave says which axes to
declare dynamic. A call taking another branch on a dynamic size is captured again.

What the capture bakes in besides the arguments' shapes is guarded as well. Part of
each launch's key, as traced code may branch on them: torch's global state (grad and
inference mode, the default dtype, deterministic algorithms), the autocast state, and
each tensor argument's layout and requires_grad. Guarded (guards.py: a new object, an
in-place change or a new value recaptures): the tensors, Python scalars and modules fn
reads from its globals and closure cells, the state of the modules it reaches, and fn's
own code and defaults. A module with forward hooks, state that cannot be compared, a forward
that assigns to its state, or a call made for its effect (`print`, `warnings.warn`) runs
through dynamo instead, which keeps those effects. A tensor subclass argument runs eagerly:
a capture would drop its type and its overrides. The compiled callable is opaque
to dynamo: inside a model under torch.compile it runs as one black box.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import logging
import os
import re
import threading
import types
import warnings
from pathlib import Path

import torch
from torch._dynamo.decorators import skip as _dynamo_skip
from torch._dynamo.utils import counters as _dynamo_counters
from torch.utils import _pytree as pytree

from .. import passes
from ..ir import BindingError, CleaveError
from ..torch_state import AUTOCAST_DEVICES
from .context import Context
from .user_frame import _user_level
from ..frontends.output_layout import permute_outputs
from .graph_breaks import GRAD_FALLBACK, Launcher, constant_getters, on_meta, overlapping, untraceable_call
from .guards import DYNAMO_HOOK_GUARDS, Guards, StateWatch, TensorContents, _python_function, _version
from .launch import remember

_log = logging.getLogger("cleave.compile")


class CompiledFunction:
    def __init__(self, fn, dynamic=None, device=None, top_k: int = 4, artifact=None, verbose=None, rules=None,
                 candidates: int = 1):
        self.fn = fn
        self.name = _function_name(fn)
        self.dynamic = dynamic
        self.ctx = Context(device, top_k, artifact, verbose, rules, candidates)
        self.calls = 0
        self.recaptures = 0  # captures redone because a global or closure value fn reads changed
        self._signature_of = _call_signature(fn)
        self._signed_code = _code_of(fn)  # the code _signature_of was read from
        self._runners: dict[tuple, list] = {}  # signature -> its captures, one per branch on a dynamic size
        self._seen: dict[tuple, object] = {}  # exact arguments (_call_key) -> runner: skips the signature
        self._guards: Guards | None = None  # what the runners baked in besides the arguments
        self._dynamo = None
        # A call through dynamo changed an argument in place (its version counter moved):
        # later calls whose arguments share memory run eagerly (_call_dynamo).
        self._writes_arguments = False
        self._dynamo_hooks = None  # the global module hooks and forward self._dynamo's frames were traced with
        self._rnn_noted = False  # whether the recurrent modules fn calls were looked for
        self._spec_fitted = False  # whether `dynamic` fit a call: it is checked against the first
        self._said: set[str] = set()  # the warnings about `dynamic` given
        self._static_shapes: dict[tuple, set] = {}  # (argument, rank, dtype) -> its shapes captured
        self._first_calls = threading.RLock()
        self._lazy = isinstance(fn, torch.nn.Module)  # until its lazy modules, if any, have their parameters
        # Why torch.export did not take the function whole (it then runs through dynamo's
        # graphs, its first call eagerly); None when it did, or has not been tried.
        self.capture_error: str | None = None
        # A coroutine or generator function's body runs when awaited or iterated, not
        # when called: nothing to capture at the call (a trace made and dropped a coroutine)
        self._deferred = _deferred_body(fn)
        if not isinstance(fn, torch.nn.Module):  # a function's name, docstring and __wrapped__, as functools.wraps
            functools.update_wrapper(self, fn, updated=())

    def __get__(self, obj, objtype=None):
        """In a class body (`@cleave.compile` on a method) it binds as the function did."""
        return self if obj is None else types.MethodType(self, obj)

    @property
    def stats(self) -> dict:
        return {"calls": self.calls, "recaptures": self.recaptures, **self.ctx.stats()}

    @property
    def operators(self):
        return list(self.ctx.operators.values())

    def __call__(self, *args, **kwargs):
        if _dynamo_frame_hook() is not None:  # inside code torch.compile runs: none of cleave is traced
            return _with_dynamo_off(self, args, kwargs)
        self.calls += 1
        if self._deferred is not None:
            self._say_once(f"cleave: {self.name} runs eagerly: it is {self._deferred}, whose body runs after the call")
            return self.fn(*args, **kwargs)
        if kwargs:
            bound = self._positional(args, kwargs)
            if bound is None:  # the call itself is wrong (a misspelt keyword): eager raises Python's error,
                return self.fn(*args, **kwargs)  # and later calls are compiled as before
            args, kwargs = bound
        if self._lazy and _uninitialized(self.fn):
            # nn.LazyLinear and kin infer their parameters' shapes at their first call: run
            # it as eager does (traced under a dynamic axis, the inference met symbolic sizes)
            return self.fn(*args, **kwargs)
        self._lazy = False
        if on_meta(args) or kwargs and on_meta(kwargs.values()):
            # shapes only: eager infers them (a fake tensor: traced inside another capture)
            return self.fn(*args, **kwargs)
        if _tensor_subclass(args) is not None or kwargs and _tensor_subclass(kwargs.values()) is not None:
            return self._call_subclass_eagerly(args, kwargs)
        if kwargs and self._dynamo is None:
            return self._call_keywords(args, kwargs)
        if self._dynamo is not None:
            return self._call_dynamo(args, kwargs)
        if self._guards is not None and not self._guards.hold():
            self._forget_captures()
        exact = _call_key(args)
        if torch._C._is_any_autocast_enabled():  # autocast changes the captured graph's dtypes
            exact = (_AUTOCAST, exact, _autocast_state())
        try:
            runner = self._seen.get(exact)
        except TypeError:  # an unhashable argument (a dict, a list) keys no launch
            runner = None
        try:
            if runner is not None:
                return runner(*args)
            why = untraceable_call(args)  # a known shape's launch checks it itself
            if why is not None:  # before a capture, which would fail and leave fn to dynamo for good
                self.ctx.warn_eager(self.name, why)
                return self.fn(*args)
            # One thread at a time captures and makes a shape's first call: two torch.export
            # traces at once failed, and sent the function to dynamo for good.
            with self._first_calls:
                runner = self._runner_for(args)
                if isinstance(runner, _Ran):
                    return runner.result
                result = runner(*args)  # called here, not deeper: warnings name the user's line
                fast = runner.hot(args)
                if fast is not None:
                    remember(self._seen, exact, fast)
                return result
        except StateChanged:  # a parameter the capture read changed shape, dtype or tying: capture again
            pass
        except Exception as err:
            if isinstance(err.__context__, BindingError):  # the launcher ran eager: its error is the user's
                raise err from None
            raise
        # outside the handler: an error of this call (eager's, for a model moved to bf16 and
        # called with f32) is raised without StateChanged chained before it
        self._forget_captures()
        self.calls -= 1
        return self(*args)

    def prepare(self, *args):
        """Search (or load) and schedule for the shapes of `args` without running: the
        tensors may be on the meta device (prepared then for the compile's device, else
        this machine's: CUDA where it has one). Writes the artifact; returns the operator."""
        sig = self._signature(args)
        runner = self._runners.get(sig, [None])[0]
        if runner is None:
            runner = self._build(args)
        launcher = _launcher(runner)
        if not isinstance(launcher, Launcher):
            why = self.capture_error or ", ".join(self.ctx.stats()["unsupported"]) or "graph break"
            raise CleaveError(f"{self.name} does not capture whole ({why}): nothing to prepare")
        self._runners.setdefault(sig, [runner])
        launcher.op.prepare({k: tuple(v.shape) for k, v in launcher.inputs(args).items()})
        return launcher.op

    def _positional(self, args, kwargs) -> tuple[tuple, dict] | None:
        """Keyword arguments moved to their positions where the signature allows; the
        rest (keyword-only ones) stay keywords, which whole-function capture cannot take.
        None where the signature refuses the call."""
        code = _code_of(self.fn)
        if code is not self._signed_code:  # fn's code replaced (autoreload): its parameters may differ
            self._signature_of, self._signed_code = _call_signature(self.fn), code
        if self._signature_of is None:
            return args, kwargs
        try:
            bound = self._signature_of.bind(*args, **kwargs)
        except TypeError:
            return None
        return tuple(bound.args), dict(bound.kwargs)

    def _call_subclass_eagerly(self, args, kwargs):
        """A tensor subclass argument: a capture, and dynamo's graphs under cleave's backend,
        would drop its type and its __torch_function__ / __torch_dispatch__; eager keeps them."""
        named = {**dict(zip(self._params(len(args)), args)), **kwargs}
        name, value = next((n, a) for n, a in named.items() if _tensor_subclass([a]) is not None)
        self.ctx.warn_eager(self.name, f"argument {name!r} is a {type(value).__name__}, a torch.Tensor subclass, "
                                       f"whose type and overrides a capture would drop")
        return self.fn(*args, **kwargs)

    # -- whole-function capture -------------------------------------------
    def _runner_for(self, args):
        """The runner for a call whose exact shapes have not run yet, found or built; or,
        where it ran otherwise (eagerly, through dynamo), the call's result as a _Ran."""
        other = _non_tensor_argument(self._params(len(args)), args)
        if other is not None:
            return _Ran(self._call_non_tensors(args, *other))
        sig = self._signature(args)
        captures = self._runners.get(sig)
        if captures is None:
            self._hint_dynamic(args)
            runner = self._build(args)
            if runner is None:
                return _Ran(self._call_dynamo(args, {}))
            if isinstance(runner, _Ran):
                return runner
            captures = self._runners[sig] = [runner]  # traced at 2, an extent of 0 or 1 may not fit it
        return self._fitting(captures, args) or self._recapture(captures, args)

    def _hint_dynamic(self, args) -> None:
        """Said once, at a function's third shape of some argument along static axes: each
        shape is a search of its own, where a dynamic axis is one for every size. Not of
        calls under autograd: they run eagerly, searched at no shape."""
        if torch.is_grad_enabled() and _needs_grad(self.fn, [a for a in args if isinstance(a, torch.Tensor)]):
            return
        for name, a in zip(self._params(len(args)), args):
            if not isinstance(a, torch.Tensor):
                continue
            seen = self._static_shapes.setdefault((name, a.dim(), a.dtype), set())
            seen.add(tuple(a.shape))
            if len(seen) != 3:
                continue
            declared = self._spec(args).get(name, {})
            varied = [axis for axis in range(a.dim()) if axis not in declared and len({s[axis] for s in seen}) > 1]
            if varied:
                spec = {name: {axis: f"{name}_{axis}" for axis in varied}}
                warnings.warn(f"cleave.compile: {self.name} is searched again for each shape of {name!r} along "
                              f"axis {', '.join(map(str, varied))} (3 so far); dynamic={spec} (with your own "
                              f"names) serves every size from one search", stacklevel=_user_level())

    def _fitting(self, captures: list, args):
        """The first of a signature's captures whose constraints this call's shapes meet;
        None where a new capture should serve them. Code branching on a dynamic size
        traced one branch, under a constraint (`if x.shape[0] > 4`: n >= 5): a call taking
        another branch is captured again, up to MAX_CAPTURES a signature, as dynamo
        compiles each branch once. A None at the end marks a signature captured
        MAX_CAPTURES times, or whose shapes a new capture did not serve either: the
        first capture runs those calls eagerly, saying why."""
        if self.dynamic is None:  # static shapes: the signature fixes every size
            return captures[0]
        for runner in captures:
            if runner is not None and _launcher(runner).fits(args):
                return runner
        if captures[-1] is None or len(captures) >= MAX_CAPTURES:
            return captures[0]
        return None

    def _recapture(self, captures: list, args):
        """A capture for the branch this call takes, kept with the signature's others. An
        axis of extent 0 or 1 is traced at 2 (torch specialises those), so a branch on it
        (`if x.shape[0] == 1`) is captured with the axis static at its extent here; so is
        a branch that does not capture with its axes dynamic."""
        spec = self._spec(args)
        tensors = dict(zip(self._params(len(args)), args))
        dynamic = {name: {a: sym for a, sym in axes.items() if tensors[name].shape[a] >= 2}
                   for name, axes in spec.items()}
        try:
            _one_size_per_symbol(dynamic, tensors)
        except ValueError:  # the spec's one symbol is two sizes here: no capture binds this call
            runner = _NOT_CAPTURED
        else:
            runner = self._build(args, dynamic if dynamic != spec else None, again=True)
            if runner is _NOT_CAPTURED and any(dynamic.values()):
                # dynamic, the branch holds an op cleave cannot take over a dynamic extent
                # (x.split(2), which export pins at odd extents and keeps at even ones: every
                # even extent ran eagerly, said as "inputs do not fit the compiled graph")
                runner = self._build(args, {}, again=True)
        if runner is None:
            return _Ran(self._call_dynamo(args, {}))
        if runner is _NOT_CAPTURED or not _launcher(runner).fits(args):
            captures.append(None)  # the first capture runs such calls eagerly, saying why; no more captures
            return captures[0]
        captures.append(runner)
        return runner

    def _call_keywords(self, args, kwargs):
        """Keywords left after binding (keyword-only parameters, **kwargs): said once, as a
        positional argument that is not a tensor is."""
        self.capture_error = (f"keyword argument(s) {', '.join(map(repr, kwargs))}: whole-function capture takes "
                              f"positional arguments")
        warnings.warn(f"cleave.compile: {self.name}'s {self.capture_error}; {self.name} runs through "
                      f"torch.compile's graphs (cleave compiles them) from now on", stacklevel=_user_level())
        return self._call_dynamo(args, kwargs)

    def _call_non_tensors(self, args, name: str, value):
        self.capture_error = (f"argument {name!r} is a {type(value).__name__}: whole-function capture takes "
                              f"tensors")
        warnings.warn(f"cleave.compile: {self.name}'s {self.capture_error}; {self.name} runs through "
                      f"torch.compile's graphs (cleave compiles them) from now on", stacklevel=_user_level())
        return self._call_dynamo(args, {})

    def _forget_captures(self):
        """A value the captures baked in (Guards) changed: capture again."""
        self._runners.clear()
        self._seen.clear()
        self._guards = None
        self.recaptures += 1

    def _params(self, count: int) -> list[str]:
        from ..frontends.capture import param_names

        return param_names(self.fn, count)

    def _spec(self, args) -> dict[str, dict[int, str]]:
        """The axes this call makes dynamic, per tensor argument. `dynamic` is checked
        against the first call: an axis out of range, one axis named twice, or a symbol
        naming axes of different sizes raises. Once it has fit a call, an argument of a
        rank it does not fit is static at that rank (said once): eager takes any rank."""
        if self.dynamic is None:
            return {}
        tensors = {n: a for n, a in zip(self._params(len(args)), args) if isinstance(a, torch.Tensor)}
        if self.dynamic == "all":
            from ..frontends.capture import axis_symbol

            params = self._params(len(args))
            return {n: {i: axis_symbol(n, i, params) for i in range(a.dim())} for n, a in tensors.items()}
        spec = {}
        for name, a in tensors.items():
            try:
                spec[name] = _axes_in_range(name, self.dynamic.get(name, {}), a.dim())
            except ValueError as err:
                if not self._spec_fitted:
                    raise
                self._say_once(f"{err}: {self.name} is compiled for each shape of {name!r} at that rank")
        if not self._spec_fitted:
            _one_size_per_symbol(spec, tensors)
            self._spec_fitted = True
        return spec

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            warnings.warn(message, stacklevel=_user_level())

    def _signature(self, args) -> tuple:
        spec = self._spec(args)
        sig = [_torch_state()]
        for name, a in zip(self._params(len(args)), args):
            if isinstance(a, torch.Tensor):
                dyn = spec.get(name, {})
                shape = tuple(-1 if k in dyn else s for k, s in enumerate(a.shape))
                sig.append((a.dtype, a.device.type, shape, _layout(a, dyn), a.requires_grad))
            else:
                sig.append(a)
        if torch._C._is_any_autocast_enabled():
            sig.append((_AUTOCAST, _autocast_state()))
        return tuple(sig)

    def _build(self, args, dynamic=None, again: bool = False):
        """A runner for args' signature, captured with `dynamic` (default: the call's spec).
        Where torch.export cannot take a capture made `again` (another branch), or cleave
        cannot express it, the signature's first capture stands: _NOT_CAPTURED."""
        from ..frontends.errors import CaptureError, UnsupportedOpError
        from ..scheduler.api import rounding_refusal

        guards = Guards.read_by(self.fn)  # before the capture: the values it bakes in
        modules = guards.modules if guards is not None else None
        if guards is not None and guards.needs_dynamo:
            self._through_dynamo(guards.needs_dynamo)
            return None
        watch = StateWatch(modules.modules if modules is not None else [])
        contents = TensorContents(guards)
        if dynamic is None:
            dynamic = self.dynamic if self.dynamic == "all" else self._spec(args) or None
        try:
            with passes.recording(self.ctx.pass_seconds), passes.timed("capture"), _marks_kept(args):
                captured, structure = _capture(self.fn, args, dynamic, self.name, watch,
                                               guards.outside_pointers() if guards is not None else frozenset(),
                                               auto=self.dynamic == "all")
        except UnsupportedOpError as err:  # dynamo cuts the function around that op (its warning names it)
            if again:  # in another branch only: the signature's first capture stands
                return _NOT_CAPTURED
            self._through_dynamo(str(err))  # where the decompositions lower the op, no warning: say why here
            return None
        except CaptureError as err:
            captured = None
            self.capture_error = str(err)
            if "Constraints violated" in self.capture_error and not again:  # a declared dynamic axis the code pins
                warnings.warn(f"cleave.compile: {self.name}: an axis declared dynamic ({dynamic}) is one the code "
                              f"fixes to its size (torch.export: {self.capture_error.split('!')[0].split(': ')[-1]}); "
                              f"{self.name} runs through torch.compile's graphs (cleave compiles them), which "
                              f"specialise it", stacklevel=_user_level())
        finally:
            watch.restore()  # the trace's assignments undone: eager and dynamo make them, once a call
            contents.restore()  # and its in-place changes of constant tensors
            changed = guards is not None and guards.put_back()  # a global list the trace appended to
            rebound = guards is not None and guards.bindings is not None and guards.bindings.put_back()
        if watch.changed:
            self._through_dynamo("its forward changes its modules' state (assigns an attribute or a buffer, or "
                                 "changes a list or dict attribute), which a capture would drop")
            return None
        if changed:
            self._through_dynamo(f"it changes {changed!r}, a global or closure container or object, which a "
                                 f"capture would drop")
            return None
        if rebound:  # what the trace assigned held a fake tensor: dynamo makes it at each call
            self._through_dynamo(f"{rebound}, which a capture would drop")
            return None
        refusal = captured is not None and rounding_refusal(captured.graph)
        if refusal:  # a float64 computation: dynamo's graphs leave those ops eager, each named
            if again:
                return _NOT_CAPTURED
            self._through_dynamo(refusal)
            return None
        if captured is not None and not captured.graph.output_names:  # fn returns no tensor: nothing to fuse
            self._dynamo = _dynamo_compile(self.fn, self.ctx, self.name)
            return None
        if captured is not None and captured.views:
            # eager returns these outputs as views of an input (writing to one writes the
            # input); dynamo's graphs, through AOTAutograd, regenerate them as views
            self.capture_error = (f"output(s) {', '.join(captured.views)} are views of an input or of one another, "
                                  f"or views no kernel writes as eager lays them out")
            self._dynamo = _dynamo_compile(self.fn, self.ctx, self.name)
            return None
        if captured is None and again:
            return _NOT_CAPTURED
        if captured is None:
            # Either fn is wrong for these inputs (a shape error), and eager raises its own
            # error here, or torch.export cannot take it whole: dynamo splits it into graphs
            # it can. This call's eager result is kept (running fn twice would repeat its
            # in-place ops); no runner is kept until it has run.
            result = self.fn(*args)
            self._dynamo = _dynamo_compile(self.fn, self.ctx, self.name)
            return _Ran(result)
        self._guards = guards
        self.capture_error = None  # an earlier call's (a wrong shape, eager's error) no longer holds
        params = self._params(len(args))
        graph = captured.graph
        symbols = _dynamic_symbols(graph, dynamic, params)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        unpermute = permute_outputs(graph, captured.output_orders)
        op = self.ctx.operator(graph, symbols, device)
        module = self.fn if isinstance(self.fn, torch.nn.Module) else None
        flat = not _is_plain(structure)
        launcher = Launcher(op, self.ctx, params, not structure.is_leaf(), _flat_outputs(self.fn) if flat else self.fn,
                            self.name,
                            state=_state_getters(module, captured.state) | constant_getters(captured.constants, device),
                            writes=captured.writes, reads_storage=captured.reads_storage, unpermute=unpermute)
        return _Restructured(launcher, structure) if flat else launcher

    def _through_dynamo(self, reason: str) -> None:
        """fn runs through dynamo's graphs from now on: they compute what eager computes
        where a capture would not (reason), so this is no warning."""
        self.capture_error = reason
        _log.debug("cleave.compile: %s runs through torch.compile's graphs: %s", self.name, reason)
        self._dynamo = _dynamo_compile(self.fn, self.ctx, self.name)

    # -- graph breaks through dynamo --------------------------------------
    def _call_dynamo(self, args, kwargs):
        hooks = (_global_module_hooks(), _forward_of(self.fn))
        if self._dynamo is None or hooks != self._dynamo_hooks:
            # torch.compile guards no global module hook, nor the forward of a module a
            # closure calls (a class's forward replaced): a frame compiled before would run
            # on without it. A new backend object compiles the frames again.
            self._dynamo = _dynamo_compile(self.fn, self.ctx, self.name)
        self._dynamo_hooks = hooks
        spec = self._spec(args)
        for name, a in zip(self._params(len(args)), args):
            for axis in spec.get(name, ()):
                torch._dynamo.maybe_mark_dynamic(a, axis)
        self._note_recurrent_modules()
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if self._writes_arguments and overlapping(tensors):
            # dynamo's graphs were traced with arguments apart, and it guards no overlap
            # between views: x.zero_() then read through y = x's storage one row on gave
            # y's old values (aot_eager does the same)
            self.ctx.warn_eager(self.name, "it changes an argument in place and its arguments share memory")
            return self.fn(*args, **kwargs)
        if torch.is_grad_enabled() and _needs_grad(self.fn, tensors):
            # As a capture's call does (graph_breaks.py): AOTAutograd's backward refuses a
            # second backward over one forward (retain_graph=True) and double backward
            # (a gradient penalty), both of which eager's graph takes
            self.ctx.warn_eager(self.name, GRAD_FALLBACK)
            return self.fn(*args, **kwargs)
        versions = [_version(t) for t in tensors]  # None for an inference tensor: it counts no writes
        breaks = _graph_breaks()
        failure = None
        try:
            with _fake_tensor_logs_held():
                result = self._dynamo(*args, **kwargs)
            self._writes_arguments |= any(_version(t) != v for t, v in zip(tensors, versions))
            return result
        except torch._dynamo.exc.TorchRuntimeError as err:  # tracing with fake tensors failed
            failure = err
        except Exception as err:
            # eager's own error (an index out of range), met while dynamo traced: said as
            # eager says it, without the user code and the logging advice dynamo appends
            message = err.args[0] if err.args and isinstance(err.args[0], str) else ""
            if _DYNAMO_SUFFIX not in message:
                raise
            err.args = (message.split(_DYNAMO_SUFFIX)[0],) + err.args[1:]
            raise err.with_traceback(None) from None
        finally:
            DYNAMO_HOOK_GUARDS.call_done()
            if failure is None:  # a failed trace is no graph break: eager runs the call, or raises
                self._note_graph_breaks(breaks)
        return self._eager_instead(args, kwargs, failure)  # outside the except: eager's error unchained

    def _note_graph_breaks(self, before: dict) -> None:
        """What dynamo left between its graphs (an op whose output shape depends on the
        data, `print`, a branch on a tensor's value) runs eagerly, and dynamo says nothing:
        name each break this call's tracing met (dynamo counts them by reason)."""
        for reason, count in _graph_breaks().items():
            # a cleave.compile'd callee is a break of dynamo's (it does not trace into
            # compiled code), not eager code: it runs as its own compiled call
            if count > before.get(reason, 0) and CompiledFunction.__call__.__qualname__ not in str(reason):
                lines = [ln.strip() for ln in str(reason).splitlines() if ln.strip()]
                said = lines[:1] + [ln.removeprefix("Explanation:").strip() for ln in lines[1:]
                                    if ln.startswith("Explanation:")]
                self.ctx.warn_eager(f"part of {self.name}", f"torch.compile breaks its graph there "
                                                            f"({': '.join(said)})")

    def _note_recurrent_modules(self) -> None:
        """dynamo does not trace nn.RNN, GRU or LSTM (torch._dynamo.config.allow_rnn): the
        frame that calls one runs eagerly, with no graph for cleave and nothing said."""
        if self._rnn_noted:
            return
        self._rnn_noted = True
        if isinstance(self.fn, torch.nn.Module):
            modules = self.fn.named_modules()
        else:
            guards = Guards.read_by(self.fn)
            reached = guards.modules.modules if guards is not None and guards.modules is not None else []
            modules = ((type(m).__name__, m) for m in reached)
        for path, m in modules:
            if isinstance(m, torch.nn.RNNBase):
                self.ctx.warn_eager(self.name, f"it calls {path or 'itself'} (a {type(m).__name__}), a recurrent "
                                               f"module, which torch.compile does not trace: the function calling "
                                               f"it runs eagerly")
                return

    def _eager_instead(self, args, kwargs, failure):
        """Dynamo could not trace this call (nothing of it ran): eager raises its own error
        for wrong arguments; where eager succeeds, its result is the call's."""
        result = self.fn(*args, **kwargs)
        first = (str(failure).strip().splitlines() or [""])[0][:200]
        self.ctx.warn_eager(self.name, f"torch.compile could not trace this call ({first})")
        return result


class _HeldInCalls(logging.Filter):
    """Drops torch's fake-tensor log records while a call through dynamo runs in this
    thread: a call eager rejects (a wrong width) failed there first, and torch logged the
    meta kernel's failure with its traceback (19 lines) before eager's one-line error.
    A filter, installed once: setting the logger's level per call clears every logger's
    cache."""
    held = threading.local()

    def filter(self, record) -> bool:
        return not getattr(self.held, "depth", 0)


_FAKE_TENSOR_FILTER = _HeldInCalls()
logging.getLogger("torch._subclasses.fake_tensor").addFilter(_FAKE_TENSOR_FILTER)


@contextlib.contextmanager
def _fake_tensor_logs_held():
    held = _HeldInCalls.held
    held.depth = getattr(held, "depth", 0) + 1
    try:
        yield
    finally:
        held.depth -= 1


# Dynamo inlines calls it traces, and compiles the frames run while its hook is set:
# __call__ is neither inlined (skip marks it) nor compiled, and runs with the hook off
# (checked per call: one C call; torch.compiler.disable's wrapper costs ~0.4 us a call).
_dynamo_skip(CompiledFunction.__call__)
_dynamo_frame_hook = torch._C._dynamo.eval_frame.get_eval_frame_callback


@torch.compiler.disable
def _with_dynamo_off(compiled, args, kwargs):
    return compiled(*args, **kwargs)


# Argument types no capture changes: plain tensors, and the Python scalars checked
# here only to skip an isinstance per call
_PLAIN_TYPES = frozenset({torch.Tensor, torch.nn.Parameter, int, float, bool, type(None)})


def _tensor_subclass(values):
    """The first of values that is a tensor of a subclass of torch.Tensor (other than
    nn.Parameter), or None."""
    for a in values:
        if type(a) not in _PLAIN_TYPES and isinstance(a, torch.Tensor):
            return a
    return None


# Captures of one signature at most, each for a branch the code takes on a dynamic size.
MAX_CAPTURES = 8
_NOT_CAPTURED = object()  # _build: torch.export did not take another branch's capture


def _launcher(runner) -> Launcher:
    return runner.launcher if isinstance(runner, _Restructured) else runner


class _Ran:
    """What a call that no runner served returned (it ran eagerly, or through dynamo)."""

    def __init__(self, result):
        self.result = result


class _Restructured:
    """A launcher of a function whose outputs are not one tensor or a flat tuple of them
    (a dict, a list, a namedtuple, nested, a 1-tuple): the operator's outputs are fn's
    tensors in pytree order, put back into fn's structure."""

    def __init__(self, launcher: Launcher, structure):
        self.launcher, self.structure = launcher, structure

    def __call__(self, *args):
        out = self.launcher(*args)
        # run eagerly, fn's own result (its structure may differ here: x.split(2) of a wider x)
        return out.result if isinstance(out, _EagerLeaves) else pytree.tree_unflatten(out, self.structure)

    def hot(self, args):
        fast = self.launcher.hot(args)
        if fast is None or fast is self.launcher:
            return None if fast is None else self
        structure = self.structure
        return lambda *args: pytree.tree_unflatten(fast(*args), structure)


class _EagerLeaves(tuple):
    """The output tensors of fn's eager result, flat as a launcher returns them, and the
    result itself."""
    result: object


# What torch.export leaves on the tensors it traced with dynamic axes: a later
# torch.compile of the caller's own code would find those axes marked dynamic, and raise
# where its code specialises one.
_DYNAMO_MARKS = ("_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices", "_has_dynamo_dim_marking")


@contextlib.contextmanager
def _marks_kept(args):
    """The dynamo marks of the argument tensors, as they were before the block."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    before = [{k: copy.copy(getattr(t, k)) for k in _DYNAMO_MARKS if hasattr(t, k)} for t in tensors]
    try:
        yield
    finally:
        for t, marks in zip(tensors, before):
            for k in _DYNAMO_MARKS:
                if k in marks:
                    setattr(t, k, marks[k])
                elif hasattr(t, k):
                    delattr(t, k)


def _capture(fn, args, dynamic, name, watch: StateWatch, outside: frozenset, auto: bool):
    """capture_program of fn, and the pytree structure of fn's output (torch.export
    returns the output's tensors flat, in pytree order), recorded as export traces it;
    `watch` sees the trace's start and end; `outside` and `auto` as capture_program's."""
    from ..frontends.capture import _as_forward, capture_program

    structures = []

    def record(out):
        structures.append(pytree.tree_structure(out))
        watch.end()

    if isinstance(fn, torch.nn.Module):
        start = fn.register_forward_pre_hook(lambda module, inputs: watch.start(), prepend=True)
        hook = fn.register_forward_hook(lambda module, inputs, out: record(out))
        try:
            with _assignments_unwarned():
                return capture_program(fn, *args, dynamic=dynamic, name=name, outside=outside,
                                       auto=auto, traced_sizes=True), structures[-1]
        finally:
            start.remove()
            hook.remove()
    traced = _as_forward(fn)  # torch.export records the stack frames of functions named forward

    @functools.wraps(fn)
    def recording(*args):
        watch.start()
        out = traced(*args)
        record(out)
        return out

    return capture_program(recording, *args, dynamic=dynamic, name=name, outside=outside,
                           auto=auto, traced_sizes=True), structures[-1]


@contextlib.contextmanager
def _assignments_unwarned():
    """export warns when forward assigns a tensor attribute: the StateWatch sees every
    assignment, and the function then runs through dynamo, which keeps it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"The tensor attributes? .* assigned during export", UserWarning)
        yield


def _is_plain(structure) -> bool:
    """Whether a launcher returns this structure itself: one tensor, or a plain tuple of
    two or more (a launcher returns one output bare)."""
    if structure.is_leaf():
        return True
    children = structure.children()
    return structure.type is tuple and len(children) > 1 and all(c.is_leaf() for c in children)


def _flat_outputs(fn):
    """fn returning its output tensors as a flat tuple, as the launcher of its capture
    does (the launcher runs it when it runs eagerly)."""
    def flat(*args):
        result = fn(*args)
        leaves = _EagerLeaves(pytree.tree_leaves(result))
        leaves.result = result
        return leaves
    return flat


def _non_tensor_argument(params, args):
    """(name, value) of the first argument that is not a tensor (a number, a flag, a
    container, a dataclass), which whole-function capture cannot take; None if there is
    none. Such a function runs through dynamo from its first call (it ran that call
    eagerly, without a word), which makes a changing int a symbol."""
    for name, a in zip(params, args):
        if not isinstance(a, torch.Tensor):
            return name, a
    return None


# -- the key of a call ----------------------------------------------------------
_grad_enabled, _inference_mode = torch.is_grad_enabled, torch.is_inference_mode_enabled
_default_dtype, _deterministic = torch.get_default_dtype, torch._C._get_deterministic_algorithms


def _torch_state() -> tuple:
    """torch's global state that traced code may branch on or read (`torch.ones(n)` takes
    the default dtype): a capture serves the state it was made in, as dynamo guards it."""
    return _grad_enabled(), _inference_mode(), _default_dtype(), _deterministic()


def _call_key(args) -> tuple:
    """What a runner in `_seen` was made for, exactly: torch's global state, and per
    argument a tensor's shape, dtype, device, strides, whether it starts its storage and
    requires_grad, or any other argument's value. Made at every call: kept cheap."""
    return (_torch_state(), *[(a.shape, a.dtype, a.device, a.stride(), not a.storage_offset(), a.requires_grad)
                              if isinstance(a, torch.Tensor) else a for a in args])


def _layout(t: torch.Tensor, dynamic: dict) -> tuple:
    """What traced code may read of a tensor's layout (`is_contiguous()`, `stride()`,
    `storage_offset()`), as dynamo guards it, in a key one capture serves for every size
    of the dynamic axes: with none, the strides; with one, whether it is contiguous (also
    channels-last) and its axes in stride order, each with its stride unless that is the
    extent of the axes inside it (which changes with their sizes, in a contiguous or a
    transposed tensor). And whether it starts its storage: an offset's value is not kept
    (a slice per step of a loop would capture at every step). Axes that share a non-zero
    stride key by which is longer, as eager lays out its results by that."""
    strides, start = t.stride(), t.storage_offset() == 0
    if not dynamic:
        return strides, start
    order = sorted(range(t.dim()), key=lambda i: (strides[i], -i))
    own, inner = [], 1
    for i in order:
        own.append(None if strides[i] == inner else strides[i])
        if strides[i]:  # an expanded axis (stride 0) takes no room
            inner = strides[i] * max(t.shape[i], 1)
    channels_last = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
    # axes of one non-zero stride (an overlapping view): eager orders its result's by their sizes
    # (an axis of extent 1, whose stride means nothing, is no tie)
    ties = tuple(t.shape[i] < t.shape[j] for i, j in zip(order, order[1:])
                 if strides[i] == strides[j] != 0 and min(t.shape[i], t.shape[j]) > 1)
    return t.is_contiguous(), channels_last, tuple(order), tuple(own), start, ties


# -- autocast ----------------------------------------------------------------
_AUTOCAST = object()  # marks a key made under autocast: no argument can equal it


def _autocast_state() -> tuple:
    """Per device type, whether autocast is on and to which dtype."""
    return tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in AUTOCAST_DEVICES)


_DYNAMO_SUFFIX = "\n\nfrom user code:"  # where dynamo's text starts in an error it passes on


def _global_module_hooks() -> tuple:
    """Which global module hooks are registered (`register_module_forward_hook` and the
    like), by their handles' ids."""
    module = torch.nn.modules.module
    return tuple(tuple(getattr(module, name, {})) for name in (
        "_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
        "_global_backward_hooks"))


def _forward_of(fn):
    """A module's forward as a call finds it (on the instance, else its class); None for
    a function."""
    if not isinstance(fn, torch.nn.Module):
        return None
    return fn.__dict__.get("forward", type(fn).forward)


def _uninitialized(module: torch.nn.Module) -> bool:
    """Whether a lazy module in module's tree has not made its parameters yet."""
    from torch.nn.modules.lazy import LazyModuleMixin

    return any(isinstance(m, LazyModuleMixin) and m.has_uninitialized_params() for m in module.modules())


def _deferred_body(fn) -> str | None:
    """What kind of function fn is, where its body does not run at the call."""
    for test, kind in ((inspect.iscoroutinefunction, "a coroutine function"),
                       (inspect.isasyncgenfunction, "an async generator function"),
                       (inspect.isgeneratorfunction, "a generator function")):
        if test(fn):
            return kind
    return None


def _needs_grad(fn, tensors) -> bool:
    """Whether a call's tensor arguments, or the parameters of the module compiled, require grad."""
    if any(t.requires_grad for t in tensors):
        return True
    return isinstance(fn, torch.nn.Module) and any(p.requires_grad for p in fn.parameters())


def _dynamo_compile(fn, ctx: Context, name: str):
    """fn through torch.compile's graphs, compiled by cleave. A module is called from a
    function: torch.compile of the module itself wraps it in an OptimizedModule, a
    module whose own call fires the global forward hooks a second time."""
    from .backend import partitioning_backend

    if isinstance(fn, torch.nn.Module):
        module = fn

        def fn(*args, **kwargs):
            return module(*args, **kwargs)
        # A code object of its own: dynamo keeps its compiled frames per code object, and
        # every module's wrapper shared one, so each compiled module counted as a
        # recompile of the others' and from the ninth on (recompile_limit) ran eagerly.
        fn.__code__ = fn.__code__.replace()
    return torch.compile(fn, backend=DYNAMO_HOOK_GUARDS.backend(partitioning_backend(ctx, name)), dynamic=None)


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


class StateChanged(Exception):
    """A parameter or buffer a capture reads is now None, of another shape, dtype or
    device (a swapped submodule, `m.double()`, `m.cuda()`), or no longer the tensor a
    path tied to it holds (weights untied): the function is captured again."""


def _state_getters(module, state: dict[str, str]) -> dict:
    """graph input -> a function reading that parameter or buffer off the module at
    call time (an optimizer step or load_state_dict between calls is seen), checking it
    against what the capture read (StateChanged)."""
    named = {**dict(module.named_parameters(remove_duplicate=False)),
             **dict(module.named_buffers(remove_duplicate=False))} if module is not None else {}

    def getter(path):
        *owners, attr = path.split(".")
        first = _read(module, path)
        shape, dtype, device = first.shape, first.dtype, first.device
        # a forward may branch on these (`if w.requires_grad`, `w.is_contiguous()`), and
        # the capture evaluated that branch once
        requires_grad, strides = first.requires_grad, _strides(first)
        tied = [p for p, v in named.items() if v is first and p != path]  # export lists a tied weight once

        def get():
            owner = module
            for name in owners:
                owner = getattr(owner, name)
            t = getattr(owner, attr)
            if t is None or t.dtype is not dtype or t.shape != shape or t.device != device:
                raise StateChanged(f"{path} is now {None if t is None else (tuple(t.shape), t.dtype, t.device)}")
            if t.requires_grad != requires_grad or _strides(t) != strides:
                raise StateChanged(f"{path} now has requires_grad={t.requires_grad}, strides {_strides(t)}")
            for p in tied:
                if _read(module, p) is not t:
                    raise StateChanged(f"{p} is no longer {path}")
            return t
        return get

    return {name: getter(key) for name, key in state.items()}


def _strides(t: torch.Tensor):
    """A dense tensor's strides; None for a layout that has none (a sparse buffer)."""
    return t.stride() if t.layout == torch.strided else None


def _read(module, path: str):
    for name in path.split("."):
        module = getattr(module, name)
    return module


def _call_signature(fn):
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def _code_of(fn):
    return getattr(_python_function(fn), "__code__", None)


def _function_name(fn) -> str:
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return getattr(fn, "__name__", None) or type(fn).__name__


# -- the dynamic spec ----------------------------------------------------------
def _checked_dynamic(fn, dynamic):
    """`dynamic` as compile() takes it, or a TypeError / ValueError saying what is wrong.
    True and False read as torch.compile's: every axis dynamic ("all"), or none (None)."""
    if isinstance(dynamic, bool):
        return "all" if dynamic else None
    if dynamic is None or dynamic == "all":
        return dynamic
    if not isinstance(dynamic, dict):
        raise TypeError(f"dynamic must be None, 'all' (or True), False or a dict of axes per argument, not {dynamic!r}")
    params = _positional_names(fn)
    for pname, axes in dynamic.items():
        if params is not None and not _names_argument(pname, params):
            raise ValueError(f"cleave.compile: dynamic names argument {pname!r}, but {_function_name(fn)} takes "
                             f"{', '.join(params[0]) or 'no positional arguments'}"
                             + (f" (and *{params[1]}: {params[1]}_0, {params[1]}_1, ...)" if params[1] else ""))
        if params is None and not (isinstance(pname, str) and re.fullmatch(r"x\d+", pname)):
            # a builtin (torch.bmm): the capture names its arguments by position, and any
            # other name would match nothing, the spec ignored
            raise ValueError(f"cleave.compile: dynamic names argument {pname!r}, but {_function_name(fn)}'s "
                             f"parameters cannot be read: name its arguments by position, x0, x1, ...")
        if not isinstance(axes, dict):
            raise TypeError(f"cleave.compile: dynamic[{pname!r}] must be a dict {{axis: symbol}}, not {axes!r}")
        for axis, symbol in axes.items():
            if not isinstance(axis, int) or isinstance(axis, bool):
                raise TypeError(f"cleave.compile: dynamic[{pname!r}]: axis {axis!r} is not an int")
            _check_symbol(symbol, f"argument {pname!r} axis {axis}", set(params[0]) if params else set())
    return dynamic


def _check_symbol(symbol, where: str, arguments: set[str]) -> None:
    from ..frontends.capture import symbol_clash

    if not (isinstance(symbol, str) and symbol.isidentifier()):
        raise TypeError(f"cleave.compile: {where}: symbol {symbol!r} is not an identifier")
    why = symbol_clash(symbol, arguments)
    if why:
        raise ValueError(f"cleave.compile: {where}: symbol {symbol!r} is {why}; choose another name")


def _positional_names(fn):
    """(fn's positional parameter names, its *args name or None); None if fn has no
    readable signature."""
    sig = _call_signature(fn)
    if sig is None:
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    rest = next((p.name for p in sig.parameters.values() if p.kind == p.VAR_POSITIONAL), None)
    return [p.name for p in sig.parameters.values() if p.kind in kinds], rest


def _names_argument(pname, params) -> bool:
    names, rest = params
    return pname in names or (rest is not None and isinstance(pname, str)
                              and re.fullmatch(rf"{re.escape(rest)}_\d+", pname) is not None)


def _axes_in_range(name: str, axes: dict, rank: int) -> dict[int, str]:
    """A spec's axes of one argument, counted from 0, for an argument of this rank."""
    out = {}
    for axis, symbol in axes.items():
        if not -rank <= axis < rank:
            raise ValueError(f"cleave.compile: argument {name!r} has rank {rank}; dynamic axis {axis} is out of range")
        if axis % rank in out:
            raise ValueError(f"cleave.compile: argument {name!r}: dynamic axes name axis {axis % rank} twice "
                             f"({out[axis % rank]!r} and {symbol!r})")
        out[axis % rank] = symbol
    return out


def _one_size_per_symbol(spec: dict[str, dict[int, str]], tensors: dict) -> None:
    """Raise where one symbol names axes of different sizes: the graph would not bind its
    own example."""
    first = {}
    for name, axes in spec.items():
        for axis, symbol in axes.items():
            size = tensors[name].shape[axis]
            other, other_axis, other_size = first.setdefault(symbol, (name, axis, size))
            if other_size != size:
                raise ValueError(f"cleave.compile: dynamic symbol {symbol!r} names argument {other!r} axis "
                                 f"{other_axis} (size {other_size}) and argument {name!r} axis {axis} (size {size}); "
                                 f"one symbol is one size, so give these axes different symbols")


def compile(fn, dynamic=None, device=None, top_k: int = 4, artifact=None, verbose=None,
            rules=None, candidates: int = 1):
    """Wrap `fn` so that its first call compiles it with cleave and later calls reuse the result:
    a CompiledFunction, or for an nn.Module a CompiledModule (compiled_module.py), a module
    with the original's parameters, state_dict keys and train()/eval().

    `dynamic` names the axes that vary between calls, per argument name:
    `{"q": {0: "b"}, "k": {2: "L"}}`, or "all" (True, as torch.compile spells it; False is
    None: static). A symbol is an identifier that is not a
    keyword, a builtin, an argument's name or a name the kernels use (`pid`, `tl`,
    `v0`, `x_ptr`, `s_...`); a spec naming no argument of fn is refused here, an axis
    out of range or a symbol naming axes of different sizes at the first call (a later
    call of a rank the spec does not fit is static in that argument). `compiled.stats`
    counts calls, searches, compiles, cache hits and graph breaks. `artifact` is a directory built
    elsewhere (`cleave trace build`) to load operators from, whatever machine built it.
    `verbose`: True shows this function's progress lines (search, compile, tuning),
    False hides them; None leaves it to the "cleave" logger's level (INFO shows them).
    `rules`: rule files (paths) to search with beside the library, as `cleave optimize
    --rules`: their rules are proven here, before anything runs (UnsoundRule names an
    unsound one with its counterexample), and they are part of the operators' cache key.
    `candidates`: how many of the search's first candidates each operator schedules and
    ranks by the cost model (`cleave trace build` ranks 3; each costs a schedule)."""
    if not callable(fn):  # else the first call fails inside torch.compile
        raise TypeError(f"cleave.compile takes a function or an nn.Module, not {type(fn).__name__} {fn!r:.60}")
    dynamic = _checked_dynamic(fn, dynamic)
    if not (isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 1):
        raise ValueError(f"top_k must be an int >= 1, not {top_k!r}")
    if not (isinstance(candidates, int) and not isinstance(candidates, bool) and candidates >= 1):
        raise ValueError(f"candidates must be an int >= 1, not {candidates!r}")
    if not (verbose is None or isinstance(verbose, bool)):
        raise TypeError(f"verbose must be None, True or False, not {verbose!r}")
    if artifact is not None and Path(artifact).exists() and not Path(artifact).is_dir():
        raise NotADirectoryError(f"artifact must be a directory (`cleave trace build --out DIR`, or a new one that "
                                 f"compiled.prepare fills), and {str(artifact)!r} is a file")
    options = dict(dynamic=dynamic, device=_checked_device(device), top_k=top_k, artifact=artifact, verbose=verbose,
                   rules=_proven_rules(rules), candidates=candidates)
    if isinstance(fn, torch.nn.Module):  # an nn.Module again, as torch.compile's OptimizedModule is
        from .compiled_module import CompiledModule

        return CompiledModule(fn, CompiledFunction(fn, **options), options)
    return CompiledFunction(fn, **options)


def _checked_device(device):
    """The device the operators run on, refused here where it is none this machine has
    (the first call failed inside torch: "Torch not compiled with CUDA enabled")."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a torch.device or a string such as 'cuda', not {device!r}")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device {device!r} is not a device torch knows (cpu, cuda, cuda:1, ...)") from None
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: cleave's kernels run on cpu (Triton's interpreter) or cuda")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def _proven_rules(files) -> list | None:
    """The library plus the rules of `files` (a path or a list of paths), those proven;
    None without files (the search's default, the library)."""
    if files is None:
        return None
    files = [files] if isinstance(files, (str, os.PathLike)) or not isinstance(files, (list, tuple)) else files
    bad = [f for f in files if not isinstance(f, (str, os.PathLike))]
    if bad:
        raise TypeError(f"rules: a rule file's path (str or os.PathLike), or a list of them, got {bad[0]!r}")
    from ..verify import with_proven_files

    return with_proven_files(list(files))[0]


def _graph_breaks() -> dict:
    """dynamo's graph breaks so far, by reason: torch 2.13 counts a branch on a tensor's
    value under "unimplemented" only, other breaks under "graph_break"."""
    return {**_dynamo_counters["unimplemented"], **_dynamo_counters["graph_break"]}
