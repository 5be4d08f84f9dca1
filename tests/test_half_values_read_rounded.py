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


def _to_int_through_f32(x, w):
    return (x @ w.t()).float().to(torch.int32)


def _floor(x, w):
    return (x @ w.t()).floor()


def _round(x, w):
    return (x @ w.t()).round()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [_argmax, _is_row_max, _to_int, _to_int_through_f32, _floor, _round])
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


def test_fmod_of_a_bf16_product_reads_it_rounded():
    """27 + 0.984375 is 28 in bf16, a multiple of 4: fmod read 27.98 and gave 3.98, of
    the product and of the elementwise sum (which the search computes in f32)."""
    def f(x, w):
        return torch.fmod(x @ w.t(), 4.0), torch.remainder(x @ w.t(), 4.0), torch.fmod(x[:, :1] + x[:, 1:], 4.0)

    x, w = torch.tensor([[27.0, 0.984375]], dtype=torch.bfloat16), torch.ones(1, 2, dtype=torch.bfloat16)
    for got, want in zip(cleave.compile(f)(x, w), f(x, w)):
        assert torch.equal(got, want), (got, want)


def test_nan_to_num_of_an_overflowing_f16_value_replaces_its_inf():
    """torch's nan_to_num widens its operand to f32 before its `== inf` tests: the f16
    product 1e5, held in f32, was finite there, and stored as inf."""
    def f(x):
        return torch.nan_to_num(x * 100, posinf=1.0, neginf=-1.0), torch.nan_to_num(x * 100)

    x = torch.tensor([[1000.0, -1000.0, 1.0]], dtype=torch.float16)
    for got, want in zip(cleave.compile(f)(x), f(x)):
        assert torch.equal(got, want), (got, want)
