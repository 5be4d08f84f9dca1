"""Replay a FlashInfer-Trace workload file through one compiled operator.

The definition's `cleave_workload:NAME` tag names the cleave workload whose
reference function is compiled once (with the workload's dynamic axes); every
shape of the trace then runs through that one operator and through the
definition's reference (SDPA), is checked against it, and is timed. A recompile
is any search or schedule after the first call: the target is 0.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from ..ir import CleaveError
from .traces import DTYPES, axis_values, load_trace, reference_fn


@dataclass
class ShapeResult:
    axes: dict[str, int]
    cleave_ms: float
    sdpa_ms: float
    max_error: float

    @property
    def speedup(self) -> float:
        return self.sdpa_ms / self.cleave_ms


@dataclass
class ReplayResult:
    definition: str
    device: str
    shapes: list[ShapeResult] = field(default_factory=list)
    recompiles: int = 0
    stats: dict = field(default_factory=dict)

    @property
    def geomean(self) -> float:
        return math.exp(sum(math.log(s.speedup) for s in self.shapes) / len(self.shapes))


def _workload_name(definition: dict) -> str:
    for tag in definition.get("tags", []):
        if tag.startswith("cleave_workload:"):
            return tag.split(":", 1)[1]
    raise CleaveError(f"definition {definition['name']} has no 'cleave_workload:NAME' tag")


def _inputs(definition, values, device, gen):
    out = []
    for spec in definition["inputs"].values():
        shape = [values[a] for a in spec["shape"]]
        out.append(torch.randn(shape, generator=gen).to(DTYPES[spec["dtype"]]).to(device))
    return out


def _time_ms(fn, args, device: str) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(lambda: fn(*args), warmup=5, rep=20))
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1e3


def replay(path, device: str = "cuda", scale: float = 1.0, limit: int | None = None,
           const: dict[str, int] | None = None, seed: int = 0, progress=None) -> ReplayResult:
    from .. import workloads
    from .compile import compile as cleave_compile

    if device == "cuda" and not torch.cuda.is_available():
        raise CleaveError("--device cuda: no CUDA device here (use --device cpu with TRITON_INTERPRET=1)")
    definition, lines = load_trace(path)
    unknown = set(const or {}) - {a for a, s in definition["axes"].items() if s["type"] == "const"}
    if unknown:
        raise CleaveError(f"--const: {sorted(unknown)} are not const axes of {definition['name']}")
    workload = workloads.get(_workload_name(definition))
    compiled = cleave_compile(workload.reference, dynamic=workload.dynamic, device=device)
    baseline = reference_fn(definition)
    gen = torch.Generator().manual_seed(seed)
    lines = lines[:limit] if limit else lines
    result = ReplayResult(definition["name"], device)
    after_first = None
    for i, line in enumerate(lines):
        binding = {a: max(1, math.ceil(v * scale)) for a, v in line["workload"]["axes"].items()}
        values = {**axis_values(definition, binding), **(const or {})}
        args = _inputs(definition, values, device, gen)
        got = compiled(*args)
        if after_first is None:
            after_first = compiled.stats["searches"] + compiled.stats["compiles"]
        want = baseline(*args)
        error = (got.float() - want.float()).abs().max().item()
        if not error <= 5e-2 * max(1.0, want.float().abs().max().item()):
            raise CleaveError(f"shape {binding}: cleave differs from the reference by {error:.3g}")
        result.shapes.append(ShapeResult(binding, _time_ms(compiled, args, device), _time_ms(baseline, args, device),
                                         error))
        if progress:
            progress(i + 1, len(lines), result.shapes[-1])
    result.stats = compiled.stats
    result.recompiles = result.stats["searches"] + result.stats["compiles"] - after_first
    return result
