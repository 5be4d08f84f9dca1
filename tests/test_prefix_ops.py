"""Prefix reductions compile: cumsum and cumprod as PyTorch's own decomposition writes them (a
prims.sum or prims.prod over the triangle j <= i), logcumsumexp, cummax and cummin as
cleave's rules over the same triangle. The loop over j stops at each row tile's diagonal,
so one operator serves every extent of a dynamic axis. They ran eagerly before."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest
import torch

import cleave


def _special(x):
    """NaN, infinities and ties where there is room for them."""
    if x.shape[1] > 8:
        x[1, 3] = float("nan")
        x[2, 5:] = float("-inf")
        x[0, 4] = float("inf")
        x[3, 2] = x[3, 7] = 5.0
    return x


PROGRAMS = {
    "cumsum": lambda x: torch.cumsum(x, dim=1) * 2.0,
    "cumprod": lambda x: torch.cumprod(x.clamp(-1.5, 1.5), dim=1),
    "logcumsumexp": lambda x: torch.logcumsumexp(x, dim=1),
    "cummax": lambda x: torch.cummax(x, dim=1),
    "cummin": lambda x: torch.cummin(x, dim=1),
    "positions": lambda x: (x > 0).long().cumsum(-1) - 1,  # position ids from a mask
    "cummax_int": lambda x: torch.cummax((x.nan_to_num(0.0, 9.0, -9.0) * 3).to(torch.int32), dim=1),
    "cumsum_bf16": lambda x: torch.cumsum(x.to(torch.bfloat16), dim=1),
    "cummax_bool": lambda x: torch.cummax(x > 0.5, dim=1),  # a running max of bools starts at False
    "cummin_bool": lambda x: torch.cummin(x > -0.5, dim=1),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_prefix_reduction_over_a_dynamic_axis(name):
    fn = PROGRAMS[name]
    f = cleave.compile(fn, dynamic={"x": {1: "n"}}, verbose=False)
    gen = torch.Generator().manual_seed(11)
    for n in (13, 70):
        x = _special(torch.randn(5, n, generator=gen))
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="cleave")  # an eager fallback warns
            got = f(x)
        eager = fn(x)
        want = fn(x.double()) if name in ("cumsum", "cumprod", "logcumsumexp") else eager
        got, want, eager = (got, want, eager) if isinstance(got, tuple) else ((got,), (want,), (eager,))
        for g, w, e in zip(got, want, eager):
            assert g.shape == e.shape and g.dtype == e.dtype, (name, n)
            if w.dtype.is_floating_point:
                tol = 1e-2 if g.dtype == torch.bfloat16 else 1e-5
                torch.testing.assert_close(g.double(), w.double(), rtol=tol, atol=tol, equal_nan=True)
            else:
                assert torch.equal(g, w), (name, n)
    assert f.stats["graph_breaks"] == 0 and f.stats["failed"] == 0, f.stats
    assert f.stats["compiles"] + f.stats["from_cache"] == 1, f.stats


def test_cumsum_captures_as_a_reduction_over_the_triangle():
    """cleave.capture (no decompositions) maps aten.cumsum itself: an int32 input sums in
    int64, as torch's result; a 0-d input is its own prefix."""
    from cleave.interpreter import interpret

    g = cleave.capture(lambda x: torch.cumsum(x, dim=0), torch.zeros(6, 3, dtype=torch.int32))
    assert [n.op for n in g.live_nodes()].count("reduce") == 1
    x = torch.randint(-2**30, 2**30, (6, 3), dtype=torch.int32)
    assert torch.equal(interpret(g, {"x": x})[0], torch.cumsum(x, dim=0))
    f = cleave.compile(lambda x: torch.cumsum(x * 2, dim=0), verbose=False)
    x = torch.randn(())
    assert torch.equal(f(x), torch.cumsum(x * 2, dim=0))


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
def test_a_running_extremes_value_is_the_input_at_its_index(op):
    """Over a run of 0.0 and -0.0 the running max keeps either sign, while the index is
    the tie's last position: the value is read back at the index, bit for bit torch's."""
    x = torch.tensor([[-0.0, 0.0, -0.0, 0.0, 1.0, -0.0], [0.0, -0.0, 0.0, -0.0, -1.0, 0.0]])
    values, indices = cleave.compile(lambda a: op(a, 1), verbose=False)(x)
    want_values, want_indices = op(x, 1)
    assert torch.equal(indices, want_indices)
    assert torch.equal(values.signbit(), want_values.signbit()) and torch.equal(values, want_values)
    assert torch.equal(values.signbit(), x.gather(1, indices).signbit())
