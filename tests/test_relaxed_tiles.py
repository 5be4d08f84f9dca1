"""A graph whose default tiles fit no partition is tiled where it is held whole by
default: attention over 131 tokens, its heads merged and projected, ran eagerly (the
scores' 131 keys and the rows of their row max each took one 256-wide tile)."""
import warnings

import pytest
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


def chunked_cross_entropy(h, w, y, chunks=16):
    """A vocabulary's cross-entropy in chunks, as a user writes it to bound memory."""
    parts = [torch.logsumexp(h @ wc.T, dim=-1) for wc in w.chunk(chunks, dim=0)]
    lse = torch.logsumexp(torch.stack(parts, dim=-1), dim=-1)
    return (lse - (h * w[y]).sum(-1)).mean()


def test_a_horizontal_fusion_no_tiling_fits_is_split():
    """The chunks' logits h @ w_c.T, materialised, are one horizontal fusion over one
    grid, each chunk's operands held in shared memory: 16 chunks over a hidden size of
    300 (a 512-wide tile) needed 1 MB, no partition left a cut, and the loss ran eagerly
    ("no tiling ... fits", with no reason). The fusion is now split in halves until each
    fits; a kernel that fits no tiling says which budget it is over, and by how much."""
    from cleave.ir import Candidate
    from cleave.ir.graph import rebuild
    from cleave.scheduler import H200, schedule
    from cleave.scheduler.api import _partition
    from cleave.scheduler.codegen import fact_table
    from kernel_check import run_and_check

    g = torch.Generator().manual_seed(0)
    h, w, y = torch.randn(3, 300, generator=g), torch.randn(2400, 300, generator=g) * 0.05, torch.tensor([5, 0, 2399])
    graph = rebuild(cleave.capture(chunked_cross_entropy, h, w, y))
    with pytest.raises(cleave.BindingError, match=r"no tiling of kernel \w+ fits the target \(\d+ bytes of shared "
                                                  r"memory at 1 stage\(s\), over the H200's 232448 a block, tiled X0="):
        _partition(graph, fact_table(Candidate(graph).facts), {}, set(), [], H200, relaxed=True)
    plan = schedule(graph, {}, top_k=1)[0]
    assert len(plan.kernels) > 2
    run_and_check(graph, plan, {}, seed=1)
