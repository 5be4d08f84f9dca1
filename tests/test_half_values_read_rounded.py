"""A comparison, a cast to an integer and a floor or round of bf16 or f16 values read
them as their type holds them. A kernel computes a half MatMul in its f32 accumulator,
while a value cast back to the half type (a row max reduced in f32) is rounded: the
argmax of a bf16 MatMul compared the unrounded scores with their rounded maximum, found
no maximum in any row and returned the axis's length (48 of 48) for every row, and its
cast to int32 was one off where the bf16 product was a whole number (65.0 from 64.92)."""
from __future__ import annotations

import pytest
import torch

import cleave

from backend_case import ctx  # noqa: F401 (a fixture)


def _argmax(x, w):
    return (x @ w.t()).argmax(-1)


def _is_row_max(x, w):
    y = x @ w.t()
    return (y == y.amax(-1, keepdim=True)).sum(-1)


def _chain_at_max(x, z):
    y = x * 3.1 + z
    return y == y.amax(-1, keepdim=True), y.argmin(-1)


def _to_int(x, w):
    return (x @ w.t()).to(torch.int32)


def _floor(x, w):
    return (x @ w.t()).floor()


def _round(x, w):
    return (x @ w.t()).round()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [_argmax, _is_row_max, _to_int, _floor, _round])
def test_a_half_matmul_read_rounded(fn, dtype):
    f = cleave.compile(fn)
    for seed in range(2):
        torch.manual_seed(seed)
        x, w = torch.randn(5, 32, dtype=dtype) * 3, torch.randn(48, 32, dtype=dtype) * 3
        assert torch.equal(f(x, w), fn(x, w))


def test_a_half_chain_compared_with_its_row_max_under_dynamic_shapes(ctx):
    f = torch.compile(_chain_at_max, backend="cleave", dynamic=True)
    for n in (37, 19):
        torch.manual_seed(n)
        x, z = torch.randn(3, n, dtype=torch.bfloat16), torch.randn(3, n, dtype=torch.bfloat16)
        for got, want in zip(f(x, z), _chain_at_max(x, z)):
            assert torch.equal(got, want), (n, got, want)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st
