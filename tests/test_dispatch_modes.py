"""A compile on first call runs outside the caller's torch dispatch modes.

The search, its rule and candidate checks and the scheduler compute on tensors of their
own. Under torch.compile the first call runs inside AOTAutograd's custom-op aliasing mode
(torch 2.13), and a user may run code under a mode of their own (a FLOP counter, a
debugging mode): each of the compile's ~10^6 small torch ops went through that mode's
Python hook, which saw them as the program's (a cold compile of a dynamic MLP took 88 s
instead of 65)."""
import warnings

import torch
from torch.overrides import TorchFunctionMode
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


class RoundsToBf16(TorchFunctionMode):
    """A numerics-debugging mode: every f32 result rounded to bf16, its dtype kept."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype == torch.float32:
            with torch._C.DisableTorchFunction():
                out = out.to(torch.bfloat16).to(torch.float32)
        return out


def test_rules_prove_under_a_users_function_mode():
    """Under such a mode the numeric gate found library rules unsound, and the verdicts
    were cached on disk: every later compile, in any process, ran eagerly."""
    from cleave.rules import all_rules
    from cleave.verify.check import check_rule

    rule = next(r for r in all_rules() if r.name == "div-div-cancel")
    with RoundsToBf16():
        verdict = check_rule(rule, use_cache=False)
    assert verdict.verdict == "proven", verdict.explain()


def test_a_first_call_under_a_default_device_compiles(monkeypatch, tmp_path):
    """Under `with torch.device("meta")` the compile's own tensors were meta ("Tensor.item()
    cannot be called on meta tensors"): the build failed, and that shape ran eagerly for
    the rest of the process."""
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    f = cleave.compile(lambda x, w: torch.softmax(x @ w, -1), verbose=False)
    x, w = torch.randn(5, 7), torch.randn(7, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.device("meta"):
            got = f(x, w)
    torch.testing.assert_close(got, torch.softmax(x @ w, -1))
    assert f.stats["failed"] == 0 and f.stats["compiles"] == 1, f.stats
