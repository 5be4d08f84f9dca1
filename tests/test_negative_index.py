"""A negative index counts from the end of the axis it indexes, as torch's x[index]
does: x[:, [-1, 0, -8]] reads the last, the first and (of 8) the first column. The
kernels read such an index through a select before it addresses the load; the
interpreter wraps it the same way. index_select and gather, which raise on a negative
index in eager, read it the same way once compiled."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest
import torch

import cleave

from backend_case import ctx  # noqa: F401 (a fixture)


def columns(x, index):
    return x[:, index] * 2.0


def rows_of_pages(cache, index):
    return cache[index].sum(-1)


@pytest.mark.parametrize("fn, shape, extent_axis", [(columns, (6, 8), 1), (rows_of_pages, (9, 4, 5), 0)])
def test_negative_indices_count_from_the_end(fn, shape, extent_axis):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(*shape, generator=gen)
    n = shape[extent_axis]
    index = torch.tensor([-1, 0, -n, 3, -2, n - 1])
    f = cleave.compile(fn, verbose=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # an eager fallback warns
        got = f(x, index)
    assert f.stats["failed"] == 0 and f.stats["graph_breaks"] == 0, f.stats
    torch.testing.assert_close(got, fn(x, index), rtol=1e-5, atol=1e-6)  # a sum's order may differ
    index = torch.tensor([2, 1])  # the same operator, non-negative indices
    torch.testing.assert_close(f(x, index), fn(x, index), rtol=1e-5, atol=1e-6)


def test_one_index_into_two_extents_wraps_into_each():
    """a[i] + b[i] over tables of 10 and 7 rows: -1 is row 9 of a and row 6 of b. Each
    extent gets its own gathered application (it ran eagerly, session 11's limit)."""
    fn = lambda a, b, i: a[i] + b[i] * 2  # noqa: E731
    f = cleave.compile(fn, verbose=False)
    a, b = torch.randn(10, 4), torch.randn(7, 4)
    for i in (torch.tensor([-1, 2, 0, -7]), torch.tensor([6, -3, 1, 0])):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="cleave")  # an eager fallback warns
            assert torch.equal(f(a, b, i), fn(a, b, i))
    assert f.stats["failed"] == 0 and f.stats["compiles"] + f.stats["from_cache"] == 1, f.stats


def _tail_and_row(x, n):
    return x[-n:] + 1, x[-n] * 2, x[-(x.shape[0] // 2):] - 1, x.narrow(0, -n, n).sum(0)


def test_a_negative_start_computed_from_a_size_counts_from_the_end(ctx):
    """`x[-n:]` with n an int argument or a size: its start was kept as the negative -n
    and read rows from the buffer's front (`x[-4:]` of 9 rows read rows 0.., past them).
    narrow's start comes wrapped by torch, rows - n, of a sign sympy cannot tell."""
    f = torch.compile(_tail_and_row, backend="cleave", dynamic=True)
    for rows, n in ((9, 4), (9, 1), (12, 5)):
        x = torch.randn(rows, 3, generator=torch.Generator().manual_seed(rows + n))
        for got, want in zip(f(x, n), _tail_and_row(x, n)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_torch_range_guards_hold_at_every_binding_of_a_whole_capture():
    """`x[-(n // 2):]` keeps its traced form only where torch's guard on n holds (the start
    is negative); torch.export says so in its range constraints, which cleave.compile
    ignored: at n = 1 it returned nothing where eager returns x. A binding outside them
    now runs eagerly, with a warning saying which guard."""
    def tail_half(x):
        return x[-(x.shape[0] // 2):] + 1

    f = cleave.compile(tail_half, dynamic="all")
    for n in (6, 1, 9):
        x = torch.arange(float(n))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="cleave: tail_half runs eagerly")
            torch.testing.assert_close(f(x), tail_half(x))
