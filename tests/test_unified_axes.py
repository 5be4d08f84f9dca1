"""Axes an op needs equal that the spec names apart (SDPA's k and v lengths under
dynamic="all", or as S and T) are one symbol of the captured graph: the capture
failed, the first call ran eagerly without a word, and the rest went through dynamo,
searched again for each shape under "all"."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import cleave


def causal_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _qkv(L, S, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, L, 8, generator=g), torch.randn(2, 3, S, 8, generator=g), torch.randn(2, 3, S, 8,
                                                                                                   generator=g)


@pytest.mark.parametrize("dynamic", ["all", {"q": {2: "L"}, "k": {2: "S"}, "v": {2: "T"}}], ids=["all", "named_apart"])
def test_k_and_v_lengths_named_apart_are_one_symbol(dynamic):
    graph = cleave.capture(causal_sdpa, *_qkv(7, 11), dynamic=dynamic)
    assert graph.inputs["k"].shape[2] == graph.inputs["v"].shape[2]
    f = cleave.compile(causal_sdpa, dynamic=dynamic, verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for L, S in ((7, 11), (9, 5), (12, 13)):
            args = _qkv(L, S, seed=L)
            torch.testing.assert_close(f(*args), causal_sdpa(*args))
    assert not [w for w in caught if "eager" in str(w.message)], [str(w.message) for w in caught]
    assert f.capture_error is None and f.stats["operators"] == 1 and f.stats["compiles"] + f.stats["from_cache"] == 1, \
        f.stats


def test_a_call_where_the_unified_lengths_differ_runs_eagerly():
    """The binding checks v's length against k's: where they differ, eager computes it
    (torch 2.13's CPU SDPA reads v's first rows), with a warning."""
    f = cleave.compile(causal_sdpa, dynamic={"q": {2: "L"}, "k": {2: "S"}, "v": {2: "T"}}, verbose=False)
    f(*_qkv(7, 11))
    q, k, _ = _qkv(7, 11)
    v = torch.randn(2, 3, 12, 8)
    with pytest.warns(UserWarning, match="runs eagerly"):
        torch.testing.assert_close(f(q, k, v), causal_sdpa(q, k, v))


def append_kv(x, past_k):
    """A decode step's new key, split into heads, appended to the cache."""
    b, t, d = x.shape
    return torch.cat([past_k, x.view(b, t, 2, d // 2).transpose(1, 2)], 2)


def test_a_concat_unifies_the_dims_it_needs_equal():
    """The cache's head dim and the view's d // 2 are one under torch's guard: concat
    failed the capture naming both (`dim 3 is past_k_3 vs x_2_by2`), and the decode step
    around it ran eagerly, then through dynamo's graphs."""
    f = cleave.compile(append_kv, dynamic="all", verbose=False)
    for t, p in ((3, 4), (1, 7)):
        x, past = torch.randn(2, t, 8), torch.randn(2, 2, p, 4)
        torch.testing.assert_close(f(x, past), append_kv(x, past))
    assert f.capture_error is None and f.stats["operators"] == 1, (f.capture_error, f.stats)


def gqa_repeat_interleave(q, k, v):  # gpt-fast's GQA: k's and v's heads repeated by one group size
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1))


def test_heads_repeated_by_one_group_size_are_one_symbol():
    """g·hk beside g·hv (a MatMul's contracted dims after repeat_interleave): the capture
    failed under dynamic="all" and every call ran eagerly; the group factor is a size,
    never 0, so hv is read as hk."""
    from cleave.frontends.unify import unification
    from cleave.ir import dims as D

    g, hk, hv = D.symbol("g"), D.symbol("hk"), D.symbol("hv")
    assert unification((g * hk, g * hv), {hk: 2, hv: 2, g: 3}) == ("hv", hk)
    assert unification((g * hk, g * hv), {hk: 2, hv: 4, g: 3}) is None  # traced apart: no reading fits
    f = cleave.compile(gqa_repeat_interleave, dynamic="all", verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for b, T, L in ((2, 3, 5), (2, 5, 7), (3, 4, 9)):
            gen = torch.Generator().manual_seed(L)
            q, k, v = (torch.randn(b, h, n, 4, generator=gen) for h, n in ((4, T), (2, L), (2, L)))
            torch.testing.assert_close(f(q, k, v), gqa_repeat_interleave(q, k, v))
    assert not [w for w in caught if "eager" in str(w.message)], [str(w.message) for w in caught]
    # the group is a size under dynamic heads: repeat_interleave by it captures whole
    assert f.capture_error is None and f.stats["graph_breaks"] == 0, (f.capture_error, f.stats)


def tiled_per_vocab(penalty, logits):  # vLLM's sampler: a penalty per row repeated over the vocab
    return penalty.unsqueeze(1).repeat(1, logits.shape[-1]) * logits


def test_a_repeat_by_a_size_captures_whole():
    f = cleave.compile(tiled_per_vocab, dynamic="all", verbose=False)
    for rows, vocab in ((3, 11), (5, 13), (3, 11)):
        penalty, logits = torch.randn(rows), torch.randn(rows, vocab)
        torch.testing.assert_close(f(penalty, logits), tiled_per_vocab(penalty, logits))
    assert f.capture_error is None and f.stats["graph_breaks"] == 0, (f.capture_error, f.stats)
