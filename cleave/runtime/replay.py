"""Replay a FlashInfer-Trace workload file through one compiled operator.

The definition's `cleave_workload:NAME` tag names the cleave workload whose
reference function is compiled once (with the workload's dynamic axes); every
shape of the trace then runs through that one operator and through the
definition's reference (SDPA), is checked against it, and is timed. A recompile
is any search or schedule after the first call: the target is 0. Triton JIT
compiles are counted apart, on the GPU: those on a call whose shape moved only
along dynamic axes (no new static binding), where the target is 0 too.

`build` runs the search and the scheduler for a trace's shapes without running a
kernel (meta tensors), into a directory that `replay(artifact=DIR)` loads on
another machine: the GPU box then needs torch and triton only, no egglog or z3.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..interpreter import TORCH_DTYPES
from ..ir import CleaveError
from ..ir.dtypes import dtype as ir_dtype
from .operator import RANKED_CANDIDATES
from .traces import TraceError, axis_values, given_numbers, load_trace, reference_fn


@dataclass
class ShapeResult:
    """Times of one shape: eager launches (do_bench, the host's launch overhead included
    when it exceeds the kernels' time) and, on a GPU, GPU time replayed from a CUDA
    graph (how a serving engine runs a decode step)."""
    axes: dict[str, int]
    cleave_ms: float
    sdpa_ms: float
    max_error: float
    cleave_graph_ms: float | None = None
    sdpa_graph_ms: float | None = None
    plan: str = ""  # the plan that ran: its split counts and kernel count
    baseline: str = "reference"  # the fastest baseline at this shape (sdpa_ms is its time)

    @property
    def speedup(self) -> float:
        return self.sdpa_ms / self.cleave_ms

    @property
    def graph_speedup(self) -> float | None:
        if self.cleave_graph_ms is None or self.sdpa_graph_ms is None:
            return None
        return self.sdpa_graph_ms / self.cleave_graph_ms


@dataclass
class ReplayResult:
    definition: str
    device: str
    shapes: list[ShapeResult] = field(default_factory=list)
    recompiles: int = 0
    jit_recompiles: int | None = None  # None under TRITON_INTERPRET (nothing is compiled)
    # Launch configurations (warps, stages) compiled while a later call tuned a new shape
    # bucket (mix.py); apart from jit_recompiles, which counts the other calls.
    jit_tuning: int | None = None
    stats: dict = field(default_factory=dict)

    @property
    def geomean(self) -> float:
        return math.exp(sum(math.log(s.speedup) for s in self.shapes) / len(self.shapes))

    @property
    def graph_geomean(self) -> float | None:
        if not self.shapes or any(s.graph_speedup is None for s in self.shapes):
            return None
        return math.exp(sum(math.log(s.graph_speedup) for s in self.shapes) / len(self.shapes))


def _workload_name(definition: dict) -> str:
    for tag in definition.get("tags", []):
        if tag.startswith("cleave_workload:"):
            return tag.split(":", 1)[1]
    raise CleaveError(f"definition {definition['name']} has no 'cleave_workload:NAME' tag")


def _inputs(definition, line, values, device, gen):
    """Floats drawn on the device itself (a decode step's KV cache is hundreds of MB, and
    drawing it on the host took longer than timing it); a "scalar" (sm_scale) and an
    "inline" index tensor (a paged trace's page lists) as the line holds them."""
    given = line["workload"]["inputs"]
    out = []
    for name, spec in definition["inputs"].items():
        shape, how = [values[a] for a in spec["shape"] or []], given.get(name, {})
        dtype = TORCH_DTYPES[ir_dtype(spec["dtype"])]
        if how.get("type") in ("scalar", "inline"):
            where = f"workload {line['workload'].get('uuid')}: input {name!r}"
            count, wanted = given_numbers(where, how), math.prod(shape)
            if count != wanted:
                raise TraceError(f"{where}: value holds {count} numbers; its shape {shape} holds {wanted}")
            try:
                out.append(torch.tensor(how["value"], dtype=dtype, device=device).reshape(shape))
            except (ValueError, TypeError) as err:  # ragged nested lists
                raise TraceError(f"{where}: value is not a tensor ({err})") from None
        else:
            out.append(torch.randn(shape, generator=gen, device=device, dtype=dtype))
    return out


def _check_replayable(lines) -> None:
    """Refuses an input that replay cannot build, before anything is compiled: a
    "safetensors" one (recorded tensors; cleave does not depend on that package) would
    otherwise be drawn at random."""
    for line in lines:
        w = line["workload"]
        for name, how in w.get("inputs", {}).items():
            if how.get("type", "random") not in ("random", "scalar", "inline"):
                raise CleaveError(f"workload {w.get('uuid')}: input {name!r} has type {how['type']!r}"
                                  + (f" ({how['path']})" if "path" in how else "")
                                  + "; replay takes \"random\", \"scalar\" and \"inline\" inputs only")


def _max_error(got, want) -> float:
    """Largest difference over the outputs where the reference is finite; inf if an
    output is infinite (an empty request's lse) where the reference is not, or back."""
    got = got if isinstance(got, (tuple, list)) else [got]
    want = want if isinstance(want, (tuple, list)) else [want]
    error = 0.0
    for g, w in zip(got, want):
        g, w = g.float(), w.float()
        finite = torch.isfinite(w)
        if not torch.equal(finite, torch.isfinite(g)):
            return math.inf
        if finite.any():
            error = max(error, (g[finite] - w[finite]).abs().max().item() / max(1.0, w[finite].abs().max().item()))
    return error


def _time_ms(run, device: str) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(run, warmup=5, rep=20))
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e3


def _syncs(run) -> bool:
    """Whether run waits on the device from the host (int() of a tensor, .item()): a CUDA
    graph cannot capture it."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
        return False
    except RuntimeError:
        return True
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _graph_ms(run, device: str) -> float | None:
    if device != "cuda":
        return None
    from .profile import graph_ms

    return graph_ms(run)


def _fastest_baseline(candidates, device: str, captures: dict) -> tuple[str, float, float | None]:
    """(name, eager ms, CUDA-graph ms) of the candidate fastest eagerly; graph ms is None
    where one candidate syncs with the host (`captures` remembers it per name)."""
    timed = []
    for name, run in candidates:
        if name not in captures:  # a reference looping over requests reads their lengths on the host
            captures[name] = device == "cuda" and not _syncs(run)
        timed.append((_time_ms(run, device), name, run))
    ms, name, run = min(timed, key=lambda t: t[0])
    return name, ms, _graph_ms(run, device) if captures[name] else None


def _setup(path, const):
    from .. import workloads

    definition, lines = load_trace(path)
    unknown = set(const or {}) - {a for a, s in definition["axes"].items() if s["type"] == "const"}
    if unknown:
        raise CleaveError(f"--const: {sorted(unknown)} are not const axes of {definition['name']}")
    return definition, lines, workloads.get(_workload_name(definition))


def _binding(line, scale: float) -> dict[str, int]:
    if scale != 1 and any(i.get("type") == "inline" for i in line["workload"]["inputs"].values()):
        raise CleaveError("--scale: this trace holds its page lists inline; they cannot be scaled "
                          "(write a smaller trace with the simulator instead)")
    return {a: max(1, math.ceil(v * scale)) for a, v in line["workload"]["axes"].items()}


def jit_kernels() -> int | None:
    """Triton kernels compiled so far by the generated modules (every specialization
    of every kernel, on every device); None where Triton interprets instead."""
    import sys

    from triton.runtime.jit import JITFunction

    count, found = 0, False
    for name, module in list(sys.modules.items()):
        if not name.startswith("cleave_kernel_"):
            continue
        for fn in vars(module).values():
            if isinstance(fn, JITFunction):
                found = True
                count += sum(len(caches[0]) for caches in fn.device_caches.values())
    return count if found else None


def build(path, out, scale: float = 1.0, const: dict[str, int] | None = None, top_k: int = 4) -> dict:
    """Search and schedule the trace's operator for each static binding its shapes use,
    without running anything, into the artifact directory `out`; returns a summary."""
    from .compile import compile as cleave_compile

    definition, lines, workload = _setup(path, const)
    compiled = cleave_compile(workload.reference, dynamic=workload.dynamic, device="cpu", top_k=top_k,
                              artifact=Path(out), candidates=RANKED_CANDIDATES)  # offline: rank the candidates
    ops = set()
    for line in _captured_first(lines, scale):
        ops.add(compiled.prepare(*_meta_args(definition, line, scale, const)))
    return {**compiled.stats, "definition": definition["name"], "entries": sorted(str(op.entry) for op in ops)}


def _meta_args(definition, line, scale, const) -> list:
    values = {**axis_values(definition, _binding(line, scale)), **(const or {})}
    return [torch.empty([values[a] for a in spec["shape"] or []], dtype=TORCH_DTYPES[ir_dtype(spec["dtype"])],
                        device="meta")
            for spec in definition["inputs"].values()]


def _captured_first(lines, scale) -> list:
    """The lines with the one to capture at moved to the front: the program is captured
    at the first shape. torch.export specialises an axis of extent 0 or 1 (a step of one
    request: indptr[1:-1] is empty; size-oblivious tracing in capture.py covers that on
    torch 2.13, not on 2.11, an unbacked size), and may give two axes of one extent one
    symbol (a prefill step of fresh prompts, total_q == total_kv). So: a step whose var
    axes all differ, then the one whose smallest var axis is largest."""
    if not lines:
        return lines

    def key(i):
        values = list(_binding(lines[i], scale).values())
        return len(set(values)) == len(values), min(values, default=0), -i

    at = max(range(len(lines)), key=key)
    return [lines[at]] + lines[:at] + lines[at + 1:]


def replay(path, device: str = "cuda", scale: float = 1.0, limit: int | None = None,
           const: dict[str, int] | None = None, seed: int = 0, progress=None, artifact=None,
           baselines=None) -> ReplayResult:
    """`baselines`, if given, maps a shape's inputs (by name) to [(name, run)], each run
    a no-argument callable (its per-step metadata built untimed before): the fastest
    at each shape is the one cleave is compared with. Without it, the definition's
    reference is. Correctness is always checked against the reference."""
    from .compile import compile as cleave_compile

    if device == "cuda" and not torch.cuda.is_available():
        raise CleaveError("--device cuda: no CUDA device here (use --device cpu with TRITON_INTERPRET=1)")
    if artifact is not None and not Path(artifact).is_dir():
        raise CleaveError(f"--artifact: no directory {artifact} (build one with `cleave trace build`)")
    definition, lines, workload = _setup(path, const)
    _check_replayable(lines)
    compiled = cleave_compile(workload.reference, dynamic=workload.dynamic, device=device, artifact=artifact)
    baseline = reference_fn(definition)
    gen = torch.Generator(device=device).manual_seed(seed)
    lines = _captured_first(lines[:limit] if limit else lines, scale)
    result = ReplayResult(definition["name"], device)
    after_first = None
    captures: dict[str, bool] = {}  # per baseline: whether a CUDA graph can replay it
    jit_recompiles = jit_tuning = 0
    for i, line in enumerate(lines):
        binding = _binding(line, scale)
        values = {**axis_values(definition, binding), **(const or {})}
        args = _inputs(definition, line, values, device, gen)
        jit_before, specs_before, tunings_before = jit_kernels(), _specs(compiled), compiled.stats["tunings"]
        got = compiled(*args)
        if compiled.capture_error is not None:
            raise CleaveError(f"{definition['name']}: torch.export did not capture the program whole at "
                              f"{binding} ({compiled.capture_error}); it ran through dynamo's graphs instead")
        if compiled.ctx.failed or compiled.ctx.eager_regions:
            raise CleaveError(f"{definition['name']}: cleave ran part of it eagerly ("
                              + "; ".join(compiled.ctx.failed + compiled.ctx.stats()["unsupported"])
                              + "): timing it would time eager PyTorch")
        if after_first is None:
            after_first = compiled.stats["searches"] + compiled.stats["compiles"]
        elif jit_before is not None and _specs(compiled) == specs_before:
            # A kernel compiled for a shape that only moved along dynamic axes: a
            # specialisation, or a launch variant tried while tuning a new bucket.
            if compiled.stats["tunings"] > tunings_before:
                jit_tuning += jit_kernels() - jit_before
            else:
                jit_recompiles += jit_kernels() - jit_before
        want = baseline(*args)
        error = _max_error(got, want)
        if not error <= 5e-2:
            raise CleaveError(f"shape {binding}: cleave differs from the reference by {error:.3g}")
        candidates = [("reference", lambda: baseline(*args))] if baselines is None else \
            baselines(dict(zip(definition["inputs"], args)))
        name, base_ms, base_graph_ms = _fastest_baseline(candidates, device, captures)
        run = lambda: compiled(*args)  # noqa: E731
        result.shapes.append(ShapeResult(binding, _time_ms(run, device), base_ms, error, _graph_ms(run, device),
                                         base_graph_ms, _plan_used(compiled, definition, args), name))
        if progress:
            progress(i + 1, len(lines), result.shapes[-1])
    result.stats = compiled.stats
    result.recompiles = result.stats["searches"] + result.stats["compiles"] - after_first
    interpreted = jit_kernels() is None
    result.jit_recompiles, result.jit_tuning = (None, None) if interpreted else (jit_recompiles, jit_tuning)
    return result


def _plan_used(compiled, definition, args) -> str:
    named = dict(zip(definition["inputs"], args))
    # several regions (dynamo graph breaks), or a graph of dynamo's: not one plan to name
    if len(compiled.operators) != 1 or not set(compiled.operators[0].graph.inputs) <= set(named):
        return ""
    op = compiled.operators[0]
    plan, _ = op.select({k: a for k, a in named.items() if k in op.graph.inputs})
    split = " ".join(f"{k}={v}" for k, v in sorted(plan.split.items()))
    return f"{split + ' ' if split else ''}{len(plan.kernels)} kernel{'s' if len(plan.kernels) > 1 else ''}"


def _specs(compiled) -> int:
    """Static bindings served so far: a new one is a new operator, compiled on first use."""
    return sum(len(op.specs) for op in compiled.operators)
