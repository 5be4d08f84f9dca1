"""A graph whose default tiles fit no partition is tiled where it is held whole by
default: attention over 131 tokens, its heads merged and projected, ran eagerly (the
scores' 131 keys and the rows of their row max each took one 256-wide tile)."""
import warnings

import torch
import torch.nn.functional as F

import cleave


def attention_then_projection(q, k, v, wo):
    b, h, t, d = q.shape
    scores = torch.matmul(q, k.transpose(2, 3)) * d ** -0.5
    out = torch.matmul(F.softmax(scores, dim=-1), v)
    return out.transpose(1, 2).reshape(b, t, h * d) @ wo


def test_131_tokens_compile_and_match():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 131, 12, generator=g) for _ in range(3))
    wo = torch.randn(48, 48, generator=g)
    f = cleave.compile(attention_then_projection)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "could not compile ... running eagerly" would raise
        got = f(q, k, v, wo)
    expect = attention_then_projection(q.double(), k.double(), v.double(), wo.double())
    torch.testing.assert_close(got.double(), expect, rtol=1e-4, atol=1e-4)
    assert f.stats["compiles"] >= 1 and not f.stats.get("graph_breaks")
