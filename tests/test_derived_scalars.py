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


def test_sdpas_default_scale_over_a_dynamic_head_dim_compiles():
    """SDPA scales by sqrt(1 / sqrt(d)) on each side (torch's FloatPow of a FloatTrueDiv):
    over a dynamic head dim that scalar was a graph break quoting sympy, and SDPA ran
    eagerly at every width."""
    def causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    compiled = torch.compile(causal, backend="cleave", dynamic=True)
    gen = torch.Generator().manual_seed(6)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for s, d in ((7, 24), (9, 40)):
            q, k, v = (torch.randn(1, 3, s, d, generator=gen) for _ in range(3))
            torch.testing.assert_close(compiled(q, k, v), causal(q, k, v), rtol=1e-4, atol=1e-5)
