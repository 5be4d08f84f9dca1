"""Graph breaks at the torch.fx level: split an FX graph into maximal runs of
supported nodes (in topological order) and unsupported ones; each supported run is
captured and compiled as one operator, each unsupported run executes eagerly.

Which nodes are unsupported is learnt from the frontend: capture raises
UnsupportedOpError naming the op, the nodes of that op are cut out, and the
remaining runs are captured again, recursively. A run whose failing op cannot be
located among its nodes (a torch-level node that lowers to the failing aten op
under another name) runs eagerly as a whole, so results stay correct.
"""
from __future__ import annotations

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from ..scheduler.launch import remember
from .context import Context
from .operator import CompileFailure, NotReadyDuringCapture


def op_name(target) -> str:
    """The base name of an op, comparable across levels: torch.sort, 'sort' (a method),
    aten.sort.stable and 'aten::sort' all give 'sort'."""
    if isinstance(target, str):
        text = target
    elif hasattr(target, "_schema"):
        text = target._schema.name
    else:
        text = getattr(target, "__name__", str(target))
    text = text.replace("::", ".")
    parts = [p for p in text.split(".") if p]
    if parts and parts[0] in ("aten", "torch", "prims", "Tensor", "F", "functional", "nn"):
        parts = parts[1:]
    return (parts[0] if parts else text).rstrip("_") or text


def _compute_nodes(gm: torch.fx.GraphModule):
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def _unsupported_nodes(gm, names: set[str]) -> set[torch.fx.Node]:
    """Nodes of an unsupported op, plus the tuple projections (getitem) of them."""
    bad: set[torch.fx.Node] = set()
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method") and op_name(n.target) in names:
            bad.add(n)
        elif n.op == "call_function" and n.args and isinstance(n.args[0], torch.fx.Node) and n.args[0] in bad \
                and op_name(n.target) == "getitem":
            bad.add(n)
    return bad


def build(gm: torch.fx.GraphModule, ctx: Context, unsupported: set[str] = frozenset()):
    """A callable running gm: one compiled region, or a split module of regions."""
    bad = _unsupported_nodes(gm, set(unsupported))
    if not bad:
        return Region(gm, ctx, unsupported)
    ids, current, previous = {}, 0, None
    for n in _compute_nodes(gm):
        ok = n not in bad
        if previous is not None and ok != previous:
            current += 1
        previous, ids[n] = ok, (current, ok)
    if not ids:
        return gm
    kinds = {f"submod_{i}": ok for i, ok in ids.values()}
    split = split_module(gm, None, lambda n: ids[n][0] if n in ids else 0)
    for name, ok in kinds.items():
        sub = getattr(split, name, None)
        if sub is None:
            continue
        if ok:
            setattr(split, name, _Callable(Region(sub, ctx, unsupported)))
        else:
            ctx.eager_regions += 1
    return split


class _Callable(torch.nn.Module):
    """Lets a plain callable sit where split_module expects a submodule."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


class Region:
    """A supported run of FX nodes, captured and compiled on its first call per
    static signature (the non-dynamic dims, dtypes, and the int inputs it reads)."""

    def __init__(self, gm: torch.fx.GraphModule, ctx: Context, unsupported=frozenset()):
        self.gm, self.ctx, self.unsupported = gm, ctx, set(unsupported)
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.tuple_output = isinstance(out, (tuple, list))
        self.dynamic = {p.name: _dynamic_axes(p) for p in self.placeholders}
        self.sizes = _size_inputs(self.placeholders, self.dynamic)
        self.runners: dict[tuple, object] = {}
        self.seen: dict[tuple, object] = {}  # exact arguments -> runner: skips the signature

    def signature(self, args) -> tuple:
        sig = []
        for p, a in zip(self.placeholders, args):
            if isinstance(a, torch.Tensor):
                dyn = self.dynamic.get(p.name, {})
                sig.append((a.dtype, a.device.type, tuple(-1 if i in dyn else s for i, s in enumerate(a.shape))))
            else:  # an int read off a dynamic axis, or an unused one, is not a specialization
                sig.append(a if p.users and p.name not in self.sizes else None)
        return tuple(sig)

    def __call__(self, *args):
        exact = exact_key(args)
        runner = self.seen.get(exact)
        if runner is not None:
            return runner(*args)
        sig = self.signature(args)
        runner = self.runners.get(sig)
        if runner is None:
            runner = self.runners[sig] = self._build(args)
        result = runner(*args)
        remember_fast(self.seen, exact, runner, args)
        return result

    def _build(self, args):
        from ..frontends.capture import capture_program
        from ..frontends.errors import CaptureError, UnsupportedOpError

        names = [p.name for p, a in zip(self.placeholders, args) if isinstance(a, torch.Tensor)]
        dynamic = {name: self.dynamic[name] for name in names if self.dynamic.get(name)}
        try:
            captured = capture_program(_tensor_function(self.gm, self.placeholders, args, self.sizes),
                                       *[a for a in args if isinstance(a, torch.Tensor)], dynamic=dynamic or None,
                                       name=_name(self.gm))
        except UnsupportedOpError as err:
            self.ctx.warn_unsupported(err.op, _name(self.gm), err.source)
            name = op_name(err.op)
            if name in self.unsupported or not _unsupported_nodes(self.gm, {name}):
                self.ctx.eager_regions += 1
                return self.gm
            return build(self.gm, self.ctx, self.unsupported | {name})
        except CaptureError as err:
            self.ctx.warn_unsupported(f"capture of {_name(self.gm)} ({err})", _name(self.gm))
            self.ctx.eager_regions += 1
            return self.gm
        symbols = {sym for axes in dynamic.values() for sym in axes.values()}
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        op = self.ctx.operator(captured.graph, symbols, device)  # search and schedule run lazily, on its first call
        return Launcher(op, self.ctx, [p.name for p in self.placeholders], self.tuple_output, self.gm, _name(self.gm),
                        writes=captured.writes)


def _tensor_function(gm, placeholders, args, sizes):
    """gm as a function of its tensor inputs only, named like its placeholders (capture
    reads parameter names). An int input that is the size of a dynamic axis (dynamo
    passes such SymInts along, e.g. for a causal mask) is read off that tensor, so it
    stays symbolic; the other non-tensor inputs are bound to this call's values,
    which the region's signature includes."""
    import inspect

    tensor_names = [p.name for p, a in zip(placeholders, args) if isinstance(a, torch.Tensor)]
    fixed = {p.name: a for p, a in zip(placeholders, args) if not isinstance(a, torch.Tensor)}
    order = [p.name for p in placeholders]

    def fn(*tensors):
        given = {**fixed, **dict(zip(tensor_names, tensors))}
        for name, (source, axis) in sizes.items():
            given[name] = given[source].shape[axis]
        return gm(*(given[n] for n in order))

    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in tensor_names])
    fn.__name__ = _name(gm)
    return fn


class Launcher:
    """Feeds arguments to an operator by input name and shapes the result like the
    code it replaces: a module's parameters and buffers are read off it at each call
    (`state`), and outputs that are an input's new value (an in-place op in the code,
    `writes`: output -> input) are copied into that input. If cleave cannot build the
    operator (CompileFailure: the search, the scheduler or the kernels' first launch
    failed), it warns once, saying why, and runs that code eagerly from then on. The
    code also runs eagerly, with one warning, when autograd would need a backward
    through the kernels (they have none), and when inputs it writes share memory."""

    def __init__(self, op, ctx: Context, names, tuple_output: bool, eager, where: str,
                 state: dict | None = None, writes: dict[str, str] | None = None):
        self.op, self.ctx, self.names, self.tuple_output = op, ctx, list(names), tuple_output
        self.eager_fn, self.where, self.failed = eager, where, False
        self.state = state or {}
        self.graph_inputs = [k for k in op.graph.inputs if k not in self.state]
        self.by_name = set(self.graph_inputs) <= set(self.names)
        self.positions = [self.names.index(k) for k in self.graph_inputs] if self.by_name else None
        writes = writes or {}
        outputs = op.graph.output_names
        self.results = [i for i, name in enumerate(outputs) if name not in writes]
        self.writebacks = [(i, self.names.index(writes[name])) for i, name in enumerate(outputs) if name in writes]

    def __call__(self, *args):
        if self.failed:
            return self.eager_fn(*args)
        inputs = self.inputs(args)
        if self._runs_eagerly(args, inputs):
            return self.eager_fn(*args)
        try:
            outs = self.ctx.run(self.op, inputs)
        except CompileFailure as err:
            self.ctx.warn_failed(self.op.graph.name, self.where, str(err))
            self.failed = True
            return self.eager_fn(*args)
        except NotReadyDuringCapture as err:
            self.ctx.warn_capture(self.where, str(err))
            return self.eager_fn(*args)
        return self._finish(args, outs)

    def inputs(self, args) -> dict[str, torch.Tensor]:
        if self.by_name:
            out = {k: args[i] for k, i in zip(self.graph_inputs, self.positions)}
        else:
            out = dict(zip(self.graph_inputs, [a for a in args if isinstance(a, torch.Tensor)]))
        for name, get in self.state.items():
            out[name] = get()
        return out

    def _finish(self, args, outs):
        for i, position in self.writebacks:
            args[position].copy_(outs[i])
        results = [outs[i] for i in self.results]
        return tuple(results) if self.tuple_output else results[0]

    def _runs_eagerly(self, args, inputs) -> bool:
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs.values()):
            self.ctx.warn_eager(self.where, "inputs require grad and cleave's kernels have no backward "
                                "(call it under torch.no_grad(), or with requires_grad=False, to compile it)")
            return True
        if self.writebacks and _overlapping(args):
            self.ctx.warn_eager(self.where, "it changes an input in place and its inputs share memory")
            return True
        return False

    def hot(self, args):
        """A callable for later calls whose arguments match these exactly (shapes, dtypes,
        devices), once they have run: the operator's prepared launch, without this
        launcher's, the context's and the operator's per-call lookups (a decode step's
        kernels take less time than the host spends launching them). The launcher
        itself once it runs eagerly for good; None while these arguments have not run
        compiled yet (first met during a CUDA graph capture)."""
        if self.failed or self.writebacks:
            return self
        launch = self.op.ready(self.inputs(args))
        if launch is None:
            return None
        stats, ctx = self.op.stats, self.ctx

        def launch_hot(*args):
            inputs = self.inputs(args)
            # explain records each launch, and autograd needs the eager path: the full path does
            if ctx.log is not None or (torch.is_grad_enabled() and any(t.requires_grad for t in inputs.values())):
                return self(*args)
            stats["calls"] += 1
            return self._finish(args, launch(inputs))

        return launch_hot


def _overlapping(args) -> bool:
    from ..frontends.capture import shares_memory

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return any(shares_memory(a, b) for i, a in enumerate(tensors) for b in tensors[i + 1:])


def exact_key(args) -> tuple:
    """What a prepared launch depends on: each tensor's shape, dtype and device, and
    every other argument's value."""
    return tuple((a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)


def remember_fast(memo: dict, key: tuple, runner, args) -> None:
    """Keep for calls with exactly these arguments the runner's fastest form: a
    Launcher's hot path once they have run compiled, any other runner as it is."""
    fast = runner.hot(args) if isinstance(runner, Launcher) else runner
    if fast is not None:
        remember(memo, key, fast)


def _dynamic_axes(placeholder: torch.fx.Node) -> dict[int, str]:
    """Axes dynamo made symbolic (mark_dynamic, or automatic dynamic), named after their SymInt."""
    value = placeholder.meta.get("example_value", placeholder.meta.get("val"))
    if not isinstance(value, torch.Tensor):
        return {}
    out = {}
    for i, d in enumerate(value.shape):
        if isinstance(d, torch.SymInt) and not d.node.is_nested_int():
            expr = str(d)
            out[i] = expr if expr.isidentifier() else "d_" + "".join(c if c.isalnum() else "_" for c in expr)
    return out


def _size_inputs(placeholders, dynamic) -> dict[str, tuple[str, int]]:
    """Int placeholders whose SymInt is exactly a dynamic axis of a tensor input: name -> (tensor, axis)."""
    axes = {sym: (name, axis) for name, dims in dynamic.items() for axis, sym in dims.items()}
    out = {}
    for p in placeholders:
        value = p.meta.get("example_value", p.meta.get("val"))
        if isinstance(value, torch.SymInt) and str(value) in axes:
            out[p.name] = axes[str(value)]
    return out


def _name(gm) -> str:
    return getattr(gm, "_cleave_name", None) or type(gm).__name__
