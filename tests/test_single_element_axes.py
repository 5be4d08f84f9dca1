"""Reductions over a dim of one element compile, as torch computes them.

A 0-d tensor's dim 0 (or -1) is an axis of one element to torch: argmax(0), max(0),
cummax(0), logcumsumexp(0) and topk(x, 1) of a scalar. The lowering divided by the rank
(ZeroDivisionError) and the function ran eagerly behind a warning quoting it. topk over
an axis of one element failed to schedule (the axis has no lanes in the tile)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest
import torch

import cleave

SCALAR_OPS = {
    "argmax": lambda a: a.argmax(0),
    "argmin_keepdim": lambda a: a.argmin(-1, keepdim=True),
    "max": lambda a: a.max(0),
    "min_keepdim": lambda a: a.min(0, keepdim=True),
    "cummax": lambda a: torch.cummax(a, 0),
    "cummin": lambda a: torch.cummin(a, -1),
    "logcumsumexp": lambda a: torch.logcumsumexp(a * 2, 0),
    "topk": lambda a: torch.topk(a * 2, 1),
    "topk_smallest": lambda a: torch.topk(a, 1, largest=False),
}


def _same(got, expected):
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, (g, e)
        assert torch.equal(g.nan_to_num(7.0), e.nan_to_num(7.0)), (g, e)


def _compiled_quietly(fn, x):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cleave.compile(fn)(x)
    said = [str(w.message) for w in caught if str(w.message).startswith("cleave")]
    assert not said, said
    return got


@pytest.mark.parametrize("name", sorted(SCALAR_OPS))
@pytest.mark.parametrize("value", [1.5, float("nan")])
def test_a_scalars_dim_compiles(name, value):
    fn, x = SCALAR_OPS[name], torch.tensor(value)
    _same(_compiled_quietly(fn, x), fn(x))


@pytest.mark.parametrize("shape, dim, dtype", [((1,), 0, torch.float32), ((3, 1), 1, torch.float32),
                                               ((1, 4), 0, torch.int32), ((2, 1, 3), 1, torch.bfloat16)])
def test_topk_over_an_axis_of_one_element(shape, dim, dtype):
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(3)) * 10).to(dtype)

    def fn(a):
        return torch.topk(a, 1, dim=dim)

    _same(_compiled_quietly(fn, x), fn(x))
