"""Regions whose input dims are expressions of dynamo's symbols compile under dynamic
shapes; each ran eagerly. A flattened (b * s, d) input (a MoE's experts after its
routing) binds b and s only through their product: the ints dynamo passes the region
carry them ("cannot solve s27*s77"). A [2 * s, k] input names s ("a data-dependent
size"). A Linear over C·p·p features reads C from torch's guard 16·C == 48, one over a
pooled map's 8·w² features w from 8·w² == 128."""
from __future__ import annotations

import warnings

import pytest
import sympy
import torch

from cleave.runtime import backend


class Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        b, s, d = x.shape
        h = torch.sort(x.reshape(-1, d), dim=-1).values  # unsupported: a graph break
        return self.lin(h).view(b, s, d)


def test_a_flattened_input_viewed_back_by_its_sizes():
    # the region takes b and s as ints too: they bind the symbols
    torch._dynamo.reset()
    backend.reset()  # the backend's operators are the process's: another test file's are there too
    module = Experts().eval()
    f = torch.compile(module, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in (5, 7, 9):
            x = torch.randn(2, s, 16)
            torch.testing.assert_close(f(x), module(x), rtol=1e-5, atol=1e-5)
    assert not [w for w in caught if "runs eagerly:" in str(w.message)], [str(w.message) for w in caught]
    ops = backend.context().operators.values()
    assert sum(op.stats["compiles"] + op.stats["from_cache"] for op in ops) == 1


class Patchify(torch.nn.Module):
    """ViT's patch embedding written as a reshape: a Linear over C·p·p features."""

    def __init__(self, p: int = 4):
        super().__init__()
        self.p, self.proj = p, torch.nn.Linear(3 * p * p, 32)

    def forward(self, img):
        b, c, h, w = img.shape
        p = self.p
        x = img.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return self.proj(x.reshape(b, (h // p) * (w // p), c * p * p))


def test_a_multiple_of_a_symbol_beside_a_number_reads_the_symbol_as_their_ratio():
    # torch guards 16·C == 48 for the Linear's contraction: C is read as 3
    _compiles_once_whole(Patchify().eval(), [torch.randn(2, 3, hw, hw) for hw in (16, 12)])


def _compiles_once_whole(module, inputs):
    """module under dynamic=True equals eager on each input, with no eager region and
    one compile."""
    torch._dynamo.reset()
    backend.reset()
    f = torch.compile(module, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x in inputs:
            torch.testing.assert_close(f(x), module(x), rtol=1e-5, atol=1e-5)
    ctx = backend.context()
    assert ctx.eager_regions == 0
    assert sum(op.stats["compiles"] + op.stats["from_cache"] for op in ctx.operators.values()) == 1


def test_unification_of_a_multiple_and_a_number():
    from cleave.frontends.unify import unification
    from cleave.ir import dims as D

    c = D.symbol("C")
    assert unification((16 * c, 48), {c: 3}) == ("C", 3)
    assert unification((16 * c, 40), {c: 3}) is None  # 40 / 16 is no size
    w = D.symbol("w")
    assert unification((8 * w**2, 128), {w: 4}) == ("w", 4)  # a pooled w x w map into 128 features
    assert unification((w**2 - 5 * w, -6), {w: 3}) == ("w", 3)  # the root torch traced, of two
    assert unification((8 * w**2, 128), {w: 5}) is None  # traced where it does not hold


class PooledHead(torch.nn.Module):
    """A CNN's head: a 2 x 2 pooled map of w x w flattened into a Linear's 8·4·4 features."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(torch.nn.functional.max_pool2d(torch.relu(x), 2).flatten(1))


def test_a_polynomial_in_a_symbol_beside_a_number_reads_the_symbol_as_its_root():
    # torch guards 8·(w/2)² == 128 for the Linear: the pooled width is read as 4, and
    # the region compiled (it ran eagerly: "contracted dims 8*s_by2**2 vs 128")
    _compiles_once_whole(PooledHead().eval(), [torch.randn(b, 8, 8, 8) for b in (2, 3, 5)])


def test_a_region_whose_only_input_is_a_multiple_of_a_symbol():
    # after a graph break the region takes x.view(-1, 8)'s [2 * s, 2] indices alone: s was
    # "a data-dependent size" and the region ran eagerly
    import torch.nn.functional as F

    import cleave

    def router_loss(x):
        idx = torch.topk(x.view(-1, 8), 2, dim=-1)[1]
        idx = torch.sort(idx, -1).values  # unsupported: a graph break
        return F.one_hot(idx, 8).float().sum(1).mean(0)
    f = cleave.compile(router_loss, dynamic={"x": {1: "s"}}, verbose=False)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in (5, 7):
            x = torch.randn(2, s, 8)
            torch.testing.assert_close(f(x), router_loss(x))
    assert not [w for w in caught if "capture of" in str(w.message)], [str(w.message) for w in caught]


def _dynamic(fn):
    """fn under torch.compile(dynamic=True) on a fresh backend context, and that context."""
    ctx = backend.reset()
    torch._dynamo.reset()
    return ctx, torch.compile(fn, backend="cleave", dynamic=True)


def _rows(x, n):
    return x.reshape(n, -1).softmax(-1)


def test_a_view_into_a_number_of_rows_given_as_an_int():
    # x.reshape(n, -1) of a length s gives n rows of s // n: the view's element count
    # s = n·floor(s/n) ran eagerly ("s77 = s86*floor(s77/s86)"); s is read as n times a
    # new symbol, as torch guards n | s, in one compiled graph for every (n, s // n)
    ctx, f = _dynamic(_rows)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for n, k in ((3, 3), (5, 7), (2, 9), (7, 1)):
            x = torch.randn(n * k)
            torch.testing.assert_close(f(x, n), _rows(x, n), rtol=1e-6, atol=1e-7)
    with pytest.raises(RuntimeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f(torch.randn(10), 3)  # eager raises: 3 does not divide 10
    assert ctx.eager_regions == 0 and ctx.stats()["failed"] == 0, ctx.stats()
    assert sum(op.stats["compiles"] + op.stats["from_cache"] for op in ctx.operators.values()) == 1


def _rows_of(x, y):
    return x.reshape(y.shape[0], -1).amax(1) + y


def test_a_view_into_as_many_rows_as_another_input_has():
    # x of 5·s elements into y's s rows read y's length as x's ("s17 is 15 elsewhere, but
    # 3 here"): every call ran eagerly
    ctx, f = _dynamic(_rows_of)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for s in (3, 5, 8):
            x, y = torch.randn(s * 5), torch.randn(s)
            torch.testing.assert_close(f(x, y), _rows_of(x, y), rtol=0, atol=0)
    assert ctx.eager_regions == 0 and ctx.stats()["failed"] == 0, ctx.stats()


def test_unification_of_a_quotient_by_a_symbol():
    from cleave.frontends.unify import unification
    from cleave.ir import dims as D

    s, n = D.symbol("s"), D.symbol("n")
    row = n * sympy.floor(s / n)
    assert unification((s, row), {s: 9, n: 3}) == ("s", n * D.symbol("s_per_n"))
    assert unification((s, row), {s: 10, n: 3}) is None  # traced where n does not divide s
    # traced at s = n: every multiple of n, not s read as n
    assert unification((s, row), {s: 3, n: 3}) == ("s", n * D.symbol("s_per_n"))


class CachedAttention(torch.nn.Module):
    """Attention over a KV cache passed in: the output's heads and head dim are the
    cache's, and their product meets the out projection's 8 features."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x, past_k, past_v):
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in self.qkv(x).split(d, -1))
        k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(a.transpose(1, 2).reshape(b, t, d)), k, v


def test_a_product_of_symbols_beside_a_number_reads_them_as_traced():
    # torch guards heads · head_dim == 8 (symbols of the cache's dims) for the out
    # projection: the region ran eagerly ("contracted dims s38*s39 vs 8")
    from cleave.frontends.unify import unification
    from cleave.ir import dims as D

    h, e = D.symbol("h"), D.symbol("e")
    assert unification((h * e, 8), {h: 2, e: 4}) == ("e", 4)  # the first by name
    assert unification((h * e, 8), {h: 2, e: 3}) is None  # traced where it does not hold
    torch._dynamo.reset()
    backend.reset()
    module = CachedAttention().eval()
    f = torch.compile(module, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t, past in ((3, 5), (1, 8), (4, 0)):
            x, pk, pv = torch.randn(2, t, 8), torch.randn(2, 2, past, 4), torch.randn(2, 2, past, 4)
            for got, want in zip(f(x, pk, pv), module(x, pk, pv)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert backend.context().eager_regions == 0
