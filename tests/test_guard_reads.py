"""cleave.compile against eager where what the function reads is not a global, a cell or
its module's state: attributes read off a plain object's bound method, a class, a
classmethod's cls, the function itself or a functools.partial, and a forward replaced
on its module's class (guarded: a change recaptures), calls whose result changes from call to call (random, NumPy's random,
os.environ, the clock) and calls made for their effect through a call or an item
(`logging.getLogger(n).warning(...)`, `open(p, "a").write(...)`, `CALLBACKS[0]()`), which
send the function through dynamo, whose graphs make them at every call. Each kept the
first capture's value, or made its effect once; common model code is still captured
whole."""
from __future__ import annotations

import functools
import logging
import math
import os
import random
import time

import numpy as np
import pytest
import torch
from torch import nn

import cleave


def _close(got, want):
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _follows(fn, x, *changes):
    """cleave.compile(fn), compared with fn at x first and after each change; returns it."""
    f = cleave.compile(fn, verbose=False)
    _close(f(x), fn(x))
    for change in changes:
        change()
        _close(f(x), fn(x))
    return f


# -- attributes read off objects other than modules ------------------------------------
class _Scaler:
    def __init__(self):
        self.s = 2.0

    def scale(self, a):
        return a * self.s


class _Pipeline:
    """A typical wrapper around a model: a reloaded model is swapped in."""

    def __init__(self):
        self.net = nn.Linear(8, 3)

    def run(self, a):
        return self.net(a).softmax(-1)


class _Shifted:
    """A callable object whose helper method reads its attributes, and a class attribute
    an instance entry may later hide."""
    shift = 1.0

    def __init__(self):
        self.s = 2.0

    def _scaled(self, a):
        return a * self.s

    def __call__(self, a):
        return self._scaled(a) + self.shift


class _Constants:
    k = 2.0

    @staticmethod
    def static(a):
        return a * _Constants.k

    @classmethod
    def through_cls(cls, a):
        return a * cls.k


def _scaled_by_own_attribute(a):
    return a * _scaled_by_own_attribute.scale


_scaled_by_own_attribute.scale = 2.0


def _weighted(w, a, s=1.0):
    return a * w * s


def test_a_bound_methods_object_attribute_is_guarded():
    k = _Scaler()
    f = _follows(k.scale, torch.randn(5, 8), lambda: setattr(k, "s", 4.0))
    assert f.stats["recaptures"] == 1 and f.capture_error is None


def test_a_bound_methods_model_swapped_is_followed():
    torch.manual_seed(0)
    p = _Pipeline()
    with torch.no_grad():
        _follows(p.run, torch.randn(5, 8), lambda: setattr(p, "net", nn.Linear(8, 3)),
                 lambda: p.net.weight.mul_(3))


@pytest.mark.parametrize("change", [
    lambda c, monkeypatch: setattr(c, "s", 4.0),  # read in a helper method
    lambda c, monkeypatch: monkeypatch.setattr(_Shifted, "shift", 3.0),  # a class attribute
    lambda c, monkeypatch: setattr(c, "shift", -1.0),  # an instance entry hiding the class's
])
def test_a_callable_objects_helper_method_and_class_attributes_are_guarded(change, monkeypatch):
    c = _Shifted()
    f = _follows(c, torch.randn(5, 8), lambda: change(c, monkeypatch))
    assert f.stats["recaptures"] == 1 and f.capture_error is None


@pytest.mark.parametrize("fn", [_Constants.static, _Constants.through_cls])
def test_class_attributes_read_through_a_global_class_or_cls_are_guarded(fn, monkeypatch):
    f = _follows(fn, torch.randn(5, 8), lambda: monkeypatch.setattr(_Constants, "k", 5.0))
    assert f.stats["recaptures"] == 1


def test_a_functions_own_attribute_is_guarded(monkeypatch):
    _follows(_scaled_by_own_attribute, torch.randn(5, 8),
             lambda: monkeypatch.setattr(_scaled_by_own_attribute, "scale", 3.0))


def test_a_partials_bound_arguments_are_guarded():
    p = functools.partial(_weighted, torch.ones(8), s=2.0)
    _follows(p, torch.randn(5, 8), lambda: p.keywords.__setitem__("s", 7.0), lambda: p.args[0].mul_(2))


class _Doubles(nn.Module):
    def forward(self, a):
        return a * 2


def test_a_forward_replaced_on_its_class_is_followed(monkeypatch):
    m = _Doubles()
    _follows(m, torch.randn(5, 8), lambda: monkeypatch.setattr(_Doubles, "forward", lambda self, a: a * 3))


# -- calls whose result changes from call to call --------------------------------------
def _jittered(a):
    return a * random.uniform(0.5, 1.5)


def _jittered_by_numpy(a):
    return a * float(np.random.rand())


def _scaled_by_environment(a):
    return a * float(os.environ.get("CLEAVE_TEST_SCALE", "1"))


def _scaled_by_environment_item(a):
    return a * float(os.environ["CLEAVE_TEST_SCALE"])


_STARTED = time.monotonic()


def _stamped(a):
    return a * 0 + (time.monotonic() - _STARTED)  # seconds since the import: float32 tells 50 ms apart


@pytest.mark.parametrize("fn, name", [(_jittered, "random.uniform"), (_jittered_by_numpy, "np.random.rand")])
def test_python_random_numbers_are_drawn_at_every_call(fn, name):
    x = torch.ones(2, 3)
    f = cleave.compile(fn, verbose=False)
    factors = {f(x)[0, 0].item() for _ in range(4)}
    assert len(factors) > 1 and all(0 <= v <= 1.5 for v in factors)
    assert name in f.capture_error


@pytest.mark.parametrize("fn, name", [(_scaled_by_environment, "os.environ.get"),
                                      (_scaled_by_environment_item, "os.environ[...]")])
def test_environment_variables_are_read_at_every_call(fn, name, monkeypatch):
    monkeypatch.setenv("CLEAVE_TEST_SCALE", "2")
    f = _follows(fn, torch.randn(2, 3), lambda: monkeypatch.setenv("CLEAVE_TEST_SCALE", "5"))
    assert name in f.capture_error


@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace")  # dynamo's graph break: torch's warning
def test_the_clock_is_read_at_every_call():
    f = cleave.compile(_stamped, verbose=False)
    x = torch.ones(3)
    first = f(x)[0].item()
    time.sleep(0.05)
    assert f(x)[0].item() != first
    assert "time.monotonic" in f.capture_error


# -- effects made through a call or an item --------------------------------------------
class _Counted(logging.Handler):
    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        self.count += 1


EFFECTS = {"n": 0}
EFFECTS_FILE = "effects.txt"


def _bump():
    EFFECTS["n"] += 1


CALLBACKS = [_bump]


def _logs_through_get_logger(a):
    logging.getLogger("cleave_test_guard_reads").warning("step")
    return a + 1


def _calls_back(a):
    CALLBACKS[0]()
    return a * 2


def _writes(a):
    open(EFFECTS_FILE, "a").write("step\n")
    return a - 1


@pytest.fixture
def effects(tmp_path, monkeypatch):
    """The effects made so far, by kind: log records, callbacks, lines written."""
    log = logging.getLogger("cleave_test_guard_reads")
    handler = _Counted()
    log.addHandler(handler)
    monkeypatch.setitem(globals(), "EFFECTS_FILE", str(tmp_path / "effects.txt"))
    monkeypatch.setitem(EFFECTS, "n", 0)
    yield {"log": lambda: handler.count, "callback": lambda: EFFECTS["n"],
           "file": lambda: (tmp_path / "effects.txt").read_text().count("step")}
    log.removeHandler(handler)


@pytest.mark.parametrize("fn, kind, named", [(_logs_through_get_logger, "log", "logging.getLogger"),
                                             (_calls_back, "callback", "EFFECTS"),
                                             (_writes, "file", "open")])
def test_effects_through_a_call_or_an_item_are_made_at_every_call(fn, kind, named, effects):
    x = torch.randn(5, 7)
    f = cleave.compile(fn, verbose=False)
    for _ in range(3):
        _close(f(x), fn(x))
    assert effects[kind]() == 6  # three compiled calls and three eager ones
    assert named in f.capture_error


# -- common model code is still captured whole -----------------------------------------
class _Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.layers = nn.ModuleList([nn.Linear(d, d) for _ in range(2)])
        self.act = nn.GELU()

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm(self.lin(x)) / math.sqrt(d)
        for i in range(len(self.layers)):
            h = self.layers[i](h)
        h = self.act(h).reshape(b * t, -1).view(b, t, d)
        n = max(int(h.shape[-1] // 2), 1)
        scale = float(min(t, 3)) if isinstance(x, torch.Tensor) else 1.0
        return h[..., :n].sum(-1) * scale + abs(-0.5)


def test_a_typical_module_forward_is_still_captured_whole():
    torch.manual_seed(0)
    m = _Block().eval()
    f = cleave.compile(m, verbose=False)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        _close(f(x), m(x))
        _close(f(x), m(x))
    assert f.capture_error is None and f.stats["recaptures"] == 0
