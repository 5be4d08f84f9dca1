"""`max` and `min` of sizes or int arguments, and a reshape's -1, hold where torch traced
them only. sympy takes sizes as positive, so torch settles `max(n, 1)` as n and
`min(n - 1, 0)` as 0 and the graph keeps no trace of either; cleave read Max(0, e) as e
(a slice clamped at empty), which `max(k, 0)` of an int argument is not. One graph
served sizes of 0 and negative arguments with the traced side: NaN for a guarded mean
of an empty row, -2 for max(-2, 0), a tensor where eager's reshape(-1, 0) raises."""
from __future__ import annotations

import warnings

import pytest
import sympy
import torch

import cleave

from backend_case import ctx  # noqa: F401 (a fixture)


def _mean_guarded(x):
    return x.sum(1) / max(x.shape[1], 1)


def _min_forms(x):
    return x.sum(1) + min(x.shape[1], 1) + 10 * min(x.shape[1] - 1, 0)


def _extra_items(x):
    return x.sum(1) + max(x.shape[1] - 3, 0)


def _at_least_zero(x, k):
    return x + max(k, 0)


def _eagerly(compiled, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compiled(*args)


@pytest.mark.parametrize("fn", [_mean_guarded, _min_forms])
def test_max_and_min_of_a_size_hold_at_an_empty_axis(fn):
    compiled = cleave.compile(fn, dynamic="all")
    for cols in (5, 0, 4):
        x = torch.randn(3, cols)
        torch.testing.assert_close(_eagerly(compiled, x), fn(x))


def test_a_size_clamped_at_zero_holds_below_the_clamp(ctx):
    for compiled in (cleave.compile(_extra_items, dynamic="all"),
                     torch.compile(_extra_items, backend="cleave", dynamic=True)):
        for cols in (5, 2, 6):
            x = torch.randn(3, cols)
            torch.testing.assert_close(_eagerly(compiled, x), _extra_items(x))


def _window(x):
    return x[:, max(x.shape[1] - 4, 0):].sum(1)


def test_a_window_crop_traced_below_its_clamp_compiles_each_side(ctx):
    """Traced at 3 columns, `max(n - 4, 0)` takes its 0 side: the capture read it as the
    n - 4 side (it had no traced size for n) and required both n - 4 >= 0 and n - 4 <= 0,
    which no call met: every call ran eagerly, said as "inputs do not fit"."""
    compiled = cleave.compile(_window, dynamic="all")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for cols in (3, 6, 2, 7):
            x = torch.randn(2, cols)
            torch.testing.assert_close(compiled(x), _window(x))
    assert not [w for w in caught if "eager" in str(w.message)], [str(w.message) for w in caught]
    assert compiled.capture_error is None


def test_an_int_argument_clamped_at_zero_holds_when_negative(ctx):
    x = torch.zeros(2, 3)
    for compiled in (cleave.compile(_at_least_zero, dynamic="all"),
                     torch.compile(_at_least_zero, backend="cleave", dynamic=True)):
        for k in (3, -2, 4):
            torch.testing.assert_close(_eagerly(compiled, x, k), _at_least_zero(x, k))
    torch._dynamo.reset()
    plain = torch.compile(_at_least_zero, backend="cleave")  # k made symbolic at its second value
    for k in (3, 5, -2):
        torch.testing.assert_close(_eagerly(plain, x, k), _at_least_zero(x, k))


def test_a_reshape_minus_one_beside_an_empty_axis_raises_eagers_error():
    def f(x):
        return x[:, None, :].expand(-1, 2, -1).reshape(-1, x.shape[1]) * 1

    compiled = cleave.compile(f, dynamic="all")
    torch.testing.assert_close(compiled(torch.ones(3, 4)), f(torch.ones(3, 4)))
    with pytest.raises(RuntimeError, match="ambiguous"):
        _eagerly(compiled, torch.ones(3, 0))


def _prefix_ones(q, k):
    return torch.ones(q.shape[1], k.shape[1] - q.shape[1])


def test_an_extent_that_is_a_difference_of_sizes_is_nonnegative():
    """`torch.ones(T, L - T)` (a mask over a past of L - T keys) had no L >= T in the
    graph: the candidate check bound L below T, the reference interpreter failed on the
    graph as written ("numel: integer multiplication overflow"), and every call ran
    eagerly. Each extent not provably >= 0 is now a constraint of the graph."""
    compiled = cleave.compile(_prefix_ones, dynamic="all")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t, length in ((4, 7), (2, 9)):
            q, k = torch.randn(2, t), torch.randn(2, length)
            torch.testing.assert_close(compiled(q, k), _prefix_ones(q, k))
    assert not caught, [str(w.message) for w in caught]
    assert compiled.stats["failed"] == 0


def _shifted_by_magnitude(a, k):
    return (a * 2) << abs(k)


def test_an_int_arguments_magnitude_compiles_and_caches(ctx):
    """abs(k) of a dynamic int: the scheduler could not print Abs (every call ran eagerly)
    and the operator's cache entry could not be read back ("damaged cache entry")."""
    from cleave.ir import dims as D

    k = D.dim("k_pos") - D.dim("k_neg")
    assert D.dim(D.fmt(sympy.Abs(k))) == sympy.Abs(k)
    compiled = torch.compile(_shifted_by_magnitude, backend="cleave", dynamic=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for n, k in ((5, -3), (7, 4), (5, -3)):
            a = torch.randint(-100, 100, (3, n), dtype=torch.int32)
            assert torch.equal(compiled(a, k), _shifted_by_magnitude(a, k))
    assert ctx.stats()["failed"] == 0
