"""Outputs the torch.compile backend returns as views, and sizes it returns, under
dynamic shapes: each is what eager returns, with eager's sizes, strides, storage offset
and aliasing (a write through it shows in its base), at every shape of one compile; what
the launcher cannot make so runs eagerly with a warning that says why."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from backend_case import ctx  # noqa: F401 (a fixture)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _assert_like_eager(got, want, got_bases=(), want_bases=(), exact=True):
    """got as eager's want: values, sizes, strides, storage offsets, and which of the bases
    (inputs) and of the other outputs each output shares its storage with."""
    got, want = list(got), list(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert g.stride() == w.stride() and g.storage_offset() == w.storage_offset(), \
            (g.shape, g.stride(), g.storage_offset(), w.stride(), w.storage_offset())
        if exact:
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g, w)
    for bases in (got_bases, want_bases):
        assert len({_storage(b) for b in bases}) == len(bases)  # the bases share no storage
    shared = [[_storage(a) == _storage(b) for b in [*got_bases, *got]] for a in got]
    eager = [[_storage(a) == _storage(b) for b in [*want_bases, *want]] for a in want]
    assert shared == eager


def _no_cleave_warning():
    warnings.filterwarnings("error", message="cleave")  # no graph break, no fallback


def test_views_of_an_input_with_symbolic_sizes_strides_and_offsets(ctx):
    """Each output is a view of x whose size, stride or storage offset is an expression
    in the dynamic sizes. They were rebuilt with contiguous strides from offset 0 (from a
    compiled copy: AOTAutograd regenerates a symbolic view of an input from the size,
    strides and offset of the tensor the backend returns): wrong values."""
    def views(x):
        n = x.shape[0]
        a, b = x.chunk(2, -1)
        p, q, r = x.tensor_split(3, 1)
        return (x * 2, a, b, x[n // 2:], x.narrow(0, -2, 2), x[:, : x.shape[1] // 2], x[:1].expand(n, -1),
                p, q, r, torch.einsum("ii->i", x[:, :n]))

    f = torch.compile(views, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        _no_cleave_warning()
        for rows, cols in ((3, 4), (5, 8), (5, 8), (6, 7)):  # (5, 8) twice: the second takes the warm path
            x = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
            x2 = x.clone()
            got, want = f(x), views(x2)
            _assert_like_eager(got, want, [x], [x2])
            got[1].mul_(-1)  # a write through a view shows in x
            want[1].mul_(-1)
            assert torch.equal(x, x2)


def test_an_attention_head_split_of_an_input_is_a_view(ctx):
    """`x.view(B, S, 4, E // 4).transpose(1, 2)`: the sizes come from the call's input."""
    def heads(x):
        b, s, e = x.shape
        return x.view(b, s, 4, e // 4).transpose(1, 2), x.sum(-1)

    f = torch.compile(heads, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        _no_cleave_warning()
        for shape in ((2, 3, 8), (3, 5, 12), (1, 2, 16)):
            x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
            _assert_like_eager(f(x), heads(x), [x], [x], exact=False)


def test_a_kv_cache_step_returns_the_filled_prefix_as_a_view_of_the_cache(ctx):
    """Write the new keys into the cache (an input) and return `k_cache[:, :pos + n]`:
    from the second call on (sizes symbolic after the automatic dynamic recompile) the
    returned view was wrong."""
    def step(k_cache, k_new, pos: int):
        k_cache[:, pos:pos + k_new.shape[1]] = k_new
        return k_cache[:, : pos + k_new.shape[1]]

    f = torch.compile(step, backend="cleave")
    with torch.no_grad():
        for pos, n in ((0, 3), (3, 1), (4, 1), (5, 2)):
            cache = torch.zeros(2, 8, 4)
            cache2, new = cache.clone(), torch.randn(2, n, 4, generator=torch.Generator().manual_seed(pos))
            got, want = f(cache, new, pos), step(cache2, new, pos)
            _assert_like_eager([got], [want], [cache], [cache2])
            assert torch.equal(cache, cache2)


def test_views_of_an_intermediate_with_symbolic_sizes_under_autograd(ctx):
    """Two views of one intermediate, under autograd with dynamic shapes: the views were
    made again from the kernels' output with fx nodes as their sizes (RuntimeError)."""
    torch.manual_seed(0)
    fc = nn.Linear(9, 12)

    def two_views(x):
        b, t, _ = x.shape
        h = fc(x)
        return h.view(b, t, 3, 4), h[..., :5]

    f = torch.compile(two_views, backend="cleave", dynamic=True)
    for shape in ((2, 7, 9), (3, 5, 9)):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[1]))
        got, want = f(x), two_views(x)
        _assert_like_eager(got, want, [x], [x], exact=False)
        sum(g.sum() for g in got).backward()
        grad = fc.weight.grad.clone()
        fc.weight.grad = None
        sum(w.sum() for w in want).backward()
        torch.testing.assert_close(grad, fc.weight.grad)
        fc.weight.grad = None
        with torch.no_grad():
            _assert_like_eager(f(x), two_views(x), [x], [x], exact=False)


def test_attention_weights_and_norms_under_autograd_with_dynamic_shapes(ctx):
    """nn.MultiheadAttention(need_weights=True) and BatchNorm1d + InstanceNorm1d with
    inputs requiring grad: their forward graphs return views with symbolic sizes beside
    the tensors saved for backward (the launcher raised RuntimeError)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    norms = nn.ModuleList([nn.BatchNorm1d(3), nn.InstanceNorm1d(3)]).eval()

    def attend(x):
        return mha(x, x, x, need_weights=True, average_attn_weights=False)

    def normalize(x):
        return norms[0](x) + norms[1](x)

    f, g = torch.compile(attend, backend="cleave", dynamic=True), torch.compile(normalize, backend="cleave")
    for length in (5, 7):
        x = torch.randn(2, length, 8, generator=torch.Generator().manual_seed(length))
        _assert_like_eager(f(x), attend(x), [x], [x], exact=False)
        y = torch.randn(2, 3, length, requires_grad=True, generator=torch.Generator().manual_seed(length))
        _assert_like_eager([g(y)], [normalize(y)], [y], [y], exact=False)


def test_a_size_no_tensor_of_the_operator_binds_is_computed_from_the_call(ctx):
    """`F.embedding_bag(i, x.t())` runs eagerly; the region before it returns the size
    rows * cols of its offsets, and that size was evaluated from the operator's symbols,
    which bind only what its tensors carry (KeyError: needs a value for s48)."""
    def bags(x, i):
        return F.embedding_bag(i, x.t(), mode="mean")

    f = torch.compile(bags, backend="cleave", dynamic=True)
    for rows, cols, per_bag in ((7, 13, 3), (5, 9, 2), (6, 11, 4)):
        x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows))
        i = torch.randint(0, cols, (rows, per_bag), generator=torch.Generator().manual_seed(cols))
        _assert_like_eager([f(x, i)], [bags(x, i)], [x, i], [x, i], exact=False)


def test_an_in_place_add_into_an_expanded_view_recompiles(ctx):
    """`x[:1].expand(n, -1).add_(1)` (eager refuses to write an expanded view; AOTAutograd
    traces it functionally): on the automatic dynamic recompile the launcher passed fx
    nodes to aten.expand (RuntimeError: 'immutable_list'). It returns what aot_eager does."""
    def bump(x):
        return x[:1].expand(x.shape[0], -1).add_(1)

    f, reference = torch.compile(bump, backend="cleave"), torch.compile(bump, backend="aot_eager")
    with torch.no_grad():
        for shape in ((7, 13), (5, 9), (6, 4)):
            x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[0]))
            x2 = x.clone()
            _assert_like_eager([f(x)], [reference(x2)], [x], [x2])
            assert torch.equal(x, x2)


def test_a_view_of_a_result_eager_lays_out_transposed_compiles(ctx):
    """`(x.t() * 2)[1:]`: eager's product keeps x.t()'s strides. The kernels compute it
    permuted, row-major in eager's order (output_layout), and the launcher hands back
    the inverse permutation, so the view has eager's strides: it compiles (the region
    ran eagerly while the kernels wrote the product row-major)."""
    def rows(x):
        y = x.t() * 2
        return y[1:], x.sum()

    f = torch.compile(rows, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        _no_cleave_warning()
        for shape in ((3, 4), (5, 6), (3, 4)):
            x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[0]))
            _assert_like_eager(f(x), rows(x), [x], [x], exact=False)
    assert ctx.stats()["graph_breaks"] == 0


@pytest.mark.parametrize("dynamic", [False, True])
def test_repeated_outputs_and_returned_inputs_are_the_same_tensors(ctx, dynamic):
    """An output returned twice is one tensor, an input returned is the input itself."""
    def repeats(x):
        z = x + 1
        return z, x, z, z[:, 1:]

    f = torch.compile(repeats, backend="cleave", dynamic=dynamic)
    with torch.no_grad():
        for shape in ((3, 4), (4, 6)):
            x = torch.randn(shape)
            got = f(x)
            _assert_like_eager(got, repeats(x), [x], [x])
            assert got[1] is x and got[2] is got[0]


def test_type_as_returns_the_input_itself_where_nothing_converts():
    """`x.type_as(y)` of y's dtype is x itself in eager (a write to it writes x), as
    `x.to(y)` is; its schema does not say so, and cleave.compile returned a copy."""
    import cleave

    same = cleave.compile(lambda x, y: x.type_as(y), verbose=False)
    other = cleave.compile(lambda x, y: x.type_as(y), verbose=False)
    x, y = torch.zeros(3), torch.ones(2)
    assert same(x, y) is x
    got = other(x, y.double())
    assert got.dtype == torch.float64 and _storage(got) != _storage(x)
    got.add_(1)
    assert torch.equal(x, torch.zeros(3))
