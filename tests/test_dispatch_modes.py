"""A compile on first call runs outside the caller's torch dispatch modes.

The search, its rule and candidate checks and the scheduler compute on tensors of their
own. Under torch.compile the first call runs inside AOTAutograd's custom-op aliasing mode
(torch 2.13), and a user may run code under a mode of their own (a FLOP counter, a
debugging mode): each of the compile's ~10^6 small torch ops went through that mode's
Python hook, which saw them as the program's (a cold compile of a dynamic MLP took 88 s
instead of 65)."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cleave


class OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_a_users_dispatch_mode_sees_the_call_and_not_the_compile(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))  # a cold compile: search, checks, schedule
    f = cleave.compile(lambda a, b: torch.softmax((a @ b) * 0.3, -1) + 1, verbose=False)
    a, b = torch.randn(5, 7), torch.randn(7, 9)
    with OpCount() as first:
        got = f(a, b)
    with OpCount() as later:
        f(a, b)
    torch.testing.assert_close(got, torch.softmax((a @ b) * 0.3, -1) + 1)
    assert f.stats["searches"] == 1, f.stats
    # the call's own ops (binding shapes, allocating the output, the launch): a few dozen
    assert first.ops < 4 * later.ops + 100, (first.ops, later.ops)
