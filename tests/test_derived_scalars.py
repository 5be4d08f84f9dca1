"""Scalars PyTorch's decompositions derive under dynamic shapes compile.

`F.cross_entropy(label_smoothing=0.1)` over a dynamic class count multiplies by
`0.1 / n` (torch's FloatTrueDiv of a ToFloat of the size), and `special.xlogy(a, 2.0)`
makes its number a `prims.scalar_tensor`: each was a graph break ("has no IR form",
"not supported") around an op that is a division by a size, or a constant."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest
import torch
import torch.nn.functional as F

import cleave


def smoothed_loss(z, y):
    return F.cross_entropy(z, y, label_smoothing=0.1)


def xlogy_of_a_number(a):
    return torch.special.xlogy(a, 2.0)


@pytest.mark.parametrize("fn, make", [
    (smoothed_loss, lambda n, g: (torch.randn(3 + n // 7, n, generator=g), torch.randint(0, n, (3 + n // 7,), generator=g))),
    (xlogy_of_a_number, lambda n, g: (torch.rand(3, n, generator=g),)),
])
def test_a_derived_scalar_compiles_at_every_size(fn, make):
    compiled = cleave.compile(fn, dynamic="all", verbose=False)
    gen = torch.Generator().manual_seed(5)
    for n in (7, 33):
        args = make(n, gen)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="cleave")  # a graph break warns
            got = compiled(*args)
        torch.testing.assert_close(got, fn(*args))
    assert compiled.stats["graph_breaks"] == 0 and compiled.stats["failed"] == 0, compiled.stats
