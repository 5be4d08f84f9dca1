"""Slices with bounds past the axis, pieces of split/chunk/tensor_split over a dynamic
axis, and aten._safe_softmax, against eager: each gave silently wrong results."""
import os
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

import cleave
from cleave.frontends import UnsupportedOpError


def _rand(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) * 7 + len(shape)))


def _same(got, want):
    got, want = (list(v) if isinstance(v, (list, tuple)) else [v] for v in (got, want))
    assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def _eager_warnings(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in caught if "runs eagerly" in str(w.message)]


# -- slice bounds -----------------------------------------------------------------
def test_a_negative_start_past_the_axis_is_clamped_to_zero():
    """`x[:, -4:-1]` of 3 columns is x[:, 0:2]: the start was taken as 3 - 4 = -1, under
    dynamic shapes read from before the buffer, and static a graph that failed to parse."""
    def f(x):
        return x[:, -4:-1] * 2

    g = torch.compile(f, backend="cleave", dynamic=True)
    for shape in ((3, 3), (5, 3), (3, 7)):
        x = _rand(*shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _same(g(x), f(x))
    x = _rand(3, 3)
    assert "start=0" in cleave.capture(f, x).text()
    out, eager = _eager_warnings(cleave.compile(f, verbose=False), x)
    _same(out, f(x))
    assert eager == []


@pytest.mark.parametrize("fn, dynamic", [(lambda x: x[-2:] * 2, "all"),
                                         (lambda x: x[1:-1] * 2, {"x": {0: "n"}})])
def test_a_row_count_below_a_bound_is_captured_again(fn, dynamic):
    """At 1 row `x[-2:]` is that row and `x[1:-1]` is empty; the graph traced at 5 rows
    gave 2 rows, or a length of -1. The graph holds for n >= 2 only (the slice's guard):
    1 row gets a capture of its own."""
    c = cleave.compile(fn, dynamic=dynamic, verbose=False)
    for rows in (5, 7):
        x = _rand(rows, 3)
        out, eager = _eager_warnings(c, x)
        _same(out, fn(x))
        assert eager == []
    x = _rand(1, 3)
    out, eager = _eager_warnings(c, x)
    _same(out, fn(x))
    assert eager == [] and c.stats["operators"] == 2, c.stats


# -- pieces over a dynamic axis --------------------------------------------------
def _split(x):
    return tuple(t * 2 for t in x.split(2, 1))


def _chunk3(x):
    return tuple(t * 2 for t in x.chunk(3, 1))


def _tensor_split3(x):
    return tuple(t * 2 for t in torch.tensor_split(x, 3, 1))


@pytest.mark.parametrize("fn, widths", [(_split, (7, 11, 5)), (_chunk3, (7, 4, 9)), (_tensor_split3, (7, 5, 8, 2))])
def test_pieces_whose_number_or_width_depends_on_a_dynamic_size(fn, widths):
    """split(2), chunk(3) and tensor_split(3) over a dynamic width took the traced width's
    pieces: at another width too few pieces, or the wrong widths. The capture refuses
    them, naming the op, and the function compiles through torch.compile's graphs."""
    with pytest.raises(UnsupportedOpError, match=r"aten\.(split|chunk|tensor_split)"):
        cleave.capture(fn, _rand(3, 7), dynamic={"x": {1: "n"}})
    c = cleave.compile(fn, dynamic={"x": {1: "n"}}, verbose=False)
    g = torch.compile(fn, backend="cleave", dynamic=True)
    for width in widths:
        x = _rand(3, width)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _same(c(x), fn(x))
            _same(g(x), fn(x))


def test_halves_of_a_dynamic_width_still_capture():
    """chunk(2) of n >= 2 is always two pieces, ceil(n/2) and n - ceil(n/2)."""
    def halves(x):
        a, b = x.chunk(2, dim=1)
        return a * 2, b.sum(1)

    g = torch.compile(halves, backend="cleave", dynamic=True)
    for width in (7, 9, 4):
        x = _rand(3, width)
        out, eager = _eager_warnings(g, x)
        _same(out, halves(x))
        assert eager == []


# -- _safe_softmax ----------------------------------------------------------------
def test_safe_softmax_gives_zero_on_a_row_of_minus_inf():
    """aten._safe_softmax was lowered as softmax: NaN where torch gives 0."""
    def f(x):
        return torch.ops.aten._safe_softmax(x, -1)

    x = _rand(3, 5)
    x[1] = float("-inf")
    x[2, :2] = float("-inf")
    _same(cleave.compile(f, verbose=False)(x), f(x))


def test_sdpa_math_path_gives_zero_on_a_fully_masked_query():
    """SDPA with v's head dim unlike q's decomposes into _safe_softmax under torch.compile:
    a query row that sees no key came out NaN."""
    def sdpa(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    g = torch.compile(sdpa, backend="cleave", dynamic=True)
    for rows, keys in ((3, 5), (5, 7)):
        q, k, v = _rand(1, 1, rows, 8), _rand(1, 1, keys, 8), _rand(1, 1, keys, 6)
        m = torch.ones(rows, keys, dtype=torch.bool)
        m[1] = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _same(g(q, k, v, m), sdpa(q, k, v, m))


def test_a_list_result_run_eagerly_keeps_eagers_own_structure():
    # dynamic="all": export fixes the width; at another width the call runs eagerly and
    # returns eager's 6 pieces, not the compiled 4-piece structure (a pytree ValueError)
    def halves(x):
        return [t * 2 for t in x.split(2, 1)]
    f = cleave.compile(halves, dynamic="all", verbose=False)
    f(torch.randn(3, 7))
    x = torch.randn(3, 11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = f(x)
    assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in halves(x)]
    assert all(torch.equal(g, w) for g, w in zip(got, halves(x)))
