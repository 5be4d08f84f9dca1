"""Run a Plan: bind symbols from the tensors, allocate outputs and intermediates,
load each kernel's module once per plan, launch. Imports torch and triton only
(plus the IR's binder), never egglog, z3, cleave.search or cleave.verify."""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

import torch

from cleave.interpreter import TORCH_DTYPES
from cleave.ir import BindingError, parse_graph
from cleave.ir.dtypes import dtype as ir_dtype

from .exprs import evaluate
from .plan import Plan

_MODULES: dict[tuple, object] = {}  # (plan id, kernel name) -> the jitted function
_GRAPHS: dict[int, object] = {}
_DIR = tempfile.mkdtemp(prefix="cleave_kernels_")


def _kernel_fn(plan: Plan, k):
    key = (id(plan), k.name, hash(k.source))
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
    graph = _GRAPHS.get(id(plan))
    if graph is None:
        graph = _GRAPHS[id(plan)] = parse_graph(plan.graph)
    env = graph.bind({k: tuple(v.shape) for k, v in inputs.items()}, extra=dict(plan.split))
    for name, value in plan.env.items():
        if name not in plan.dynamic and env.get(name, value) != value:
            raise BindingError(f"plan was scheduled for {name}={value}, got {name}={env[name]} "
                               f"(declare {name!r} dynamic to vary it)")
    return env


def launch(plan: Plan, inputs: dict[str, torch.Tensor], out: list | None = None) -> list[torch.Tensor]:
    env = bind(plan, inputs)
    device = next(iter(inputs.values())).device
    tensors = {}
    for b in plan.inputs:
        t = inputs[b.name]
        want = TORCH_DTYPES[ir_dtype(b.dtype)]
        tensors[b.name] = (t if t.dtype == want else t.to(want)).contiguous()
    outs = []
    for i, b in enumerate(plan.outputs):
        shape = [evaluate(d, env) for d in b.shape]
        t = out[i] if out is not None else torch.empty(shape, dtype=TORCH_DTYPES[ir_dtype(b.dtype)], device=device)
        if list(t.shape) != shape or not t.is_contiguous():
            raise BindingError(f"output {b.name!r}: expected a contiguous tensor of shape {shape}, got {list(t.shape)}")
        tensors[b.name] = t
        outs.append(t)
    for b in plan.intermediates:
        shape = [evaluate(d, env) for d in b.shape]
        tensors[b.name] = torch.empty(shape, dtype=TORCH_DTYPES[ir_dtype(b.dtype)], device=device)
    for k in plan.kernels:
        fn = _kernel_fn(plan, k)
        args = [tensors[a] if a in tensors else env[a] for a in k.args]
        grid = (evaluate(k.grid[0], env),)
        fn[grid](*args, **k.constexprs, num_warps=k.num_warps, num_stages=k.num_stages)
    return outs
