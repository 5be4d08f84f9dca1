"""cleave's own torch work under torch's defaults, whatever the caller set around it.

Rule proofs, the reference interpreter, the candidate check, scheduling and tuning all
compute with torch. The caller's autocast (a MatMul recast to bf16) or default dtype
would change their numbers, and the rules' verdicts are cached on disk: one compile
under autocast once refused six library rules as unsound, in every later process.
The caller's state is the program's business, and the capture already holds it."""
from __future__ import annotations

import contextlib
import functools

import torch

_AUTOCAST_DEVICES = ("cpu", "cuda")


@contextlib.contextmanager
def torch_defaults():
    """Autocast off on every device and float32 as the default dtype, inside this block."""
    with contextlib.ExitStack() as stack:
        for device in _AUTOCAST_DEVICES:
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        dtype = torch.get_default_dtype()
        if dtype != torch.float32:
            torch.set_default_dtype(torch.float32)
            stack.callback(torch.set_default_dtype, dtype)
        yield


def under_torch_defaults(fn):
    """`fn` run inside torch_defaults()."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch_defaults():
            return fn(*args, **kwargs)
    return wrapper
