"""Global module hooks registered after cleave.compile run on its dynamo path too.

torch.compile guards no global module hook (`register_module_forward_hook`): a frame
traced before one was registered kept skipping it. A function that runs through
dynamo's graphs (one taking a Python number, or a module once hooked) returned the
hook-less output, silently. The frames are traced again when the global hooks change."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
from torch import nn

import cleave


def test_a_global_hook_registered_later_runs():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(3, 4), nn.ReLU())

    def scaled(x, k):  # a Python number: the function runs through dynamo's graphs
        return block(x) * k

    compiled = cleave.compile(scaled)
    x = torch.randn(5, 3)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, 2), scaled(x, 2))
        handle = nn.modules.module.register_module_forward_hook(
            lambda mod, inputs, out: out + 1 if isinstance(mod, nn.ReLU) else None)
        try:
            torch.testing.assert_close(compiled(x, 2), scaled(x, 2))
        finally:
            handle.remove()
        torch.testing.assert_close(compiled(x, 2), scaled(x, 2))  # and stops running once removed
