"""Pick the fastest plan: triton.testing.do_bench medians on a GPU; on CPU (or
TRITON_INTERPRET=1) the cost model's first choice."""
from __future__ import annotations

import os

import torch

from .launch import launch
from .plan import Plan


def profile(plans: list[Plan], inputs: dict[str, torch.Tensor]) -> Plan:
    if not plans:
        raise ValueError("profile: no plans to choose from")
    device = next(iter(inputs.values())).device
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" or len(plans) == 1:
        return plans[0]
    from triton.testing import do_bench

    times = []
    for plan in plans:
        launch(plan, inputs)  # compile outside the timing
        times.append(do_bench(lambda p=plan: launch(p, inputs), return_mode="median"))
    return plans[min(range(len(plans)), key=times.__getitem__)]
