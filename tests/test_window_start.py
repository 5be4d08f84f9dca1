"""A sliding window's first keys: a split chunk's range starts at key 0, not below it.

Split over a dynamic key axis, a chunk runs relative to its row tile's range (the
union of its rows' windows, `bounds._window`). For the first rows of a sliding window
that range started at i - W + 1 < 0, and nothing masked a negative key: the kernel read
before K's and V's first row and took what lay there as keys (errors of 2 to 1e35, or
NaN). K and V here are views into buffers whose leading rows are NaN, so a read before
their start shows (the prefill's are contiguous views, which the launch reads in place;
the decode's batch is copied first, and a read before the copy finds whatever lies there)."""
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

import cleave

W = 5


def window_prefill(q, k, v):
    s, n = q.shape[2], k.shape[2]
    i = torch.arange(s)[:, None] + (n - s)
    j = torch.arange(n)[None, :]
    keep = (j <= i) & (j > i - W)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, -1) @ v


def window_decode(q, k_cache, v_cache, pos):
    j = torch.arange(k_cache.shape[2])[None, :]
    keep = (j <= pos[:, None]) & (j > pos[:, None] - W)
    scores = q @ k_cache.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    return torch.softmax(scores, -1) @ v_cache


def _after_poison(shape, gen, pad=8):
    """A tensor of `shape` whose storage is preceded by NaN rows along axis 2."""
    b, h, n, d = shape
    buf = torch.full((b, h, n + pad, d), float("nan"))
    buf[:, :, pad:] = torch.randn(shape, generator=gen)
    return buf[:, :, pad:]


def _check(got, want):
    assert not got.isnan().any()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_a_windows_first_rows_read_no_key_before_the_first():
    f = cleave.compile(window_prefill, dynamic={"q": {2: "s"}, "k": {2: "n"}, "v": {2: "n"}}, verbose=False)
    gen = torch.Generator().manual_seed(7)
    for s, n in ((33, 33), (7, 33), (65, 65)):
        q = torch.randn(1, 1, s, 24, generator=gen)
        k, v = _after_poison((1, 1, n, 24), gen), _after_poison((1, 1, n, 24), gen)
        assert k.is_contiguous() and k.storage_offset() == 8 * 24  # read in place: NaN before it
        _check(f(q, k, v), window_prefill(q.double(), k.double(), v.double()))
    assert f.stats["graph_breaks"] == 0 and f.stats["failed"] == 0, f.stats


def test_a_decode_request_early_in_its_window_reads_no_key_before_the_first():
    f = cleave.compile(window_decode, dynamic={"q": {0: "b"}, "k_cache": {0: "b", 2: "n"},
                                               "v_cache": {0: "b", 2: "n"}, "pos": {0: "b"}}, verbose=False)
    gen = torch.Generator().manual_seed(8)
    for n, pos in ((33, [20, 2, 32, 0]), (65, [64, 3, 30])):
        b = len(pos)
        q = torch.randn(b, 3, 1, 24, generator=gen)
        k, v = _after_poison((b, 3, n, 24), gen), _after_poison((b, 3, n, 24), gen)
        p = torch.tensor(pos)
        _check(f(q, k, v, p), window_decode(q.double(), k.double(), v.double(), p))
    assert f.stats["graph_breaks"] == 0 and f.stats["failed"] == 0, f.stats
