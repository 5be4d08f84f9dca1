"""A capture on another branch of its sizes gets its own operator, even where its graph
is the same.

A document-masked prefill first called with 3 sequences (cu_seqlens of 4 entries)
carries torch's range guard `4 <= B1` (the slice `cu[1:-1]` kept at 2 or more). A call
with 1 or 2 sequences was captured again, to the same graph text, and the context
handed back the first operator, guard and all: the call ran eagerly, for good. The
operator's key now holds the graph's constraints."""
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import torch

import cleave


def document_causal(q, k, v, cu):
    t = q.shape[0]
    pos = torch.arange(t)
    seg = (pos[:, None] >= cu[None, 1:-1]).sum(1)
    keep = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("hij,jhd->ihd", torch.softmax(scores.masked_fill(~keep, float("-inf")), -1), v)


def test_fewer_sequences_than_the_first_call_compile():
    f = cleave.compile(document_causal, dynamic={"q": {0: "t"}, "k": {0: "t"}, "v": {0: "t"}, "cu": {0: "b1"}},
                       verbose=False)
    gen = torch.Generator().manual_seed(4)
    for t, cu in ((33, [0, 10, 20, 33]), (33, [0, 20, 33]), (33, [0, 33]), (17, [0, 9, 17]), (65, [0, 5, 9, 40, 65])):
        q, k, v = (torch.randn(t, 3, 24, generator=gen) for _ in range(3))
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="cleave")  # an eager call warns
            got = f(q, k, v, torch.tensor(cu))
        want = document_causal(q.double(), k.double(), v.double(), torch.tensor(cu))
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    assert f.stats["operators"] == 2, f.stats  # 3 or more sequences, and fewer
