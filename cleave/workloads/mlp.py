"""MatMul chains: plain (bf16 and f32), RMSNorm→MatMul, SwiGLU, MatMul→MatMul, MatMul→row sum, and a MatMul
with int4 weights packed two per byte."""
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


def _matmul_f32() -> Graph:
    g = Graph("matmul_f32")
    x = g.input("x", ("s", "k"), "f32")
    w = g.input("w", ("k", "n"), "f32")
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


def _matmul_w4() -> Graph:
    """X @ Wᵀ with W's int4 values packed two per uint8 along k (the low nibble first),
    stored +8, and a bf16 scale per output column: unpacked and scaled as written."""
    g = Graph("matmul_w4")
    x = g.input("x", ("s", "2*h"), "bf16")
    packed = g.input("packed", ("n", "h"), "u8")
    scale = g.input("scale", ("n",), "bf16")
    low = ((packed & 15).cast("i8") - 8).reshape("n", "h", 1)
    high = ((packed >> 4).cast("i8") - 8).reshape("n", "h", 1)
    w = g.add("concat", low, high, axis=2).reshape("n", "2*h").cast("bf16") * scale.reshape("n", 1)
    return g.output(x @ w.permute(1, 0), names=["y"])


def reference_matmul_w4(x, packed, scale):
    low = (packed & 0xF).to(torch.int8) - 8
    high = (packed >> 4).to(torch.int8) - 8
    w = torch.stack([low, high], -1).reshape(packed.shape[0], -1).to(x.dtype) * scale[:, None]
    return x @ w.t()


def _w4_inputs(graph, env, seed=0, device="cpu", dtype=None):
    """Every packed byte value, and scales of an int4 quantiser's size (1/8 of N(0, 1)
    weights' range), so the output is of the order of a bf16 MatMul's."""
    gen = torch.Generator().manual_seed(seed)
    s, h, n = env["s"], env["h"], env["n"]
    return {"x": torch.randn(s, 2 * h, generator=gen).to(dtype or torch.bfloat16).to(device),
            "packed": torch.randint(0, 256, (n, h), generator=gen, dtype=torch.uint8).to(device),
            "scale": (torch.rand(n, generator=gen) * 0.05 + 0.05).to(dtype or torch.bfloat16).to(device)}


_SMALL_MM = ({"s": 7, "k": 37, "n": 19}, {"s": 13, "k": 21, "n": 45})
_DYN_S = {"x": {0: "s"}}

register(Workload("matmul", "X (s, 4096) @ W (4096, 4096)", _matmul, lambda x, w: x @ w,
                  {"s4096": {"s": 4096, "k": 4096, "n": 4096}}, _SMALL_MM, _DYN_S))
register(Workload("matmul_f32", "X (s, 4096) @ W (4096, 4096) in f32, on bf16 tensor cores where torch's "
                  "float32 MatMul precision allows (benchmarks.build --f32-matmul)", _matmul_f32, lambda x, w: x @ w,
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
register(Workload("matmul_w4", "X (s, 4096) @ Wᵀ, W (6144, 4096) int4 packed in uint8, a scale per row of W",
                  _matmul_w4, reference_matmul_w4,
                  {"s16": {"s": 16, "h": 2048, "n": 6144}, "s4096": {"s": 4096, "h": 2048, "n": 6144}},
                  ({"s": 7, "h": 19, "n": 13}, {"s": 13, "h": 11, "n": 45}), _DYN_S, make_inputs=_w4_inputs))
