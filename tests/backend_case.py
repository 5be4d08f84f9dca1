"""Shared by the torch.compile backend's tests: a fresh dynamo and cleave context per
test, and the relative comparison against a reference."""
import pytest
import torch

from cleave.runtime import backend


@pytest.fixture
def ctx():
    torch._dynamo.reset()
    return backend.reset()


def close(got, want, tol=1e-5):
    assert got.shape == want.shape and got.dtype == want.dtype
    err = (got.double() - want.double()).abs().max().item() / max(want.double().abs().max().item(), 1e-30)
    assert err <= tol, f"max error {err:.2e} over max |reference|"


def grads_match_eager(y, m, x):
    """y, m(x) computed by a compiled m, backpropagates the input and parameter gradients
    eager m gives."""
    assert y.grad_fn is not None
    y.square().sum().backward()
    got = [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
    x.grad = None
    m.zero_grad()
    m(x).square().sum().backward()
    for g, w in zip(got, [x.grad] + [p.grad for p in m.parameters()]):
        close(g, w, 1e-4)
    m.zero_grad()
