"""A small Llama-style transformer block for the runtime tests: RMSNorm, attention
with rotate-half RoPE and grouped-query heads, then a SwiGLU MLP."""
from __future__ import annotations

import math

import torch
from torch import nn


def rms_norm(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Block(nn.Module):
    def __init__(self, dim=32, heads=4, kv_heads=2, hidden=48, dtype=torch.float32, seed=0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads

        def w(*shape):
            return nn.Parameter((torch.randn(*shape, generator=gen) / math.sqrt(shape[0])).to(dtype),
                                requires_grad=False)
        self.norm1, self.norm2 = (nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False) for _ in range(2))
        self.wq, self.wk, self.wv = w(dim, dim), w(dim, kv_heads * self.head_dim), w(dim, kv_heads * self.head_dim)
        self.wo = w(dim, dim)
        self.w1, self.w3, self.w2 = w(dim, hidden), w(dim, hidden), w(hidden, dim)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = rms_norm(x, self.norm1)
        q = (h @ self.wq).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = (h @ self.wk).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = (h @ self.wv).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        attn = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
        x = x + attn.transpose(1, 2).reshape(b, s, -1) @ self.wo
        h = rms_norm(x, self.norm2)
        return x + (torch.nn.functional.silu(h @ self.w1) * (h @ self.w3)) @ self.w2


def rope(s, head_dim, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()
