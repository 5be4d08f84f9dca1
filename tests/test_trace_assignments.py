"""The capture's trace runs fn once on fake tensors: a global or closure variable it
rebinds, and an attribute it sets on a tensor read outside the arguments (`W.grad`
from a `backward()` inside fn, `t.tag = ...`), were left holding a fake tensor, and
later calls made none of them (the model of a compiled forward-and-backward step never
trained). Each is put back after the trace and fn runs through dynamo, which makes them
at every call (runtime/bindings.py)."""
import os
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave

G = torch.zeros(3)
W = torch.ones(3, requires_grad=True)
T = torch.ones(3)


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))


def _real(t) -> bool:
    return type(t) is torch.Tensor


def test_a_global_rebound_by_fn_is_made_at_every_call():
    global G

    def f(x):
        global G
        G = G * 0.5 + x
        return G * 2

    G = torch.zeros(3)
    compiled = cleave.compile(f)
    outs = [compiled(torch.ones(3)) for _ in range(3)]
    assert [o.tolist() for o in outs] == [[2.0] * 3, [3.0] * 3, [3.5] * 3]
    assert _real(G) and G.tolist() == [1.75] * 3
    assert "assigns the global 'G'" in compiled.capture_error


def test_a_closure_variable_rebound_by_fn_is_made_at_every_call():
    acc = torch.zeros(3)

    def g(x):
        nonlocal acc
        acc = acc + x
        return acc * 1

    compiled = cleave.compile(g)
    assert [compiled(torch.ones(3)).tolist() for _ in range(2)] == [[1.0] * 3, [2.0] * 3]
    assert _real(acc) and acc.tolist() == [2.0] * 3


def test_backward_inside_fn_fills_the_grad_of_a_global_parameter():
    W.grad = None

    def f(x):
        (x * W).sum().backward()
        return x + 1

    compiled = cleave.compile(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for expected in (2.0, 4.0):
            assert compiled(torch.full((3,), 2.0)).tolist() == [3.0] * 3
            assert _real(W.grad) and W.grad.tolist() == [expected] * 3
    # the backward's lazy compile is torch's code, not graph breaks of f
    said = [str(w.message) for w in caught]
    assert not [m for m in said if "make_boxed_func" in m or "setattr" in m], said


def test_attributes_set_on_a_global_tensor_are_set_at_every_call():
    def f(x):
        T.tag = x * 3
        return x + 1

    compiled = cleave.compile(f)
    for value in (1.0, 2.0):
        compiled(torch.full((3,), value))
        assert _real(T.tag) and T.tag.tolist() == [3 * value] * 3
