"""A constant near f32's range (a mask's finfo.min), or an exponent that may hold an
input's values at full scale (a mask passed in), keeps the base-2 rewrites out: log2(e)
folded into it overflowed to -inf, and a T5 mask's (1 - m) * -inf was NaN in every row
where eager's (1 - m) * finfo.min is 0, as was a fully masked row's -inf - -inf."""
import warnings

import pytest
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


FMIN = torch.finfo(torch.float32).min


def masked_then_scaled(s, mask):  # a temperature after an additive mask passed in
    return torch.softmax((s + mask) * 0.9, -1)


def masked_then_scaled_by(s, mask, scale):
    return torch.softmax((s + mask) * scale, -1)


def masked_by_number(s, m, neg):  # the mask's fill a Python float: a symbolic one under dynamic=True
    return torch.softmax((s + (1.0 - m) * neg) * 0.9, -1)


def scaled_logits(x):
    return torch.softmax(x * 2.0, -1)


def _padded_scores(seed):
    g = torch.Generator().manual_seed(seed)
    s, mask = torch.randn(2, 3, 5, generator=g), torch.zeros(2, 3, 5)
    mask[1] = FMIN  # a fully masked sequence: eager's rows are finite and uniform
    mask[0, :, -2:] = FMIN
    return s, mask


@pytest.mark.parametrize("compiled", ["cleave", "backend"])
def test_a_mask_passed_in_holding_finfo_min_matches_eager(compiled):
    """The mask is data, not a constant of the graph: base 2 folded log2(e) · 0.9 into
    it, -3.1e38 · 1.3 overflowed to -inf, and the fully masked rows were NaN."""
    s, mask = _padded_scores(0)
    scale = torch.tensor(0.9)
    m = (mask == 0).float()
    cases = [(masked_then_scaled, (s, mask)), (masked_then_scaled_by, (s, mask, scale)),
             (masked_by_number, (s, m, FMIN)), (scaled_logits, (torch.tensor([[1.5e38, 1e38, 0.0]]),))]
    for fn, args in cases:
        f = cleave.compile(fn, verbose=False) if compiled == "cleave" else \
            torch.compile(fn, backend="cleave", dynamic=True)
        got, want = f(*args), fn(*args)
        assert not got.isnan().any(), fn.__name__
        torch.testing.assert_close(got, want, msg=fn.__name__)


def test_base2_kept_where_the_exponent_holds_scores_and_scale_inputs():
    """A scale passed in multiplies the scores out of a MatMul, and a mask the graph
    builds holds -inf: neither makes an exponent full scale."""
    from cleave.search.api import _full_scale_exponents

    q, k, v, _ = _inputs(9, 0)
    scaled = cleave.capture(lambda q, k, scale: (q @ k.transpose(-1, -2) * scale).softmax(-1), q, k,
                            torch.tensor(0.125))
    assert _full_scale_exponents(scaled) == []
    masked = cleave.capture(masked_then_scaled, *_padded_scores(0))
    assert len(_full_scale_exponents(masked)) == 1
    halved = cleave.capture(lambda s, mask: torch.softmax((s + mask) * 0.5, -1), *_padded_scores(0))
    assert _full_scale_exponents(halved) == []  # log2(e) / 2 < 1: the mask stays finite


def _padded_attention_inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(9, 16, generator=g) for _ in range(3))
    keep = torch.ones(9, 9, dtype=torch.bool)
    keep[4] = False  # a fully padded query row: eager averages v uniformly
    return q, k, v, keep


def fill_then_scaled(q, k, v, keep):
    return torch.softmax((q @ k.T).masked_fill(~keep, -1e38) * 2.5, -1) @ v


def fill_then_scaled_by(q, k, v, keep, temperature):
    return torch.softmax((q @ k.T + (~keep).float() * -1e38) * temperature, -1) @ v


@pytest.mark.parametrize("fn, extra", [(fill_then_scaled, ()), (fill_then_scaled_by, (torch.tensor(3.0),))])
def test_a_large_fill_amplified_before_the_softmax_matches_eager(fn, extra):
    """-1e38 is under HUGE, but times 2.5 (or a temperature passed in) and then log2(e)
    it overflowed to -inf: the padded row, finite and uniform eagerly, was NaN."""
    args = _padded_attention_inputs() + extra
    got, want = cleave.compile(fn)(*args), fn(*args)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want)


def test_a_large_fill_keeps_base2_unless_amplified():
    from cleave.search.api import _full_scale_exponents

    q, k, v, keep = _padded_attention_inputs()
    bare = cleave.capture(lambda q, k, keep: torch.softmax((q @ k.T).masked_fill(~keep, -1e38), -1), q, k, keep)
    assert _full_scale_exponents(bare) == []  # -1e38 * log2(e) is finite
    scaled = cleave.capture(lambda q, k, keep: torch.softmax((q @ k.T).masked_fill(~keep, -1e38) * 2.5, -1),
                            q, k, keep)
    assert len(_full_scale_exponents(scaled)) == 1
