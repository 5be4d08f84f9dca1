"""Kernel-wise tuning across plans that cut the graph the same way.

The scheduler's plans of one binding share a partition: the same kernels, reading and
writing the same buffers, each kernel with its own ranked options (tiles, warps,
stages); plan r takes every kernel's r-th option (`scheduler.api._schedule_at`).
Timing whole plans therefore compares rank-wise zips only, while which option of a
kernel is fastest is a question per kernel (the cost model's order of a d = 64
attention's row tiles can be wrong while its GEMMs' is right). `fastest_kernels`
starts from the fastest whole plan and, one kernel at a time, swaps in each other
option of that kernel, keeping a swap when the whole plan gets faster: one timing per
distinct option, not one per combination. Each kernel's launch configuration is tuned
the same way: the picked option with the other warp count, and around a loop with one
pipeline stage fewer or more (the model cannot rank them well: the paged decode's
kernel ran 14% faster with 4 warps and 3 stages than with the 8 and 4 it ranked first).
The fastest plan of each of the first two partitions is tuned so (a partition whose
kernels gain more from it may overtake). The result is one pick per kernel, a plan
index or [plan index, warps, stages], all of one partition, that `compose` turns back
into a plan; it is saved with the bucket's ranking so that later processes compose
without timing.

Every swap is decided by replaying the kernel's option as it stands and the
challenger in alternation (`_faster`), never against a time taken earlier: the H200's
clock drifts by several percent within a tuning (the same Llama layer plan read 1.37
and 1.44 ms two timings apart), more than many swaps gain. Each replays the kernel
alone (`launch.one_kernel`, on buffers a whole call filled), not the whole plan: a
layer's replays resolve 1-2% of the layer, and one kernel's options differ by 20-45%
of that kernel, so whole-plan replays kept Qwen3's attention at 0.305 ms beside an
option of 0.221 and took false swaps on the clock's dips (RESULTS.md, sessions 18-19).
Partitions are compared by replaying their whole tuned plans, and a mix against the
plan its tuning started from: the plan is kept where it replays faster as a whole."""
from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from time import perf_counter
from typing import Callable, Union

import torch
from triton import knobs

from .. import progress
from ..scheduler.plan import Plan
from .launch import SharedMemoryWarning, launch, one_kernel, prepare
from .profile import graph_timer

# A swap is kept when the kernel (a partition: the whole plan) gets at least this much
# faster: below it a replay's noise (a few tenths of a percent) would decide.
MIN_GAIN = 0.005
# Two plans are compared over this many blocks of replays in the order A B B A: a clock
# drifting steadily adds the same to both sums. A challenger this much slower after the
# first block is not replayed again.
BLOCKS = 2
SCREEN = 0.03
# Before those blocks both are replayed in turn for this long (and twice at least): after
# the pause of a compile and a capture the H200 runs the first ~0.1 s of replays ~10%
# faster, then settles (a Llama layer's replays read 1.35, 1.40, 1.40, then 1.49-1.51 ms),
# and a step inside the blocks favours whichever plan ran before it.
WARMUP_S = 0.3
WARPS = (4, 8)
MAX_STAGES = 4

# A kernel's pick: the plan whose option it takes, or that and a launch configuration.
Pick = Union[int, list]


def partition_key(plan: Plan) -> tuple:
    """What plans must share for their kernels to be interchangeable: the graph, the
    static symbols' values (kernels specialise on them) and which are dynamic, the
    split counts, each kernel's name and arguments, and every buffer's shape and dtype."""
    buffers = plan.inputs + plan.outputs + plan.intermediates
    static = tuple(sorted((k, v) for k, v in plan.env.items() if k not in plan.dynamic))
    return (plan.graph, static, tuple(sorted(plan.dynamic)), tuple(sorted(plan.split.items())),
            tuple((k.name, tuple(k.args)) for k in plan.kernels),
            tuple((b.name, tuple(b.shape), b.dtype) for b in buffers))


def _option(kernel) -> str:
    """A kernel option's identity: everything launch reads from it."""
    return json.dumps({k: v for k, v in kernel.to_json().items() if k != "loops"}, sort_keys=True)


def _index(pick: Pick) -> int:
    return pick if isinstance(pick, int) else pick[0]


def _kernel(plans: list[Plan], slot: int, pick: Pick):
    kernel = plans[_index(pick)].kernels[slot]
    if isinstance(pick, int):
        return kernel
    _, warps, stages = pick
    return dataclasses.replace(kernel, num_warps=warps, num_stages=stages)


def picks_key(picks: list[Pick]) -> tuple:
    """Picks as a dict key."""
    return tuple(p if isinstance(p, int) else tuple(p) for p in picks)


def launch_variants(kernel) -> list[tuple[int, int]]:
    """The launch configurations tried beside a kernel's own: the other warp count, and
    for a kernel with a loop the stage counts next to its own (among its
    `stage_choices` where it has them) at either warp count. The diagonal is needed:
    the paged GQA prefill's attention, ranked at 4 warps and 3 stages by a cost-model
    variant, ran 0.403 ms at its best neighbour (4 warps, 2 stages) and 0.294 at 8 warps
    and 2 stages on the H200 (RESULTS.md session 26)."""
    if kernel.dialect == "gluon":  # one configuration, the one its output was checked at
        return []
    stages = [kernel.num_stages]
    if kernel.loops:
        choices = sorted(set(kernel.stage_choices or range(1, MAX_STAGES + 1)) | {kernel.num_stages})
        at = choices.index(kernel.num_stages)
        stages = choices[max(at - 1, 0):at + 2]
    found = [(w, s) for w in [kernel.num_warps] + [w for w in WARPS if w != kernel.num_warps] for s in stages
             if (w, s) != (kernel.num_warps, kernel.num_stages)]
    return [(w, s) for w, s in found if kernel.launches(w, s)]


def compose(plans: list[Plan], picks: list[Pick]) -> Plan:
    """The plan whose kernel i is kernel i of plans[picks[i]] (plans sharing a partition),
    launched with the pick's warps and stages where it names them. Its tiles are the
    picked kernels' own; its cost is the first pick's (the model does not cost a mix)."""
    first = plans[_index(picks[0])]
    if len(picks) != len(first.kernels) or any(partition_key(plans[_index(p)]) != partition_key(first)
                                               for p in picks):
        raise ValueError("mix: the picked plans do not share one partition")
    kernels = [_kernel(plans, i, p) for i, p in enumerate(picks)]
    tiles = {name: block for i, p in enumerate(picks) for name, block in plans[_index(p)].tiles.items()
             if name.startswith(f"{first.kernels[i].name}.")}
    return Plan(first.graph, kernels, first.inputs, first.outputs, first.intermediates, dict(first.split), tiles,
                first.cost, list(first.dynamic), dict(first.env), list(first.requires))


# Partitions whose fastest plan is tuned: a partition tuned may overtake a faster one
# untuned (the MLA paged decode's two-kernel split at 4 warps, 0.156 ms, against the
# fastest plan as ranked, one kernel running its combine, 0.19; H200, session 13).
PARTITIONS_TUNED = 2


def fastest_kernels(plans: list[Plan], ranking: list[int], inputs: dict[str, torch.Tensor],
                    time: Callable[[Plan], Callable[[], float]] | None = None) -> list[Pick] | None:
    """Per kernel of the fastest tuned plan, the option (and launch configuration) that
    made it fastest, or None when nothing beats plans[ranking[0]] as it is (or nothing
    can be timed: off the GPU, under the interpreter). The fastest plan of each of the
    first PARTITIONS_TUNED partitions in `ranking` is tuned, and the picks all come
    from one partition. `time(plan, slot)` prepares a timing of the plan's kernel
    `slot` alone (slot None: the whole plan) and returns what replays it, each call
    giving ms (default: a CUDA graph of its calls on `inputs`, the L2 flushed before
    each call: profile.graph_timer)."""
    if time is None:
        device = next(iter(inputs.values())).device
        if device.type != "cuda" or knobs.runtime.interpret:
            return None

        def time(plan: Plan, slot: int | None = None) -> Callable[[], float]:
            call = (lambda: launch(plan, inputs)) if slot is None else one_kernel(plan, inputs, slot)
            return graph_timer(call, cold=True)
    firsts, keys = [], []
    for i in ranking:
        key = partition_key(plans[i])
        if key not in keys and len(firsts) < PARTITIONS_TUNED:
            keys.append(key)
            firsts.append(i)
    picks = current = None
    for first, key in zip(firsts, keys):
        tuned, replay = _tuned(plans, first, [i for i in ranking if i != first and partition_key(plans[i]) == key],
                               inputs, time)
        if picks is None or _faster(current, replay, None):
            picks, current = tuned, replay
    return None if all(p == ranking[0] for p in picks) else picks


def _tuned(plans: list[Plan], first: int, group: list[int], inputs, time) -> tuple[list[Pick], Callable]:
    """Starting from plans[first], each kernel's fastest option among the plans of
    `group` (its partition) and launch configurations, timed alone, one kernel at a
    time: the picks, and the replay of the whole plan they compose."""
    picks: list[Pick] = [first] * len(plans[first].kernels)
    for slot in range(len(picks)):
        tried = {_option(plans[first].kernels[slot])}
        current = time(compose(plans, picks), slot)

        def attempt(pick: Pick) -> None:
            nonlocal picks, current
            option = _option(_kernel(plans, slot, pick))
            if option in tried:
                return
            tried.add(option)
            trial = picks[:slot] + [pick] + picks[slot + 1:]
            replay = _timer(time, compose(plans, trial), slot, inputs)
            if _faster(current, replay, slot):
                picks, current = trial, replay

        for i in group:
            attempt(i)
        index = _index(picks[slot])
        for warps, stages in launch_variants(_kernel(plans, slot, picks[slot])):
            attempt([index, warps, stages])
        # a layer's tuning takes tens of seconds: say where it is
        progress.report(f"[cleave tune] kernel {slot + 1}/{len(picks)} ({plans[first].kernels[slot].name}): "
                        f"{len(tried)} options compared, picked {picks[slot]}")
    replay = time(compose(plans, picks))
    if picks != [first] * len(picks):
        # Each swap won with its kernel timed alone; the whole mix can still lose to the
        # plan it started from (Qwen3's naive layer: 3.29 ms served against plan 0's
        # 3.13, its attention faster alone than behind the projections, session 42; a
        # mix that no replay told apart from plan 0 ran 4% slower a call, session 43).
        # The mix is served only where it replays faster than the plan as a whole, in
        # every block (by any margin: a swap winning on a kernel a tenth of the plan
        # gains under MIN_GAIN of the plan).
        whole = time(plans[first])
        if not _faster(whole, replay, None, min_gain=0.0):
            progress.report(f"[cleave tune] the mix {picks} replays no faster than plan {first} as a whole: "
                            f"plan {first}")
            return [first] * len(picks), whole
    return picks, replay


_log = logging.getLogger("cleave.tune")


def _faster(a: Callable[[], float], b: Callable[[], float] | None, slot: int | None,
            min_gain: float = MIN_GAIN) -> bool:
    """Whether replay `b` (the challenger; None where it cannot run as configured,
    `_timer`) runs at least `min_gain` faster than replay `a` in each of BLOCKS blocks of
    a, b, b, a, after replaying both for WARMUP_S. A challenger SCREEN slower after the
    first block is not replayed again."""
    if b is None:
        _log.debug("slot %s: cannot run", slot)
        return False
    pairs, start = 0, perf_counter()
    while pairs < 2 or perf_counter() - start < WARMUP_S:
        a(), b()
        pairs += 1
    ta, tb = [], []
    for block in range(BLOCKS):
        ta.append(a())
        tb += [b(), b()]
        ta.append(a())
        if sum(tb) >= sum(ta) * (1 + SCREEN):
            break
    _log.debug("slot %s: %s against %s ms", slot, ", ".join(f"{t:.4f}" for t in ta),
               ", ".join(f"{t:.4f}" for t in tb))
    # Every block must show the gain on its own: a replay the clock dips in (+10% on the
    # H200, one in a block) weighs on one block's sums, and swayed a total over both
    # (Qwen3's k/v projection took an option 45% slower, 0.134 ms against 0.092).
    return len(tb) == 2 * BLOCKS and all(sum(tb[2 * k:2 * k + 2]) < sum(ta[2 * k:2 * k + 2]) * (1 - min_gain)
                                         for k in range(BLOCKS))


def _timer(time, plan: Plan, slot: int | None, inputs):
    """time(plan), or None where the plan cannot run as configured: it fails to compile
    or launch, or the GPU's shared memory holds fewer stages than kernel `slot` asks for
    (the launch would run it with fewer, which is another option)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SharedMemoryWarning)
        try:
            replay = time(plan, slot)
        except Exception:  # noqa: BLE001 - an option that does not run is no option
            return None
    if inputs and slot is not None:
        options = prepare(plan, inputs).kernels[slot][3]
        if options.get("num_stages", 1) < plan.kernels[slot].num_stages:
            return None
    return replay
