"""MatMul chains: plain, RMSNorm→MatMul, SwiGLU, MatMul→MatMul, MatMul→row sum."""
from __future__ import annotations

import torch

from ..ir import Graph
from .registry import Workload, register

RMS_EPS = 1e-6


def _matmul() -> Graph:
    g = Graph("matmul")
    x = g.input("x", ("s", "k"), "bf16")
    w = g.input("w", ("k", "n"), "bf16")
    return g.output(x @ w, names=["y"])


def _rmsnorm_matmul() -> Graph:
    g = Graph("rmsnorm_matmul")
    x = g.input("x", ("s", "k"), "bf16")
    w = g.input("w", ("k", "n"), "bf16")
    xf = x.cast("f32")
    rms = (xf.square().mean(-1, keepdim=True) + RMS_EPS).rsqrt()
    return g.output((xf * rms).cast("bf16") @ w, names=["y"])


def reference_rmsnorm_matmul(x, w):
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    return normed.to(x.dtype) @ w


def _swiglu() -> Graph:
    g = Graph("swiglu")
    x = g.input("x", ("s", "k"), "bf16")
    w1 = g.input("w1", ("k", "n"), "bf16")
    w2 = g.input("w2", ("k", "n"), "bf16")
    return g.output(((x @ w1).silu() * (x @ w2)), names=["y"])


def _matmul_matmul() -> Graph:
    g = Graph("matmul_matmul")
    x = g.input("x", ("n", "s", "d"), "bf16")
    w1 = g.input("w1", ("n", "d", "L"), "bf16")
    w2 = g.input("w2", ("n", "L", "d"), "bf16")
    return g.output(((x @ w1) @ w2), names=["y"])


def _matmul_rowsum() -> Graph:
    g = Graph("matmul_rowsum")
    x = g.input("x", ("s", "k"), "bf16")
    w = g.input("w", ("k", "n"), "bf16")
    return g.output((x @ w).cast("f32").sum(-1), names=["y"])


_SMALL_MM = ({"s": 7, "k": 37, "n": 19}, {"s": 13, "k": 21, "n": 45})
_DYN_S = {"x": {0: "s"}}

register(Workload("matmul", "X (s, 4096) @ W (4096, 4096)", _matmul, lambda x, w: x @ w,
                  {"s4096": {"s": 4096, "k": 4096, "n": 4096}}, _SMALL_MM, _DYN_S))
register(Workload("rmsnorm_matmul", "RMSNorm(X) @ W, X (s, 4096), W (4096, 6144)", _rmsnorm_matmul,
                  reference_rmsnorm_matmul,
                  {"s16": {"s": 16, "k": 4096, "n": 6144}, "s4096": {"s": 4096, "k": 4096, "n": 6144}},
                  _SMALL_MM, _DYN_S))
register(Workload("swiglu", "silu(X @ W1) * (X @ W2), X (s, 4096), W (4096, 14336)", _swiglu,
                  lambda x, w1, w2: torch.nn.functional.silu(x @ w1) * (x @ w2),
                  {"s4096": {"s": 4096, "k": 4096, "n": 14336}}, _SMALL_MM, _DYN_S))
register(Workload("matmul_matmul", "(X @ W1) @ W2 per batch-head, X (b*h, s, 128), W1 (b*h, 128, L)",
                  _matmul_matmul, lambda x, w1, w2: (x @ w1) @ w2,
                  {"bh64_s1024_L1024": {"n": 64, "s": 1024, "d": 128, "L": 1024}},
                  ({"n": 2, "s": 9, "d": 16, "L": 37}, {"n": 3, "s": 5, "d": 32, "L": 21}),
                  {"x": {1: "s"}}))
register(Workload("matmul_rowsum", "rowsum(X @ W), X (s, 4096), W (4096, 4096)", _matmul_rowsum,
                  lambda x, w: (x @ w).float().sum(-1),
                  {"s4096": {"s": 4096, "k": 4096, "n": 4096}}, _SMALL_MM, _DYN_S))
