"""torch.prod (issue 12): a `reduce` with op prod, multiplied in f32 in the kernels (a
bf16 product accumulated in f32 is closer to fp64 than eager's bf16 one); an integer
product runs eagerly with a warning (f32 is exact below 2**24 only)."""
import warnings

import pytest
import torch

import cleave
from kernel_check import tolerance


def _x():
    gen = torch.Generator().manual_seed(11)
    x = torch.rand(37, 19, generator=gen) + 0.5
    x[3, 4], x[5, 6] = 0.0, -2.0  # a zero and a sign in the products
    return x


PROGRAMS = {
    "over_a_dim": lambda x: torch.prod(x, 1),
    "over_everything": lambda x: torch.prod(x[:, :7]),
    "kept_and_divided": lambda x: x / torch.prod(x, 0, keepdim=True),  # inf and nan where a column holds 0
    "of_a_broadcast": lambda x: torch.prod(x[:, :1].expand(37, 5), 1),  # constant along its axis: x ** 5
    "in_bf16": lambda x: torch.prod(x.bfloat16(), 1),
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_matches_the_fp64_product(name):
    x = _x()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # no graph break, no fallback
        got = cleave.compile(PROGRAMS[name], verbose=False)(x)
    # fp64 products of the same operands (the bf16 program's are its bf16 values)
    want = torch.prod(x.bfloat16().double(), 1) if name == "in_bf16" else PROGRAMS[name](x.double())
    assert got.dtype == PROGRAMS[name](x).dtype
    finite = want.isfinite()
    assert torch.equal(got.isfinite(), finite) and torch.equal(got.isnan(), want.isnan())
    err = ((got.double() - want)[finite].abs() / want[finite].abs().clamp_min(1e-30)).max().item()
    assert err <= tolerance(got.dtype), err


def test_an_integer_product_runs_eagerly_and_says_so():
    x = (_x() * 3).int()
    with pytest.warns(UserWarning, match="prod"):
        got = cleave.compile(lambda x: torch.prod(x, 1), verbose=False)(x)
    assert torch.equal(got, torch.prod(x, 1))
