"""Attention written the way Hugging Face's Llama code writes it, through
torch.compile(backend="cleave", dynamic=True): position ids from the padding mask's
cumsum, RoPE with rotate_half, grouped KV heads through repeat_interleave, and an
additive causal plus padding mask over left-padded rows. The cumsum ran eagerly before
this session (a graph break in every such model); now the whole forward compiles, exact
against eager at three lengths."""
from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest
import torch
from torch import nn

from cleave.runtime import backend


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaStyleAttention(nn.Module):
    def __init__(self, d=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)))

    def forward(self, x, attention_mask):
        b, t, _ = x.shape
        position_ids = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(self.heads // self.kv_heads, 1), v.repeat_interleave(self.heads // self.kv_heads, 1)
        causal = torch.triu(torch.full((t, t), float("-inf")), 1)
        padding = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + causal + padding
        return self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1))


def test_llama_style_attention_with_left_padding_compiles_whole():
    torch._dynamo.reset()
    ctx = backend.reset()
    torch.manual_seed(0)
    layer = LlamaStyleAttention().eval()
    compiled = torch.compile(layer, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # a graph break or fallback warns
        for t in (5, 9, 17):
            x = torch.randn(2, t, 32)
            mask = torch.ones(2, t, dtype=torch.long)
            mask[1, : t // 2] = 0  # the second row is left-padded
            torch.testing.assert_close(compiled(x, mask), layer(x, mask), rtol=1e-4, atol=1e-5)
    stats = ctx.stats()
    assert stats["graph_breaks"] == 0 and stats["failed"] == 0 and stats["operators"] >= 1, stats


def _gqa_by_repeat(q, kv):
    k, v = kv.unbind(0)  # one tensor's heads: dynamo gives k and v one symbol, as projections of one x do
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_kv_heads_repeated_by_a_symbolic_group_size_compile():
    """GQA written with repeat_interleave by q_heads // kv_heads, under dynamic=True: the
    kv heads become kv_heads * floor(q_heads/kv_heads), and SDPA's lowering read the
    group size with int(), a TypeError that escaped to the user."""
    ctx = backend.reset()
    f = torch.compile(_gqa_by_repeat, backend="cleave", dynamic=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # no graph break, no fallback
        for heads, kv_heads, s in ((6, 2, 7), (6, 3, 5)):
            gen = torch.Generator().manual_seed(heads + s)
            q = torch.randn(2, heads, s, 8, generator=gen)
            kv = torch.randn(2, 2, kv_heads, s, 8, generator=gen)
            torch.testing.assert_close(f(q, kv), _gqa_by_repeat(q, kv), rtol=1e-5, atol=1e-5)
    assert ctx.stats()["failed"] == 0, ctx.stats()


def _sdpa_gqa(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def test_sdpa_enable_gqa_with_dynamic_head_counts_compiles():
    """Under dynamic=True the head counts are symbols, and `enable_gqa=True` (what recent
    transformers pass) ran eagerly every call: the group is floor(hq / hkv) heads, and a
    call whose kv heads do not divide its q heads runs eagerly, where torch raises."""
    ctx = backend.reset()
    f = torch.compile(_sdpa_gqa, backend="cleave", dynamic=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for heads, kv_heads, s in ((4, 2, 5), (6, 2, 9), (6, 3, 7), (4, 2, 5)):
            gen = torch.Generator().manual_seed(heads + s)
            q = torch.randn(2, heads, s, 8, generator=gen)
            k, v = (torch.randn(2, kv_heads, s, 8, generator=gen) for _ in range(2))
            torch.testing.assert_close(f(q, k, v), _sdpa_gqa(q, k, v), rtol=1e-5, atol=1e-5)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 3, 5, 8)
    with pytest.raises(RuntimeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f(q, k, k)
    assert ctx.stats()["failed"] == 0 and ctx.stats()["unsupported"] == [], ctx.stats()


def _sdpa_mqa(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_sdpa_enable_gqa_with_a_static_kv_head_count_compiles(kv_heads):
    """Under dynamic=True torch keeps MQA's one kv head static (and the q count a symbol):
    it ran eagerly ("needs both head counts static, or both dynamic"). The kv head is
    repeated floor(hq / hkv) times, one graph for every q head count."""
    ctx = backend.reset()
    torch._dynamo.reset()
    f = torch.compile(_sdpa_mqa, backend="cleave", dynamic=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for heads, s in ((4, 8), (6, 5), (10, 9)):
            gen = torch.Generator().manual_seed(heads + s)
            q = torch.randn(2, heads, s, 16, generator=gen)
            k, v = (torch.randn(2, kv_heads, s, 16, generator=gen) for _ in range(2))
            torch.testing.assert_close(f(q, k, v), _sdpa_mqa(q, k, v), rtol=1e-5, atol=1e-5)
    assert ctx.eager_regions == 0 and ctx.stats()["failed"] == 0 and ctx.stats()["unsupported"] == [], ctx.stats()
