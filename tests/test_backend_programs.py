"""Programs written as users write them, through torch.compile(backend="cleave"), that
ran eagerly (or, for some inputs, could not run) before: SDPA under automatic dynamic
shapes, assignment into a slice, a size passed across a graph break, arange with a
step. Each compiles with no graph break and matches eager."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from backend_case import close as _close
from backend_case import ctx  # noqa: F401 (a fixture)


def test_automatic_dynamic_sdpa_reads_k_and_v_lengths_as_one(ctx):
    """Under automatic dynamic shapes (the default: a second length recompiles with
    sizes symbolic) dynamo gives q, k and v a length symbol each and guards none equal;
    SDPA's k·v contraction needs k's and v's one. They become one symbol (fx_graph),
    the layer compiles instead of running eagerly, and inputs where they differ run
    eagerly, where PyTorch says what is wrong."""
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=0.3, is_causal=True)

    f = torch.compile(attend, backend="cleave")
    with torch.no_grad():
        for n in (5, 7, 9):
            q, k, v = (torch.randn(2, 2, n, 8) for _ in range(3))
            _close(f(q, k, v), attend(q.double(), k.double(), v.double()).float(), 1e-4)
        st = ctx.stats()
        assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st
        # k and v of different lengths: torch 2.13's CPU kernel reads v's first rows,
        # another build may raise; either way the call is PyTorch's own
        q, k, v = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 11, 8)
        try:
            want, raised = attend(q, k, v), None
        except RuntimeError as err:
            want, raised = None, type(err)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if raised is None:
                assert torch.equal(f(q, k, v), want)
            else:
                with pytest.raises(raised):
                    f(q, k, v)
        assert any("do not fit the compiled graph" in str(w.message) for w in caught)


def test_assignment_into_a_slice_compiles_exactly(ctx):
    """`z[:, 0] = v` and `z[1:3] = w` on a fresh tensor: functionalization leaves a
    functional `aten.copy` (src broadcast to the slice, cast to its dtype) beside the
    scatter's decomposition; it ran eagerly as unsupported before."""
    def write(x, y, row):
        z = torch.zeros(x.shape[0], 6, dtype=torch.bfloat16)
        z[:, 1:4] = x[:, :3] * 3
        z[0] = row
        z[1:3, 5] = 7
        return z

    f = torch.compile(write, backend="cleave")
    with torch.no_grad():
        for n in (5, 7, 9):
            x, y, row = torch.randn(n, 6), torch.randn(n, 6), torch.randn(6)
            assert torch.equal(f(x, y, row), write(x, y, row))
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_a_region_that_passes_a_size_across_a_graph_break_compiles(ctx):
    """Across a graph break dynamo passes sizes as well as tensors: the region before
    `view_as_complex` (unsupported) returns 2*s along with the softmax. Its sizes are
    evaluated from the call's input dims; before, the region ran eagerly ('output 1 is
    2*s27, not a tensor')."""
    def f(x):
        y = x.softmax(-1)
        n2 = x.shape[1] * 2
        z = torch.view_as_complex(y.reshape(-1, 2).contiguous())
        return z.real.reshape(-1)[:n2] * 3 + y.reshape(-1)[:n2]

    c = torch.compile(f, backend="cleave")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (6, 8, 10):
            x = torch.randn(4, n)
            _close(c(x), f(x.double()).float(), 1e-5)
    st = ctx.stats()
    assert st["failed"] == 0 and not any(u.startswith("capture of") for u in st["unsupported"]), st
    assert any("view_as_complex" in u for u in st["unsupported"]), st


def test_complex_and_polar_are_graph_breaks_named_by_the_op(ctx):
    """torch.complex and torch.polar decomposed into in-place writes of a complex
    tensor's parts, on which AOTAutograd failed an assertion: the frame ran eagerly with
    that assertion as its warning. Now each is a graph break naming the op, and the real
    parts around it compile."""
    def f(a, b):
        return torch.complex(a.exp(), b).abs() * 2

    def g(a, b):
        return torch.view_as_real(torch.polar(a.abs() + 1, b)).sum(-1)

    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for fn in (f, g):
            a, b = torch.randn(3, 7), torch.randn(3, 7)
            _close(torch.compile(fn, backend="cleave")(a, b), fn(a, b), 1e-5)
    said = [str(w.message) for w in caught]
    assert not any("AOTAutograd" in m for m in said), said
    st = ctx.stats()
    assert any("aten.complex" in u for u in st["unsupported"]) and any("aten.polar" in u for u in st["unsupported"]), st


def test_a_write_into_a_diagonal_is_a_graph_break_named_by_the_op(ctx):
    """`x.diagonal().fill_(0)` and `torch.diagonal_scatter` went through torch's wider
    decomposition table, which writes the diagonal of a clone with prims.copy_to:
    AOTAutograd refused the graph and the whole frame ran eagerly, its warning an
    internal assertion. Kept whole, diagonal_scatter is a graph break naming the op, and
    the ops around it compile."""
    def fill(x):
        x = x.exp()
        x.diagonal().fill_(0)
        return x * 2

    def scatter(x):
        return torch.diagonal_scatter(x.exp(), torch.ones(4)) * 2

    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for fn in (fill, scatter):
            x = torch.randn(4, 4)
            _close(torch.compile(fn, backend="cleave")(x), fn(x), 1e-5)
    said = [str(w.message) for w in caught]
    assert not any("functional graph" in m or "AOTAutograd" in m for m in said), said
    st = ctx.stats()
    assert any("diagonal_scatter" in u for u in st["unsupported"]) and st["operators"] >= 2, st


def test_arange_with_a_step_compiles_exactly(ctx):
    """RoPE's inverse frequencies (`arange(0, d, 2)`) and counting down from a dynamic
    extent: start + i·step in i64, cast once (ran eagerly: 'only step 1')."""
    def f(x):
        n = x.shape[-1]
        inv = 1.0 / (10000 ** (torch.arange(0, n, 2).float() / n))
        return (x * torch.arange(1, 2 * n + 1, 2, dtype=torch.float32) + torch.arange(n, 0, -1),
                x[..., ::2] * inv)

    c = torch.compile(f, backend="cleave")
    with torch.no_grad():
        for n in (6, 8, 10):
            x = torch.randn(3, n)
            for got, want in zip(c(x), f(x)):
                _close(got, want, 1e-6)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_a_decode_step_appending_to_its_caches_compiles(ctx):
    """k and v caches of one length, each with the new token concatenated: SDPA's
    contraction needs s + 1 and t + 1 equal, so s and t become one symbol."""
    def step(q, k_cache, v_cache, k_new, v_new):
        k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
        return F.scaled_dot_product_attention(q, k, v)

    f = torch.compile(step, backend="cleave")
    with torch.no_grad():
        for n in (5, 7, 9):
            args = (torch.randn(2, 4, 1, 8), torch.randn(2, 4, n, 8), torch.randn(2, 4, n, 8),
                    torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8))
            _close(f(*args), step(*(a.double() for a in args)).float(), 1e-5)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st
