"""Choosing the strongest baseline: run each candidate once, drop the ones that
refuse the inputs, compile too slowly or disagree with the workload's reference
(each with its reason), time the rest and name the fastest."""
from __future__ import annotations

import contextlib
import math
import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch

# The tolerance cleave's own plans are held to (relative L2 error against fp32).
TOLERANCE = 2e-2
NOT_NEEDED = "fallback, not needed: another baseline ran"


@dataclass(frozen=True)
class Baseline:
    name: str
    fn: Callable[..., object]  # takes the workload's inputs by name
    # Entered around the check and the timing, e.g. SDPA restricted to one backend.
    context: Callable[[], ContextManager] = contextlib.nullcontext
    # A first call (compile, autotuning) slower than this drops the baseline.
    first_call_budget_s: float | None = None
    # Run before the first call, with the inputs: a reason to skip it, or None. Used to
    # enforce the budget where the first call itself cannot be interrupted.
    preflight: Callable[[dict], str | None] | None = None
    # Timed only when no other baseline runs (SDPA's math backend).
    fallback: bool = False
    # Run once before the check, untimed: the inputs -> the keyword arguments `fn` takes
    # (per-step metadata a serving engine builds once for all layers: block masks, gather
    # indices, host-side lengths and scale).
    prepare: Callable[[dict], dict] | None = None
    # How many of the reference's outputs `fn` returns and is checked on (SDPA cannot
    # return the paged definitions' lse: its baselines return the output alone); None: all.
    outputs: int | None = None
    # Timed and reported, but never the strongest (SDPA on pre-gathered K/V: not the
    # whole operator).
    secondary: bool = False
    # Part of the workload's work alone (its GEMMs without the norm or the activation):
    # a floor the fused kernel is held against. Its output is not the workload's, so it
    # is not checked; it is always secondary.
    floor: bool = False


@dataclass
class Outcome:
    name: str
    ms: float | None = None
    skipped: str | None = None  # why it was not timed
    rel_err: float | None = None
    first_call_s: float | None = None
    warnings: list[str] = field(default_factory=list)
    secondary: bool = False
    graph_ms: float | None = None  # replayed from a CUDA graph (`measure`'s graph_timer)
    floor: bool = False  # Baseline.floor: its output is not the workload's


def error(outputs, reference: list[torch.Tensor]) -> float:
    """Worst relative L2 error over the outputs; for integer outputs, the share that differ.
    An infinite reference entry (the lse of an empty request) must be matched exactly and
    is left out of the norm."""
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    if len(outputs) != len(reference):
        return math.inf
    worst = 0.0
    for out, ref in zip(outputs, reference):
        if out.shape != ref.shape:
            return math.inf
        if not ref.is_floating_point():
            worst = max(worst, float((out.cpu() != ref.cpu()).float().mean()))
            continue
        out, ref = out.double(), ref.double()
        finite = torch.isfinite(ref)
        if not (torch.isfinite(out) == finite).all() or not (out[~finite] == ref[~finite]).all():
            return math.inf
        out, ref = out[finite], ref[finite]
        worst = max(worst, float((out - ref).norm() / ref.norm().clamp_min(1e-30)))
    return worst


def _informative(messages: list[str]) -> list[str]:
    """Warnings worth keeping: SDPA explains a refusal across several warnings, between
    headers ("... not used because:") and notes on the backends the context turned off."""
    kept = []
    for message in messages:
        message = re.sub(r"\s*\(Triggered internally at [^)]*\)", "", message).strip()
        if message and not message.endswith("because:") and "runtime disabled" not in message \
                and message not in kept:
            kept.append(message[:200])
    return kept


def _reason(exc: BaseException, caught: list[str]) -> str:
    first_line = (str(exc).strip().splitlines() or [""])[0][:200]
    return "; ".join([f"{type(exc).__name__}: {first_line}"] + _informative(caught)[:3])


def _try(baseline: Baseline, inputs: dict, reference: list, timer: Callable, sync: Callable,
         graph_timer: Callable | None) -> Outcome:
    outcome = Outcome(baseline.name, secondary=baseline.secondary or baseline.floor, floor=baseline.floor)
    if baseline.preflight is not None:
        outcome.skipped = baseline.preflight(inputs)
        if outcome.skipped is not None:
            return outcome
    reference = reference[:baseline.outputs] if baseline.outputs else reference
    with baseline.context(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if baseline.prepare is not None:
                inputs = baseline.prepare(inputs)
                sync()
            t0 = time.perf_counter()
            out = baseline.fn(**inputs)
            sync()
            outcome.first_call_s = time.perf_counter() - t0
        except Exception as exc:  # a backend that refuses these inputs, a failed compile
            outcome.skipped = _reason(exc, [str(w.message) for w in caught])
            return outcome
        outcome.warnings = _informative([str(w.message) for w in caught])
        budget = baseline.first_call_budget_s
        if budget is not None and outcome.first_call_s > budget:
            outcome.skipped = f"first call (compile) took {outcome.first_call_s:.0f} s, over the {budget:.0f} s budget"
            return outcome
        outcome.rel_err = None if baseline.floor else error(out, reference)
        if not baseline.floor and not outcome.rel_err <= TOLERANCE:
            outcome.skipped = f"disagrees with the reference: rel err {outcome.rel_err:.2e} > {TOLERANCE:.0e}"
            return outcome
        outcome.ms = timer(lambda: baseline.fn(**inputs))
        if graph_timer is not None:
            outcome.graph_ms = graph_timer(lambda: baseline.fn(**inputs))
    return outcome


def measure(baselines: list[Baseline], inputs: dict, reference: list[torch.Tensor],
            timer: Callable[[Callable], float], sync: Callable[[], None] = lambda: None,
            log: Callable[[str], None] = lambda msg: None,
            graph_timer: Callable[[Callable], float | None] | None = None) -> list[Outcome]:
    """One outcome per baseline, in order: timed (ms) or skipped with the reason; with
    `graph_timer`, each timed one also replayed from a CUDA graph (None: it cannot be)."""
    outcomes = {}
    for group in ([b for b in baselines if not b.fallback], [b for b in baselines if b.fallback]):
        for baseline in group:
            if baseline.fallback and best(list(outcomes.values())) is not None:
                outcomes[baseline.name] = Outcome(baseline.name, skipped=NOT_NEEDED)
                continue
            outcome = outcomes[baseline.name] = _try(baseline, inputs, reference, timer, sync, graph_timer)
            log(f"  {baseline.name}: {outcome.ms:.4f} ms" if outcome.ms is not None
                else f"  {baseline.name}: skipped: {outcome.skipped}")
    return [outcomes[b.name] for b in baselines]


def best(outcomes: list[Outcome], key: str = "ms") -> Outcome | None:
    """The fastest outcome by `key` ("ms", or "graph_ms": replayed from CUDA graphs) that is
    not secondary; None when none was timed that way."""
    timed = [o for o in outcomes if getattr(o, key) is not None and not o.secondary]
    return min(timed, key=lambda o: getattr(o, key), default=None)


def compiles_within(workload: str, mode: str, budget_s: float, inputs: dict) -> str | None:
    """None when `torch.compile` (in `mode`) of the workload's reference compiles and
    runs once, on inputs of these shapes and dtypes, within budget_s in a process of its
    own; else why not. A compile (max-autotune's took 7 minutes once on a fresh H200)
    cannot be stopped from inside its process, a child can. The child fills inductor's
    on-disk caches, so the compile that follows here is quick."""
    import multiprocessing

    specs = {k: (tuple(v.shape), v.dtype, str(v.device)) for k, v in inputs.items()}
    child = multiprocessing.get_context("spawn").Process(target=_compile_once, args=(workload, mode, specs),
                                                         daemon=True)
    child.start()
    child.join(budget_s)
    if child.is_alive():
        child.kill()
        child.join()
        return f"compile ({mode}) still running after the {budget_s:.0f} s budget: stopped"
    if child.exitcode != 0:
        return f"compile ({mode}) failed in its own process (exit {child.exitcode})"
    return None


def _compile_once(workload: str, mode: str, specs: dict) -> None:
    from cleave import workloads

    inputs = {k: torch.randn(shape, dtype=dtype, device=device) if dtype.is_floating_point
              else torch.zeros(shape, dtype=dtype, device=device) for k, (shape, dtype, device) in specs.items()}
    torch.compile(workloads.get(workload).reference, mode=mode, dynamic=False)(**inputs)
    if any(device.startswith("cuda") for _, _, device in specs.values()):
        torch.cuda.synchronize()
