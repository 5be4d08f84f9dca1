"""A true division, atan2 or copysign of integer tensors computes in the float result
type, and torch converts the operands to it first: a number or 0-dim tensor beside an
integer tensor keeps its value there. It was wrapped into the tensor's type, as for the
ops torch computes in that type (`+`, `//`, a comparison): `counts_u8 / counts_u8.sum()`
at a sum of 256 divided by 0 and gave inf, `i8 / 300` divided by 44."""
from __future__ import annotations

import pytest
import torch

import cleave

from backend_case import ctx  # noqa: F401 (a fixture)

_U8 = torch.tensor([100, 100, 56], dtype=torch.uint8)
_I8 = torch.tensor([1, -1, 100], dtype=torch.int8)


@pytest.mark.parametrize("fn, x", [
    (lambda x: x / x.sum(), _U8),
    (lambda x: x.sum() / x, _U8),
    (lambda x: x / 300, _I8),
    (lambda x: torch.tensor(300) / x, _I8),
    (lambda x: torch.atan2(x, torch.tensor(300)), _I8),
    (lambda x: torch.copysign(x, -x.sum()), _U8),
], ids=["by-its-sum", "its-sum-by-it", "by-300", "300-by-it", "atan2", "copysign"])
def test_a_scalar_beside_a_narrow_integer_keeps_its_value(fn, x):
    torch.testing.assert_close(cleave.compile(fn)(x), fn(x))


def test_a_symbolic_int_divisor_keeps_its_value(ctx):
    f = torch.compile(lambda x, k: x / k, backend="cleave")
    for k in (3, 5, 256):  # dynamo makes k a SymInt at its second value
        torch.testing.assert_close(f(_U8, k), _U8 / k)
