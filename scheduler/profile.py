"""Rank plans by measured time: triton.testing.do_bench medians on a GPU; on CPU (or
TRITON_INTERPRET=1) the cost model's order."""
from __future__ import annotations

import os

import torch

from .launch import launch
from .plan import Plan


def rank(plans: list[Plan], inputs: dict[str, torch.Tensor]) -> list[int]:
    """Indices of `plans`, fastest first."""
    if not plans:
        raise ValueError("profile: no plans to choose from")
    device = next(iter(inputs.values())).device
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" or len(plans) == 1:
        return list(range(len(plans)))
    from triton.testing import do_bench

    times = []
    for plan in plans:
        launch(plan, inputs)  # compile outside the timing
        # Short runs: a bucket is tuned once, while a request waits for it.
        times.append(do_bench(lambda p=plan: launch(p, inputs), warmup=5, rep=25, return_mode="median"))
    return sorted(range(len(plans)), key=times.__getitem__)


def profile(plans: list[Plan], inputs: dict[str, torch.Tensor]) -> Plan:
    """The fastest plan."""
    return plans[rank(plans, inputs)[0]]
