"""Kernel-wise tuning across plans that cut the graph the same way.

The scheduler's plans of one binding share a partition: the same kernels, reading and
writing the same buffers, each kernel with its own ranked options (tiles, warps,
stages); plan r takes every kernel's r-th option (`scheduler.api._schedule_at`).
Timing whole plans therefore compares rank-wise zips only, while which option of a
kernel is fastest is a question per kernel (the cost model's order of a d = 64
attention's row tiles can be wrong while its GEMMs' is right). `fastest_kernels`
starts from the fastest whole plan and, one kernel at a time, swaps in each other
option of that kernel, keeping a swap when the whole plan gets faster: one timing per
distinct option, not one per combination. The result is a list of plan indices, one
per kernel, that `compose` turns back into a plan; it is saved with the bucket's
ranking so that later processes compose without timing."""
from __future__ import annotations

import json
import os
from typing import Callable

import torch

from ..scheduler.plan import Plan
from .launch import launch
from .profile import graph_ms

# A swap is kept when the whole plan gets at least this much faster: below it a
# replay's noise (a few tenths of a percent) would decide.
MIN_GAIN = 0.005


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


def compose(plans: list[Plan], picks: list[int]) -> Plan:
    """The plan whose kernel i is kernel i of plans[picks[i]] (plans sharing a partition).
    Its tiles are the picked kernels' own; its cost is the first pick's (the model does
    not cost a mix)."""
    first = plans[picks[0]]
    if len(picks) != len(first.kernels) or any(partition_key(plans[p]) != partition_key(first) for p in picks):
        raise ValueError("mix: the picked plans do not share one partition")
    kernels = [plans[p].kernels[i] for i, p in enumerate(picks)]
    tiles = {name: block for i, p in enumerate(picks) for name, block in plans[p].tiles.items()
             if name.startswith(f"{first.kernels[i].name}.")}
    return Plan(first.graph, kernels, first.inputs, first.outputs, first.intermediates, dict(first.split), tiles,
                first.cost, list(first.dynamic), dict(first.env), list(first.requires))


def fastest_kernels(plans: list[Plan], ranking: list[int], inputs: dict[str, torch.Tensor],
                    time: Callable[[Plan], float] | None = None) -> list[int] | None:
    """Per kernel of plans[ranking[0]] (the fastest whole plan), the index of the plan
    whose option of that kernel made the whole plan fastest, or None when no swap pays
    (or nothing can be timed: off the GPU, under the interpreter, one plan). `time`
    measures a plan in ms (default: CUDA-graph replays on `inputs`)."""
    if time is None:
        device = next(iter(inputs.values())).device
        if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
            return None
        time = lambda plan: graph_ms(lambda: launch(plan, inputs))  # noqa: E731
    first = ranking[0]
    key = partition_key(plans[first])
    group = [i for i in ranking[1:] if partition_key(plans[i]) == key]
    if not group:
        return None
    picks = [first] * len(plans[first].kernels)
    best = time(compose(plans, picks))
    for slot in range(len(picks)):
        tried = {_option(plans[first].kernels[slot])}
        for i in group:
            option = _option(plans[i].kernels[slot])
            if option in tried:
                continue
            tried.add(option)
            trial = picks[:slot] + [i] + picks[slot + 1:]
            ms = time(compose(plans, trial))
            if ms < best * (1 - MIN_GAIN):
                best, picks = ms, trial
    return None if all(p == first for p in picks) else picks
