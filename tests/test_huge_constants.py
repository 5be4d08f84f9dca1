"""A constant near f32's range (a mask's finfo.min) keeps the base-2 rewrites out:
log2(e) folded into it overflowed to -inf, and a T5 mask's (1 - m) * -inf was NaN in
every row where eager's (1 - m) * finfo.min is 0."""
import warnings

import torch

import cleave
from cleave.search.api import CandidateRejected


def t5_attention(q, k, v, mask):
    s = q @ k.transpose(-1, -2)  # T5 does not scale its scores
    s = s + (1.0 - mask[:, None, None, :].to(s.dtype)) * torch.finfo(s.dtype).min
    return s.softmax(-1) @ v


def plain_attention(q, k, v):
    return (q @ k.transpose(-1, -2) * 0.25).softmax(-1) @ v


DYN = {"q": {2: "s"}, "k": {2: "s"}, "v": {2: "s"}, "mask": {1: "s"}}


def _inputs(s, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, s, 8, generator=g) for _ in range(3))
    mask = torch.ones(2, s, dtype=torch.long)
    mask[0, -2:] = 0
    mask[1] = 0  # a fully padded sequence: eager averages v uniformly
    return q, k, v, mask


def test_finfo_min_mask_matches_eager_at_every_length():
    f = cleave.compile(t5_attention, dynamic=DYN)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CandidateRejected)  # no candidate to leave out: none is wrong
        for s, seed in ((9, 0), (5, 1), (13, 2)):
            args = _inputs(s, seed)
            expect = t5_attention(*(a.double() if a.is_floating_point() else a for a in args))
            got = f(*args)
            assert not got.isnan().any()
            torch.testing.assert_close(got.double(), expect, rtol=1e-4, atol=1e-5)


def _derivations(fn, *args, dynamic):
    g = cleave.capture(fn, *args, dynamic=dynamic)
    return [c.derivation for c in cleave.search(g).candidates]


def test_base2_kept_out_only_where_a_constant_is_huge():
    q, k, v, mask = _inputs(9, 0)
    masked = _derivations(t5_attention, q, k, v, mask, dynamic=DYN)
    assert not any("exp-base2" in d for d in masked)
    plain = _derivations(plain_attention, q, k, v, dynamic={n: DYN[n] for n in "qkv"})
    assert any("exp-base2" in d for d in plain)
