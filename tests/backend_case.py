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
