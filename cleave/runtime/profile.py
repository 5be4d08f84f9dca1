"""Rank plans by measured GPU time (CUDA-graph replays); on CPU (or TRITON_INTERPRET=1)
the cost model's order."""
from __future__ import annotations

import math
from typing import Callable

import torch
from triton import knobs

from ..scheduler.plan import Plan
from .launch import launch


def rank(plans: list[Plan], inputs: dict[str, torch.Tensor]) -> list[int]:
    """Indices of `plans`, fastest first. Each plan runs once (compiling it); a plan whose
    one call is far slower than the fastest one call is ranked by that call, the others
    by CUDA-graph replays in alternation (`alternated`)."""
    if not plans:
        raise ValueError("profile: no plans to choose from")
    device = next(iter(inputs.values())).device
    if device.type != "cuda" or knobs.runtime.interpret or len(plans) == 1:
        return list(range(len(plans)))
    runs = [lambda p=plan: launch(p, inputs) for plan in plans]
    once = []
    for run in runs:
        run()  # compile outside the timing
        once.append(once_ms(run))
    # A plan far slower than the fastest in one call is not replayed: a graph of its calls
    # could take minutes (the paged prefill's split plans took 18 s a call on the H200).
    fastest = min(once)
    replayed = [i for i, t in enumerate(once) if t <= SLOWER * fastest or t - fastest <= SLOWER_BY_MS]
    times = dict(enumerate(once))
    # GPU time, replayed from a CUDA graph: timed eagerly, a small decode step measures
    # the host's launch overhead (the same for every plan) and the ranking is noise.
    times.update(zip(replayed, alternated([runs[i] for i in replayed])))
    return sorted(range(len(plans)), key=times.__getitem__)


# One call this many times the fastest plan's, and this many ms more (a host's launch
# overhead never is), marks a plan as out of the running.
SLOWER = 4.0
SLOWER_BY_MS = 1.0
# Replayed plans are timed over this many rounds, each replaying every plan once after a
# round that is not counted: the GPU's clock drifts within a ranking (after a compile's
# pause an H100 runs the first replays faster), and timed one after the other the plan
# timed first gets the fast clock (Qwen3's naive layer's plan 0 read 3.05 ms timed first
# after the compiles, 3.36 a round later; RESULTS.md, session 44).
ROUNDS = 3


def alternated(fns: list[Callable[[], object]], rounds: int = ROUNDS) -> list[float]:
    """Milliseconds per call of each fn on the GPU, cold (`graph_timer`): the least of
    `rounds` rounds, each replaying every fn's graph in turn, so each sees the clock the
    others see. Where the graphs do not fit in memory together, each is captured and
    replayed alone, as before the alternation."""
    try:
        timers = [graph_timer(fn, cold=True) for fn in fns]
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return [graph_ms(fn, cold=True) for fn in fns]
    best = [math.inf] * len(timers)
    for round_ in range(rounds + 1):
        for i, replay in enumerate(timers):
            ms = replay()
            if round_:
                best[i] = min(best[i], ms)
    return best


def once_ms(fn) -> float:
    """Milliseconds of one call of fn, host launch included."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def graph_ms(fn, calls: int = 20, cold: bool = False) -> float:
    """Milliseconds per call of fn on the GPU: `calls` calls captured in one CUDA graph,
    the best of three replays (`graph_timer`). Cheap enough to run per shape (one small
    graph, unlike triton's do_bench_cudagraph)."""
    replay = graph_timer(fn, calls, cold)
    return min(replay() for _ in range(3))


def graph_timer(fn, calls: int = 20, cold: bool = False) -> Callable[[], float]:
    """`calls` calls of fn captured once in a CUDA graph; each call of the result replays
    them and returns the milliseconds per call. Warm, the L2 keeps what the previous
    call read. Cold, each call starts with the L2 flushed, as do_bench times a kernel
    and as a serving step finds its KV cache: a memset of twice the L2 before each call,
    its own time (the best of three replays of a graph of memsets) subtracted. Ranked
    warm, an MQA decode of 8 requests (34 MB of K/V, inside the H200's L2) put first a
    plan 4% slower cold than the one the cold ranking put first (RESULTS.md, session
    14). Two timers replayed in alternation compare two things under the same clock."""
    if not cold:
        return _captured(fn, calls)
    flush = _flush_buffer(torch.cuda.current_device())
    both = _captured(lambda: (flush.zero_(), fn()), calls)
    flush_only = _captured(flush.zero_, calls)
    flush_ms = min(flush_only() for _ in range(3))
    return lambda: max(both() - flush_ms, 1e-4)


_FLUSH: dict[int, torch.Tensor] = {}


def _flush_buffer(device: int) -> torch.Tensor:
    if device not in _FLUSH:
        size = 2 * torch.cuda.get_device_properties(device).L2_cache_size
        _FLUSH[device] = torch.empty(size // 4, dtype=torch.int32, device=f"cuda:{device}")
    return _FLUSH[device]


def _captured(fn, calls: int) -> Callable[[], float]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()

    def replay() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls
    return replay
