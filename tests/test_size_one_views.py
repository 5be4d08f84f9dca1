"""Sizes of 1 through a layout op, in a function cleave.compile captures whole.

`.contiguous()` of a transposed tensor (nanoGPT's head merge) asks torch whether it is
contiguous already, which over dynamic sizes compares them (`b == 1`, `8*T == 8`). Those
comparisons choose strides, not values: read as the code's decisions, every call with a
batch or a sequence of 1 (one request, a decode step) ran eagerly for good. The code's own
comparisons stay facts of the graph (tests/test_capture_size_guards.py).
"""
import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F

import cleave
from cleave.ir import BindingError


def merge_heads(x):  # x: [B, h, T, d]
    B, h, T, d = x.shape
    y = F.softmax(x, -1)
    return y.transpose(1, 2).contiguous().view(B, T, h * d)


def self_attention(x, w):  # nanoGPT's causal self-attention, without the projection out
    B, T, C = x.size()
    q, k, v = (x @ w).split(C, dim=2)
    q, k, v = (t.view(B, T, 2, C // 2).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * (1.0 / (C // 2) ** 0.5)
    att = att.masked_fill(torch.ones(T, T).tril() == 0, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


def one_row_plainly(x):  # the code's own branch on a size, beside a contiguous()
    y = x.transpose(1, 2).contiguous()
    if x.shape[0] == 1:
        return y * 2
    return y.softmax(-1)


W = torch.randn(8, 24, generator=torch.Generator().manual_seed(0))
CASES = {
    "merge_heads": (merge_heads, {"x": {0: "b", 2: "T"}}, lambda b, t: (torch.randn(b, 2, t, 8),)),
    "self_attention": (self_attention, {"x": {0: "b", 1: "T"}}, lambda b, t: (torch.randn(b, t, 8), W)),
}


@pytest.mark.parametrize("name", CASES)
def test_a_contiguous_view_compiles_once_for_sizes_of_one(monkeypatch, tmp_path, name):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    fn, dynamic, example = CASES[name]
    f = cleave.compile(fn, dynamic=dynamic, verbose=False)
    sizes = [(3, 5)] + list(itertools.product((1, 2, 3, 5), repeat=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager run would warn
        for b, t in sizes:
            args = example(b, t)
            out, ref = f(*args), fn(*args)
            torch.testing.assert_close(out, ref, msg=f"{name} at b={b}, T={t}")
            assert out.stride() == ref.stride(), (name, b, t, out.stride(), ref.stride())
    st = f.stats
    assert st["operators"] == 1 and st["compiles"] + st["from_cache"] == 1 and st["failed"] == 0, st
    assert f.recaptures == 0 and f.operators[0].stats["calls"] == len(sizes), f.operators[0].stats


def test_the_graph_holds_no_fact_from_a_layout_op():
    graph = cleave.capture(merge_heads, torch.randn(3, 2, 5, 8), dynamic={"x": {0: "b", 2: "T"}})
    assert graph.constraints == []
    for b, t in [(1, 1), (1, 6), (2, 1), (0, 4)]:
        graph.check({"b": b, "T": t})


def test_the_codes_own_branch_beside_a_layout_op_stays_guarded(monkeypatch, tmp_path):
    dynamic = {"x": {0: "b", 2: "T"}}
    graph = cleave.capture(one_row_plainly, torch.randn(3, 2, 5, 8), dynamic=dynamic)
    graph.check({"b": 2, "T": 1})
    with pytest.raises(BindingError, match="the traced code's b != 1"):
        graph.check({"b": 1, "T": 5})
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    f = cleave.compile(one_row_plainly, dynamic=dynamic, verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for b, t in [(3, 5), (2, 1), (1, 5), (1, 1)]:
            x = torch.randn(b, 2, t, 8)
            torch.testing.assert_close(f(x), one_row_plainly(x), msg=f"b={b}, T={t}")
    eager = [str(w.message) for w in caught if "runs eagerly" in str(w.message)]
    assert eager == [] and f.stats["operators"] == 2 and f.stats["failed"] == 0, (eager, f.stats)  # b = 1 its own


@pytest.mark.parametrize("fn", [lambda x: x.squeeze(0) * 2, lambda x: x.squeeze() * 2, lambda x: x.squeeze((0, 1)) + 1],
                         ids=["dim", "all", "dims"])
def test_a_squeeze_of_a_dynamic_axis_is_captured_apart_where_it_drops_it(fn):
    """Traced at n = 4, squeeze keeps the axis; eager drops it at n = 1 (shape (3,), not
    (1, 3)): the graph holds for n >= 2 only, and n = 1 and n = 0 are captured static."""
    f = cleave.compile(fn, dynamic={"x": {0: "n"}})
    for n in (4, 1, 5, 0, 2):
        x = torch.randn(n, 1, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = f(x)
        want = fn(x)
        assert got.shape == want.shape and torch.equal(got, want), n
        assert not any("runs eagerly" in str(w.message) for w in caught), n
    assert f.stats["operators"] == 3 and f.stats["failed"] == 0, f.stats
