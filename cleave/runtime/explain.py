"""`cleave.explain(compiled, *args)`: what cleave did for one call, as a report.

The call is run once with the launch log on, so the report shows exactly the
operators and plans that served these shapes (and compiles them if needed).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from .. import fidelity, passes
from ..ir import CleaveError


@dataclass
class KernelInfo:
    operator: str
    name: str
    grid: str
    source: str


@dataclass
class OperatorReport:
    name: str
    graph: str
    candidate: str
    derivation: list[str]
    cost: str
    split: object
    tiles: object
    plan_cost: object
    kernels: list[KernelInfo]
    dynamic: list[str]
    shapes: dict[str, list[int]]
    labels: dict[str, str]  # an input of the graph -> the user's name of it, where they differ (dynamo's arg3_1)
    search_seconds: float
    compile_seconds: float
    search_stats: dict
    from_cache: bool
    key: str


@dataclass
class Report:
    operators: list[OperatorReport]
    stats: dict
    graph_breaks: int
    unsupported: list[str] = field(default_factory=list)
    pass_seconds: dict[str, float] = field(default_factory=dict)  # compile time per pass, so far
    # per tensor output against eager fp32: its position ("output"), then max_abs and kl
    # (floating) or mismatches of numel (compared exactly: integer, bool)
    fidelity: list[dict] = field(default_factory=list)
    # why code of the context ran eagerly (inputs that require grad, a build that failed),
    # as warned so far: this call's, or an earlier call's (each reason is warned once)
    eager: list[str] = field(default_factory=list)

    @property
    def kernels(self) -> list[KernelInfo]:
        """One entry per kernel launched by the call, in launch order."""
        return [k for op in self.operators for k in op.kernels]

    def __str__(self) -> str:
        lines = [f"cleave explain: {len(self.operators)} operator(s), {len(self.kernels)} kernel launch(es), "
                 f"{self.graph_breaks} graph break(s)"]
        if self.unsupported:
            lines.append("eager (unsupported): " + ", ".join(self.unsupported))
        lines += [f"eager so far: {note}" for note in self.eager]
        lines.append("compile time per pass: " + passes.summary(self.pass_seconds))
        lines += [_fidelity_line(f) for f in self.fidelity]
        for i, op in enumerate(self.operators):
            lines += [
                "", f"== operator {i}: {op.name}  (cache key {op.key}, {'from cache' if op.from_cache else 'built now'})",
                "shapes: " + ", ".join(f"{op.labels[k]} ({k})={v}" if op.labels.get(k, k) != k else f"{k}={v}"
                                       for k, v in op.shapes.items())
                + ("   dynamic: " + ", ".join(op.dynamic) if op.dynamic else "   (all static)"),
                f"search: {op.search_seconds:.2f}s   schedule+codegen: {op.compile_seconds:.2f}s"
                + ("   " + ", ".join(f"{k}={v}" for k, v in op.search_stats.items()) if op.search_stats else ""),
                "-- captured graph", op.graph.rstrip(),
                f"-- chosen candidate (cost {op.cost})", op.candidate.rstrip(),
                "derivation: " + (" -> ".join(op.derivation) if op.derivation else "(none: the graph as written)"),
                f"-- schedule: split={op.split} tiles={op.tiles} kernels={len(op.kernels)} cost={op.plan_cost}",
            ]
            for k in op.kernels:
                lines += [f"-- kernel {k.name}  grid={k.grid}", k.source.rstrip()]
        return "\n".join(lines)


def explain(compiled, *args, **kwargs) -> Report:
    """`compiled` is what cleave.compile returns, or a function or module compiled with
    torch.compile(..., backend="cleave") or in place, `m.compile(backend="cleave")` (whose
    operators live in the backend's context)."""
    ctx, eager = _context(compiled)
    # first: the call may write its inputs. A function that casts to a precision of its
    # own (x @ w.bfloat16()) may not run with its inputs in fp32: eager as given then.
    try:
        want, against = fidelity.outputs(fidelity.eager_fp32(eager, args, kwargs)), "eager fp32"
    except Exception as err:  # noqa: BLE001 - whatever the user's function raises in fp32
        want = fidelity.outputs(fidelity.eager_fp32(eager, args, kwargs, fp32=False))
        against = f"eager at the inputs' own dtypes (in fp32 it raises {type(err).__name__})"
    ctx.log = []
    try:
        result = compiled(*args, **kwargs)
        log = ctx.log
    finally:
        ctx.log = None
    reports = [_operator_report(*launch) for launch in log]
    got = fidelity.outputs(result)
    stats = {"calls": getattr(compiled, "calls", None), **ctx.stats()}
    eager_notes = [m.removeprefix("cleave: ") for m in sorted(ctx.eager_notes) + ctx.failed]
    return Report(reports, stats, stats["graph_breaks"], stats["unsupported"], dict(ctx.pass_seconds),
                  [{"output": k, "against": against, **fidelity.check(g, w)} for (k, g), (_, w) in zip(got, want)],
                  eager_notes)


def _fidelity_line(f: dict) -> str:
    against = f"output {f['output']} against {f.get('against', 'eager fp32')}"
    if "mismatches" in f:
        return f"{against}: {f['mismatches']} of {f['numel']} elements differ (exact)"
    return f"{against}: max abs diff {f['max_abs']:.3g}, KL {f['kl']:.3g}"


def _context(compiled):
    """The context holding compiled's operators, and the eager function it compiles."""
    from . import backend
    from .compile import CompiledFunction

    from .compiled_module import CompiledModule

    if isinstance(compiled, (CompiledFunction, CompiledModule)):
        function = compiled if isinstance(compiled, CompiledFunction) else compiled._cleave_function
        return function.ctx, function.fn
    if isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule):
        _check_cleave_backend(compiled, compiled.dynamo_ctx)
        return backend.context(), compiled._orig_mod
    if isinstance(compiled, torch.nn.Module) and compiled._compiled_call_impl is not None:
        # compiled in place, `m.compile(backend="cleave")`: its own call runs torch.compile's
        # wrapper of its _call_impl, so eager is a shallow copy without it (the same tensors)
        _check_cleave_backend(compiled, _dynamo_context(compiled._compiled_call_impl))
        eager = copy.copy(compiled)
        eager._compiled_call_impl = None
        return backend.context(), eager
    if callable(compiled) and hasattr(compiled, "_torchdynamo_orig_callable"):
        _check_cleave_backend(compiled, _dynamo_context(compiled))
        return backend.context(), compiled._torchdynamo_orig_callable
    what = type(compiled).__name__ + (", a module not compiled" if isinstance(compiled, torch.nn.Module) else "")
    raise CleaveError("explain takes what cleave.compile returns, or a function or module compiled with "
                      f"torch.compile(..., backend=\"cleave\") or m.compile(backend=\"cleave\"), not {what}")


def _check_cleave_backend(compiled, dynamo_ctx) -> None:
    """Raise if torch.compile compiled `compiled` with a backend other than cleave's: the
    backend's context holds other functions' operators, none of this one's. A backend
    torch's wrappers do not show (they change between versions) is taken as cleave."""
    from .backend import cleave_backend

    found = _compiler(getattr(dynamo_ctx, "callback", None))
    if found is not None and getattr(found, "compiler_fn", None) is not cleave_backend:
        name = getattr(found, "compiler_name", None) or getattr(found, "name", None) or type(found).__name__
        raise CleaveError(f"explain: {_name(compiled)} is compiled with torch.compile's {name!r} backend, not "
                          f"cleave's: compile it with torch.compile(..., backend=\"cleave\") or cleave.compile")


def _dynamo_context(compiled):
    """The torch.compile context a compiled function's wrapper closes over, or None."""
    cells = getattr(compiled, "__closure__", None) or ()
    return next((c.cell_contents for c in cells
                 if isinstance(c.cell_contents, torch._dynamo.eval_frame._TorchDynamoContext)), None)


def _compiler(callback):
    """torch.compile's wrapper of the backend under dynamo's frame callback, or None."""
    while callback is not None and hasattr(callback, "_torchdynamo_orig_backend"):
        callback = callback._torchdynamo_orig_backend
    return callback if hasattr(callback, "compiler_name") or hasattr(callback, "compiler_fn") else None


def _name(compiled) -> str:
    inner = getattr(compiled, "_torchdynamo_orig_callable", compiled)
    return getattr(inner, "__name__", None) or type(inner).__name__


def _operator_report(op, spec, plan, shapes, labels) -> OperatorReport:
    cand = spec.candidate
    kernels = [KernelInfo(op.graph.name, k.name, str(k.grid), k.source) for k in plan.kernels]
    return OperatorReport(
        name=op.graph.name, graph=op.graph.text(), candidate=cand.graph.text(), derivation=list(cand.derivation),
        cost=str(cand.cost), split=getattr(plan, "split", None), tiles=getattr(plan, "tiles", None),
        plan_cost=getattr(plan, "cost", None), kernels=kernels, dynamic=sorted(op.dynamic),
        shapes=shapes, labels=labels,
        search_seconds=op.stats["search_seconds"], compile_seconds=op.stats["compile_seconds"],
        search_stats=op.search_stats, from_cache=spec.from_cache, key=op.key)
