"""Transformer layers as users write them, for the layer benchmark and its CPU tests.

One decoder layer each of GPT-2 small, Llama-3-8B and Qwen3-32B (which adds an
RMSNorm on each head's q and k), in two ways: attention through
`F.scaled_dot_product_attention`, as users write it today, and naive attention
(`softmax(q kᵀ / √d + causal mask) v`), as the Cleave paper's baselines did. Each
has its real widths and tiny ones (`tiny=True`) for the interpreter on CPU.
`TinyModel` stacks a few layers and an LM head, for the logits' fidelity.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    name: str
    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    style: str  # "gpt2": LayerNorm, GELU MLP, biases; "llama": RMSNorm, RoPE, SwiGLU
    qk_norm: bool = False


CONFIGS = {
    "gpt2": Config("gpt2", 768, 12, 12, 64, 3072, "gpt2"),
    "llama3-8b": Config("llama3-8b", 4096, 32, 8, 128, 14336, "llama"),
    "qwen3-32b": Config("qwen3-32b", 5120, 64, 8, 128, 25600, "llama", qk_norm=True),
}
# The same shapes at interpreter scale: 16-wide heads (tl.dot's minimum), the real head ratios.
TINY = {
    "gpt2": Config("gpt2", 64, 4, 4, 16, 128, "gpt2"),
    "llama3-8b": Config("llama3-8b", 64, 4, 2, 16, 96, "llama"),
    "qwen3-32b": Config("qwen3-32b", 80, 8, 2, 16, 160, "llama", qk_norm=True),
}


def config(name: str, tiny: bool = False) -> Config:
    return (TINY if tiny else CONFIGS)[name]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope(seq: int, head_dim: int, dtype=torch.float32, device="cpu", base: float = 500000.0):
    """cos and sin, (seq, head_dim), rotate-half layout."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device)


def attention(q, k, v, naive: bool):
    """Causal attention over (b, heads, s, d), kv heads repeated for grouped queries."""
    if not naive:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    s = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")).float(), dim=-1).to(q.dtype) @ v


class Layer(nn.Module):
    """One pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(.)).
    forward(x) for GPT-2 (learned positions live outside the layer), forward(x, cos, sin)
    for the RoPE models."""

    def __init__(self, cfg: Config, naive: bool = False):
        super().__init__()
        self.cfg, self.naive = cfg, naive
        d, hd = cfg.dim, cfg.head_dim
        gpt2 = cfg.style == "gpt2"
        norm = (lambda: nn.LayerNorm(d)) if gpt2 else (lambda: RMSNorm(d))
        self.norm1, self.norm2 = norm(), norm()
        self.q = nn.Linear(d, cfg.heads * hd, bias=gpt2)
        self.k = nn.Linear(d, cfg.kv_heads * hd, bias=gpt2)
        self.v = nn.Linear(d, cfg.kv_heads * hd, bias=gpt2)
        self.o = nn.Linear(cfg.heads * hd, d, bias=gpt2)
        if gpt2:
            self.fc, self.proj = nn.Linear(d, cfg.hidden), nn.Linear(cfg.hidden, d)
        else:
            self.gate = nn.Linear(d, cfg.hidden, bias=False)
            self.up = nn.Linear(d, cfg.hidden, bias=False)
            self.down = nn.Linear(cfg.hidden, d, bias=False)
        self.q_norm = RMSNorm(hd) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd) if cfg.qk_norm else None

    def forward(self, x, cos=None, sin=None):
        cfg = self.cfg
        b, s, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = self.k(h).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v(h).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if cos is not None:
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        a = attention(q, k, v, self.naive)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        h = self.norm2(x)
        if cfg.style == "gpt2":
            return x + self.proj(F.gelu(self.fc(h), approximate="tanh"))
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyModel(nn.Module):
    """A few layers and an LM head over token embeddings: the logits' fidelity."""

    def __init__(self, cfg: Config, layers: int = 2, vocab: int = 96, naive: bool = False):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(vocab, cfg.dim)
        self.layers = nn.ModuleList(Layer(cfg, naive) for _ in range(layers))
        self.norm = nn.LayerNorm(cfg.dim) if cfg.style == "gpt2" else RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, vocab, bias=False)

    def forward(self, tokens, cos=None, sin=None):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin) if cos is not None else layer(x)
        return self.head(self.norm(x)).float()


# Small whole models at real widths: (layer config, layers, vocabulary); Llama-3's
# vocabulary, so the LM head is the real one.
MODELS = {"llama3-8b-2l": ("llama3-8b", 2, 128256)}


def make_layer(name: str, naive: bool, tiny: bool = False, dtype=torch.bfloat16, device="cpu", seed: int = 0):
    """A layer (or a model of MODELS) with seeded weights (scaled so activations stay
    O(1)), inference only."""
    torch.manual_seed(seed)
    if name in MODELS:
        base, layers, vocab = MODELS[name]
        layer = TinyModel(config(base, tiny), layers, vocab, naive)
    else:
        layer = Layer(config(name, tiny), naive)
    for p in layer.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=1 / math.sqrt(p.shape[1]))
    return layer.to(dtype=dtype, device=device).requires_grad_(False).eval()


def layer_inputs(name: str, batch: int, seq: int, tiny: bool = False, dtype=torch.bfloat16, device="cpu",
                 seed: int = 0) -> tuple:
    """(x,) for GPT-2, (x, cos, sin) for the RoPE models; token ids in place of x for a
    model of MODELS."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if name in MODELS:
        base, _, vocab = MODELS[name]
        cfg = config(base, tiny)
        x = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    else:
        cfg = config(name, tiny)
        x = torch.randn(batch, seq, cfg.dim, generator=gen).to(dtype=dtype, device=device)
    if cfg.style == "gpt2":
        return (x,)
    return (x, *rope(seq, cfg.head_dim, dtype, device))
