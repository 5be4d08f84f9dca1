"""Remainders and rounding division (issue 12): fmod is an IR op (Triton's %, C's fmod on
floats and truncating on integers), remainder and floor division are torch's own
algorithms over it, so every result is exact, as eager computes it; an integer division
is C's (idiv, Triton's //), floored where the signs differ. A rounding division of bf16
or f16 runs eagerly with a warning that names it."""
import warnings

import pytest
import torch

import cleave


def _operands(dtype):
    gen = torch.Generator().manual_seed(7)
    if dtype.is_floating_point:
        a = torch.randn(37, 5, generator=gen) * 10
        b = torch.randn(37, 5, generator=gen) * 3
        a[0, :4] = torch.tensor([0.0, -0.0, 1e8, -7.5])  # signed zeros, a huge quotient, an exact multiple
        b[0, :4] = torch.tensor([2.0, 2.0, 0.3, 2.5])
        b[1, 0] = 0.0  # x / 0: inf or nan, as eager
        return a.to(dtype), b.to(dtype)
    a = torch.randint(-50, 50, (37, 5), generator=gen, dtype=dtype)
    b = torch.randint(1, 9, (37, 5), generator=gen, dtype=dtype)
    return a, b * torch.where(torch.rand(37, 5, generator=gen) < 0.5, -1, 1).to(dtype)


def _same(got, want):
    """Bit for bit, but for a NaN's sign."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = want.isnan() if want.dtype.is_floating_point else torch.zeros_like(want, dtype=torch.bool)
    assert torch.equal(got.isnan() if got.dtype.is_floating_point else nan, nan)
    assert torch.equal(got[~nan], want[~nan])
    if want.dtype.is_floating_point:
        assert torch.equal(torch.signbit(got[~nan]), torch.signbit(want[~nan]))  # -0.0 stays -0.0


PROGRAMS = {
    "fmod": lambda x, y: torch.fmod(x, y),
    "percent": lambda x, y: x % y,
    "remainder_of_a_scalar": lambda x, y: torch.remainder(x, 2.5) * y,
    "floor_divide": lambda x, y: x // y,
    "trunc_divide": lambda x, y: torch.div(x, y, rounding_mode="trunc"),
    # a page index as a user computes it, over the whole int64 range
    "page_of_a_scalar": lambda x, y: x // 64 + torch.div(x * 2**40, -y, rounding_mode="floor"),
}
CASES = [("fmod", torch.float32), ("fmod", torch.int32), ("percent", torch.float32), ("percent", torch.bfloat16),
         ("percent", torch.int32), ("remainder_of_a_scalar", torch.float32), ("floor_divide", torch.float32),
         ("trunc_divide", torch.float32), ("floor_divide", torch.int32), ("trunc_divide", torch.int32),
         ("page_of_a_scalar", torch.int64)]


@pytest.mark.parametrize("name,dtype", CASES)
def test_compiles_and_matches_eager_exactly(name, dtype):
    x, y = _operands(dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # no graph break, no fallback
        got = cleave.compile(PROGRAMS[name], verbose=False)(x, y)
    _same(got, PROGRAMS[name](x, y))


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_a_rounding_division_it_cannot_match_runs_eagerly_and_says_so(dtype):
    x, y = _operands(dtype)
    with pytest.warns(UserWarning, match="floor_divide"):
        got = cleave.compile(PROGRAMS["floor_divide"], verbose=False)(x, y)
    _same(got, PROGRAMS["floor_divide"](x, y))
