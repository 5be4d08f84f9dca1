"""torch.flip reads each axis backwards, take(x, n - 1 - iota(n)): over a static axis
with n a constant, over a dynamic one with n an integer `size` value, so one compiled
operator serves every extent (an empty one too)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")


import torch

import cleave
from kernel_check import assert_one_exact_compile


def flipped(x):
    return torch.flip(x, dims=[0, -1]) * 2.0


def test_flip_over_a_dynamic_and_a_static_axis():
    f = cleave.compile(flipped, dynamic={"x": {0: "n"}}, verbose=False)
    gen = torch.Generator().manual_seed(3)
    assert_one_exact_compile(f, flipped, [(torch.randn(n, 7, generator=gen),) for n in (5, 9, 1, 0)])


def test_a_scalar_flipped_is_itself():
    """torch takes dim 0 of a 0-dim tensor; its lowering divided by the rank (0) and the
    region ran eagerly with a warning quoting "integer modulo by zero"."""
    import warnings

    def scaled(a):
        return a.flip(0) * 3.0, a.softmax(0)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = torch.compile(scaled, backend="cleave")(torch.tensor(2.5))
    for g, w in zip(got, scaled(torch.tensor(2.5))):
        assert torch.equal(g, w)
