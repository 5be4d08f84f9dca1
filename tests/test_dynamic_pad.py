"""F.pad by amounts computed from a dynamic extent: a width known to be >= 0 (padding
up to a multiple, (-n) % 4) concatenates a block that may be empty on a call; one
known to be <= 0 crops. A width of unknown sign runs eagerly with a warning that
names it, never a traceback."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest
import torch
import torch.nn.functional as F

import cleave
from kernel_check import assert_one_exact_compile


def to_multiple_of_4(x):
    return F.pad(x, (0, (-x.shape[-1]) % 4), value=-1.0) * 2.0


def to_even(x):
    return F.pad(x, (0, -(x.shape[-1] % 2))) + 1.0


def to_six(x):
    return F.pad(x, (0, 6 - x.shape[-1])) * 2.0


@pytest.mark.parametrize("fn", [to_multiple_of_4, to_even])
def test_a_dynamic_pad_of_known_sign_compiles_once(fn):
    f = cleave.compile(fn, dynamic={"x": {1: "n"}}, verbose=False)
    gen = torch.Generator().manual_seed(2)
    assert_one_exact_compile(f, fn, [(torch.randn(3, n, generator=gen),) for n in (5, 6, 8, 3)])


def test_a_pad_of_unknown_sign_runs_eagerly_and_says_why():
    f = cleave.compile(to_six, dynamic={"x": {1: "n"}}, verbose=False)
    x = torch.randn(3, 4)
    with pytest.warns(UserWarning, match="pad amount .* may be negative or positive"):
        got = f(x)
    assert torch.equal(got, to_six(x))
    x = torch.randn(3, 9)
    assert torch.equal(f(x), to_six(x))
