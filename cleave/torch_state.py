"""cleave's own torch work under torch's defaults, whatever the caller set around it.

Rule proofs, the reference interpreter, the candidate check, scheduling and tuning all
compute with torch. The caller's autocast (a MatMul recast to bf16), default dtype,
default device or torch function and dispatch modes (a mode rounding every result to
bf16, one refusing float64) would change their numbers or fail them, and the rules'
verdicts are cached on disk: one compile under autocast, or under such a mode, once
refused library rules as unsound in every later process. The caller's state is the
program's business, and the capture already holds it. A first call from torch.compile
also runs inside AOTAutograd's custom-op aliasing mode (torch 2.13), which sent each
of the search's ~10^6 small torch ops through Python: a cold compile of a dynamic MLP
took 88 s instead of 65."""
from __future__ import annotations

import contextlib
import functools

import torch
from torch import overrides
from torch.utils._python_dispatch import _disable_current_modes

AUTOCAST_DEVICES = ("cpu", "cuda")  # the device types whose autocast state a call's key holds


@contextlib.contextmanager
def torch_defaults():
    """Inside this block: autocast off on every device, float32 the default dtype, and no
    torch function mode (the default device, `with torch.device(...)`, is one) nor
    dispatch mode of the caller's."""
    with contextlib.ExitStack() as stack:
        for device in AUTOCAST_DEVICES:
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        dtype = torch.get_default_dtype()
        if dtype != torch.float32:
            torch.set_default_dtype(torch.float32)
            stack.callback(torch.set_default_dtype, dtype)
        for _ in range(len(overrides._get_current_function_mode_stack())):
            stack.enter_context(overrides._pop_mode_temporarily())
        stack.enter_context(_disable_current_modes())
        yield


def under_torch_defaults(fn):
    """`fn` run inside torch_defaults()."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch_defaults():
            return fn(*args, **kwargs)
    return wrapper
