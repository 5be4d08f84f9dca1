"""Results keep eager's layout: an elementwise op over a channels-last or transposed
input returns a tensor eager lays out in the input's stride order, and code after it
may rely on that (`y.permute(0, 2, 3, 1).view(-1, C)`, which raises on a row-major
result). The kernels compute such an output permuted, row-major in eager's order, and
the launcher returns the inverse permutation: eager's strides, no copy."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest
import torch
import torch.nn.functional as F

import cleave
from cleave.frontends.output_layout import eager_order


def scale_gelu(x, w):
    y = F.gelu(x * w + 1)
    return y, y.permute(0, 2, 3, 1).reshape(-1, y.shape[1]).sum(0)


def transposed_affine(x):
    y = x.transpose(0, 1) * 2 - 1
    return y, y.transpose(0, 1).reshape(-1)[:7]


def _compiled(fn, path):
    if path == "cleave":
        return cleave.compile(fn, dynamic="all")
    return torch.compile(fn, backend="cleave", dynamic=True)


def _same(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.stride() == w.stride(), (g.stride(), w.stride())
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["cleave", "dynamo"])
def test_channels_last_result_keeps_its_strides(path):
    torch._dynamo.reset()
    f = _compiled(scale_gelu, path)
    for n in (3, 2, 3):
        x = torch.randn(n, 5, 3, 4).to(memory_format=torch.channels_last)
        w = torch.randn(5, 1, 1)
        got = f(x, w)
        _same(got, scale_gelu(x, w))
        got[0].permute(0, 2, 3, 1).view(-1, 5)  # raises on a row-major result


@pytest.mark.parametrize("path", ["cleave", "dynamo"])
def test_transposed_result_and_its_views_compile(path):
    torch._dynamo.reset()
    f = _compiled(transposed_affine, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no region runs eagerly for its views' sake
        for n in (9, 5, 9):
            x = torch.randn(n, 6)
            _same(f(x), transposed_affine(x))


def transposed_product(x):
    return (x * 2).t()


def stepped_product(x):
    return (x * 2)[:, ::2]


def shifted_product(x):
    return (x * 2)[1:]


def expanded_row(x):  # its callee is a subscript of an expression: guards.py read it with a TypeError
    return (x * 2)[:1].expand(4, -1)


@pytest.mark.parametrize("fn", [transposed_product, stepped_product, shifted_product, expanded_row])
@pytest.mark.parametrize("path", ["cleave", "dynamo"])
def test_a_returned_view_of_a_result_has_eagers_strides(fn, path):
    """cleave.compile returned these row-major (session 29's probes): a dense one is
    computed permuted, the others are made on the host as views, through dynamo's graphs."""
    torch._dynamo.reset()
    f = _compiled(fn, path)
    for n in (5, 3, 5):
        x = torch.randn(n, 6)
        got, want = f(x), fn(x)
        assert got.storage_offset() == want.storage_offset()
        _same([got], [want])


def zeroed_through_a_transpose(x):
    y = x.clone()
    y.t()[1:] = 0
    return y


def stepped_through_a_permute(x):
    y = torch.stack([x, x + 1]) * 3
    y.permute(2, 0, 1)[1:4] += 1
    return y


def column_zeroed_of_a_transposed_input(x):
    y = x.t() + 0
    y[:, 1:] = 0.0
    return y


@pytest.mark.parametrize("fn", [zeroed_through_a_transpose, stepped_through_a_permute,
                                column_zeroed_of_a_transposed_input])
@pytest.mark.parametrize("path", ["cleave", "dynamo"])
def test_a_result_written_through_a_view_keeps_its_own_layout(fn, path):
    """slice_scatter keeps its input's layout; torch's decomposition of it (a `where`)
    gave a row-major result, so `y.t()[1:] = 0` returned y with the view's strides
    (1, 5) for eager's (7, 1), and `y.view(-1)` raised (session 46's probes)."""
    torch._dynamo.reset()
    f = _compiled(fn, path)
    for n in (5, 3, 5):
        x = torch.randn(n, 7)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="cleave")  # compiled, not run eagerly
            got = f(x)
        want = fn(x)
        _same([got], [want])
        if want.is_contiguous():
            got.view(-1)  # what raised


def test_eager_order():
    t = torch.empty(2, 5, 3, 4)
    assert eager_order(t) is None
    assert eager_order(t.to(memory_format=torch.channels_last)) == (0, 2, 3, 1)
    assert eager_order(t.transpose(1, 3)) == (0, 3, 2, 1)
    assert eager_order(torch.empty(2, 5, 1, 1).to(memory_format=torch.channels_last)) is None  # extent 1: free
    assert eager_order(torch.empty(6, 8)[:, ::2].t()) is None  # gaps: no dense order
    assert eager_order(torch.empty(6, 8).t()[1:]) is None  # an offset
    assert eager_order(torch.empty(0, 3).t()) is None


def transposed_row_max(x):
    return x.amax(1, keepdim=True).transpose(0, 2)


@pytest.mark.parametrize("path", ["cleave", "dynamo"])
def test_a_view_of_an_empty_result_compiles(path):
    """Eager's amax of (n, 4, 0) is laid out with strides (1, 0, 1): the region of its
    transpose ran eagerly, the strides compared as though an empty tensor had a layout."""
    torch._dynamo.reset()
    f = _compiled(transposed_row_max, path)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for n, k in ((3, 4), (5, 4), (7, 6)):
            x = torch.randn(n, k, 0)
            got, want = f(x), transposed_row_max(x)
            assert got.shape == want.shape and got.dtype == want.dtype


def test_an_overlapping_input_of_equal_strides_gives_eagers_layout_at_each_shape():
    """x.as_strided((a, b), (1, 1)): eager lays out sin(x) by which axis is longer, and a
    capture under dynamic="all" keyed only by the stride order served (9, 3) with the
    (5, 7) call's column-major layout (so `out.view(-1)` raised where eager's works)."""
    def f(x):
        return torch.sin(x) * 2

    compiled = cleave.compile(f, dynamic="all", verbose=False)
    for a, b in [(5, 7), (9, 3), (5, 7)]:
        x = torch.randn(a + b + 5).as_strided((a, b), (1, 1))
        got, want = compiled(x), f(x)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride(), (a, b)
