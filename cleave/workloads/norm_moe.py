"""LayerNorm and MoE routing."""
from __future__ import annotations

import torch

from ..ir import Graph
from .attention import safe_softmax
from .registry import Workload, register

LN_EPS = 1e-5


def _layernorm() -> Graph:
    g = Graph("layernorm")
    x = g.input("x", ("t", "n"), "bf16")
    xf = x.cast("f32")
    centered = xf - xf.mean(-1, keepdim=True)
    var = centered.square().mean(-1, keepdim=True)
    return g.output((centered * (var + LN_EPS).rsqrt()).cast("bf16"), names=["y"])


def reference_layernorm(x):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = ((xf - mean) ** 2).mean(-1, keepdim=True)
    return ((xf - mean) * torch.rsqrt(var + LN_EPS)).to(x.dtype)


def _moe_routing(top: int = 8) -> Graph:
    g = Graph("moe_routing")
    logits = g.input("logits", ("t", "e"), "f32")
    probs = safe_softmax(logits)
    weights = g.add("topk", probs, k=top, axis=1, which="values")
    experts = g.add("topk", probs, k=top, axis=1, which="indices")
    return g.output(weights / weights.sum(-1, keepdim=True), experts, names=["weights", "experts"])


def reference_moe_routing(logits, top: int = 8):
    probs = torch.softmax(logits, dim=-1)
    weights, experts = torch.topk(probs, top, dim=-1)
    return weights / weights.sum(-1, keepdim=True), experts


register(Workload("layernorm", "LayerNorm without affine over the last axis, (16384, 8192)", _layernorm,
                  reference_layernorm, {"t16384_n8192": {"t": 16384, "n": 8192}},
                  ({"t": 7, "n": 37}, {"t": 13, "n": 129}), {"x": {0: "t"}}))
register(Workload("moe_routing", "softmax over E=128 experts, top-8, renormalised weights", _moe_routing,
                  reference_moe_routing, {"t16384_e128": {"t": 16384, "e": 128}},
                  ({"t": 7, "e": 37}, {"t": 13, "e": 21}), {"logits": {0: "t"}}))
