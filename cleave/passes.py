"""Compile time per pass: where a cold first call spends its seconds.

Each pass runs inside `timed(name)`; the seconds go to the dict that `recording`
made current. Time is exclusive: a pass nested in another (codegen inside the
scheduler, translation inside AOTAutograd's lowering) is not counted twice.

    capture    tracing the function (cleave.compile's whole-function capture)
    decompose  AOTAutograd lowering with PyTorch's decompositions (the backend)
    translate  the aten graph into cleave's IR
    search     equality saturation and the candidate check
    schedule   partition, tiling and ranking
    codegen    rendering Triton source
    triton     first launches of every plan: Triton's compiles
"""
from __future__ import annotations

import contextlib
import contextvars
import time

PASSES = ("capture", "decompose", "translate", "search", "schedule", "codegen", "triton")

_current: contextvars.ContextVar = contextvars.ContextVar("cleave_pass_times", default=None)


@contextlib.contextmanager
def recording(seconds: dict):
    """Passes timed inside this block add to `seconds` (pass -> seconds)."""
    state = _current.get()
    if state is not None and state[0] is seconds:  # already recording there: keep the nesting
        yield seconds
        return
    token = _current.set((seconds, []))
    try:
        yield seconds
    finally:
        _current.reset(token)


@contextlib.contextmanager
def timed(name: str):
    state = _current.get()
    if state is None:
        yield
        return
    seconds, stack = state
    stack.append(0.0)  # time spent in passes nested in this one
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        nested = stack.pop()
        seconds[name] = seconds.get(name, 0.0) + elapsed - nested
        if stack:
            stack[-1] += elapsed


def summary(seconds: dict) -> str:
    """'search 1.52s, schedule 3.10s, ...' in pass order."""
    return ", ".join(f"{p} {seconds[p]:.2f}s" for p in PASSES if p in seconds) or "nothing compiled"
