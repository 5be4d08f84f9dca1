"""Run a Plan: bind symbols from the tensors, allocate outputs and intermediates,
load each kernel's module once per plan, launch. Imports torch and triton only
(plus the IR's binder), never egglog, z3, cleave.search or cleave.verify."""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

import torch
from triton.compiler import CompiledKernel

from cleave.interpreter import TORCH_DTYPES
from cleave.ir import BindingError, parse_graph
from cleave.ir.dtypes import dtype as ir_dtype

from .exprs import evaluate
from .plan import Plan

_MODULES: dict[tuple, object] = {}  # (kernel name, source hash) -> the jitted function
_DIR = tempfile.mkdtemp(prefix="cleave_kernels_")


def _kernel_fn(plan: Plan, k):
    key = (k.name, hash(k.source))
    fn = _MODULES.get(key)
    if fn is None:
        # Triton reads a jitted function's source from its file: write it, then import.
        path = os.path.join(_DIR, f"{k.name}_{abs(hash(k.source)):x}.py")
        with open(path, "w") as f:
            f.write(k.source)
        spec = importlib.util.spec_from_file_location(f"cleave_kernel_{abs(hash(k.source)):x}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        fn = getattr(module, k.name)
        _MODULES[key] = fn
    return fn


def bind(plan: Plan, inputs: dict[str, torch.Tensor]) -> dict[str, int]:
    graph = _cached(plan).get("graph")
    if graph is None:
        graph = _cached(plan)["graph"] = parse_graph(plan.graph)
    env = graph.bind({k: tuple(v.shape) for k, v in inputs.items()}, extra=dict(plan.split))
    failed = plan.fits(env)
    if failed:
        raise BindingError(f"plan (split {plan.split}) does not serve this shape: {failed} fails for "
                           + ", ".join(f"{k}={v}" for k, v in sorted(env.items())))
    for name, value in plan.env.items():
        if name not in plan.dynamic and env.get(name, value) != value:
            raise BindingError(f"plan was scheduled for {name}={value}, got {name}={env[name]} "
                               f"(declare {name!r} dynamic to vary it)")
    return env


class _Prepared:
    """Everything a launch at one set of input shapes needs, as plain ints: binding
    symbols through sympy costs milliseconds, so it happens once per shape."""

    def __init__(self, plan: Plan, inputs: dict[str, torch.Tensor]):
        env = bind(plan, inputs)
        self.casts = [(b.name, TORCH_DTYPES[ir_dtype(b.dtype)]) for b in plan.inputs]
        self.outputs = [(b.name, [evaluate(d, env) for d in b.shape], TORCH_DTYPES[ir_dtype(b.dtype)])
                        for b in plan.outputs]
        self.intermediates = [(b.name, [evaluate(d, env) for d in b.shape], TORCH_DTYPES[ir_dtype(b.dtype)])
                              for b in plan.intermediates]
        self.kernels = [(_kernel_fn(plan, k), (evaluate(k.grid[0], env), 1, 1),
                         [(a, None) if a not in env else (None, env[a]) for a in k.args],
                         dict(k.constexprs, num_warps=k.num_warps, num_stages=k.num_stages))
                        for k in plan.kernels]
        # Triton's compiled kernel per launch, once the JIT has picked it for these
        # shapes: calling it directly skips the JIT's per-call argument binding and
        # cache lookup (most of a small decode step's launch cost).
        self.direct: list = [None] * len(self.kernels)
        self.direct_on = None  # the device the direct kernels were loaded on
        # Each kernel's compiled form, shared by every shape of the plan (dynamic ints are
        # not specialised): its registers and shared memory give the occupancy.
        self.compiled: list = _cached(plan).setdefault("compiled", [None] * len(self.kernels))
        ints = [value for _, _, args, _ in self.kernels for name, value in args if name is None]
        self.direct_ok = all(not k.constexprs for k in plan.kernels) and all(abs(v) < 2 ** 31 for v in ints)


def _cached(plan: Plan) -> dict:
    """Per-plan memo kept on the plan itself: a registry keyed by id(plan) would hand a
    new plan the entries of a dead one that happened to have the same id."""
    memo = plan.__dict__.get("_launch_memo")
    if memo is None:
        memo = plan.__dict__["_launch_memo"] = {}
    return memo


SHAPES_KEPT = 4096  # per-shape memos are bounded: a long-running server meets many shapes


def remember(memo: dict, key, value):
    """memo[key] = value, after forgetting everything once SHAPES_KEPT entries are held
    (a forgotten shape is bound again: about a millisecond)."""
    if len(memo) >= SHAPES_KEPT:
        memo.clear()
    memo[key] = value
    return value


def prepare(plan: Plan, inputs: dict[str, torch.Tensor]) -> _Prepared:
    """The launch of `plan` at these input shapes, memoized on the plan."""
    key = tuple((name, tuple(t.shape)) for name, t in inputs.items())
    memo = _cached(plan)
    prepared = memo.get(key)
    if prepared is None:
        prepared = remember(memo, key, _Prepared(plan, inputs))
    return prepared


def run(prepared: _Prepared, inputs: dict[str, torch.Tensor], out: list | None = None) -> list[torch.Tensor]:
    """Launch a prepared plan on inputs of the shapes it was prepared for."""
    device = next(iter(inputs.values())).device
    tensors = {}
    for name, want in prepared.casts:
        t = inputs[name]
        tensors[name] = (t if t.dtype == want else t.to(want)).contiguous()
    outs = []
    for i, (name, shape, dtype) in enumerate(prepared.outputs):
        t = out[i] if out is not None else torch.empty(shape, dtype=dtype, device=device)
        if out is not None and (list(t.shape) != shape or not t.is_contiguous()):
            raise BindingError(f"output {name!r}: expected a contiguous tensor of shape {shape}, got {list(t.shape)}")
        tensors[name] = t
        outs.append(t)
    for name, shape, dtype in prepared.intermediates:
        tensors[name] = torch.empty(shape, dtype=dtype, device=device)
    # Fresh allocations are aligned (the caching allocator's blocks are): check the rest.
    aligned = prepared.direct_ok and prepared.direct_on in (None, device) and \
        all(tensors[name].data_ptr() % 16 == 0 for name, _ in prepared.casts) and \
        (out is None or all(t.data_ptr() % 16 == 0 for t in outs))
    for i, (fn, grid, args, options) in enumerate(prepared.kernels):
        values = [tensors[name] if name is not None else value for name, value in args]
        direct = prepared.direct[i]
        if direct is not None and aligned:
            try:
                direct[grid](*values)
                continue
            except Exception:  # a Triton whose compiled-kernel call differs: the JIT path always works
                prepared.direct_ok = aligned = False
        kernel = fn[grid](*values, **options)
        if isinstance(kernel, CompiledKernel):
            prepared.compiled[i] = kernel
            if aligned:  # specialised like every later aligned call of this shape: same
                # dtypes, ints unspecialised or equal, pointers 16-byte aligned
                prepared.direct[i], prepared.direct_on = kernel, device
    return outs


def launch(plan: Plan, inputs: dict[str, torch.Tensor], out: list | None = None) -> list[torch.Tensor]:
    return run(prepare(plan, inputs), inputs, out)
