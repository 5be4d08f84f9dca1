"""Prefill attention workloads, all with safe softmax (row max subtracted)."""
from __future__ import annotations

import math

import torch

from ..ir import Graph, Node
from .registry import Workload, random_inputs, register

NEG_INF = float("-inf")


def scale(g: Graph, head_dim) -> Node:
    """1/sqrt(head_dim), as a graph scalar so it stays correct for any bound d."""
    return g.add("size", value=head_dim, dtype="f32").rsqrt()


def safe_softmax(scores: Node, axis: int = -1) -> Node:
    m = scores.max(axis, keepdim=True)
    e = (scores - m).exp()
    return e / e.sum(axis, keepdim=True)


def causal_mask(g: Graph, scores: Node, rows, cols) -> Node:
    """Keep key j for query i when j <= i (queries and keys start at position 0)."""
    i = g.iota((rows, cols), axis=0)
    j = g.iota((rows, cols), axis=1)
    return g.add("where", j <= i, scores, g.const(NEG_INF, scores.dtype))


def _attention_graph(name: str, causal: bool, grouped: bool) -> Graph:
    g = Graph(name)
    if grouped:
        q = g.input("q", ("b", "hkv*g", "s", "d"), "bf16")
        k = g.input("k", ("b", "hkv", "s", "d"), "bf16")
        v = g.input("v", ("b", "hkv", "s", "d"), "bf16")
        # q heads of one kv head attend with it: (b, hkv, g, s, d) against (b, hkv, 1, s, d).
        qg = q.reshape("b", "hkv", "g", "s", "d")
        kg, vg = k.unsqueeze(2), v.unsqueeze(2)
    else:
        qg = g.input("q", ("b", "h", "s", "d"), "bf16")
        kg = g.input("k", ("b", "h", "s", "d"), "bf16")
        vg = g.input("v", ("b", "h", "s", "d"), "bf16")
    scores = (qg @ kg.T).cast("f32") * scale(g, "d")
    if causal:
        scores = causal_mask(g, scores, "s", "s")
    o = (safe_softmax(scores).cast("bf16") @ vg)
    if grouped:
        o = o.reshape("b", "hkv*g", "s", "d")
    return g.output(o, names=["o"])


def reference_attention(q, k, v, causal=False):
    """Plain PyTorch: GQA by repeating kv heads, explicit safe softmax."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
    if causal:
        s = scores.shape[-1]
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).to(q.dtype) @ v


def _ref(causal):
    def fn(q, k, v):
        return reference_attention(q, k, v, causal=causal)
    return fn


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _rope(g: Graph, x: Node, cos: Node, sin: Node) -> Node:
    """Rotate-half RoPE: x*cos + rotate_half(x)*sin, computed in f32."""
    xf = x.cast("f32")
    d = x.shape[-1]
    first, second = xf.slice(-1, 0, d / 2), xf.slice(-1, d / 2, d)
    rotated = g.add("concat", -second, first, axis=x.rank - 1)
    return (xf * cos + rotated * sin).cast(x.dtype)


def _rope_attention_graph() -> Graph:
    g = Graph("rope_attention_causal")
    q = g.input("q", ("b", "h", "s", "d"), "bf16")
    k = g.input("k", ("b", "h", "s", "d"), "bf16")
    v = g.input("v", ("b", "h", "s", "d"), "bf16")
    cos = g.input("cos", ("s", "d"), "f32")
    sin = g.input("sin", ("s", "d"), "f32")
    qr, kr = _rope(g, q, cos, sin), _rope(g, k, cos, sin)
    scores = causal_mask(g, (qr @ kr.T).cast("f32") * scale(g, "d"), "s", "s")
    return g.output(safe_softmax(scores).cast("bf16") @ v, names=["o"])


def reference_rope_attention(q, k, v, cos, sin):
    def rope(x):
        xf = x.float()
        return (xf * cos + rotate_half(xf) * sin).to(x.dtype)
    return reference_attention(rope(q), rope(k), v, causal=True)


def rope_tables(s: int, d: int, base: float = 10000.0, device="cpu"):
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def _rope_inputs(graph, env, seed=0, device="cpu", dtype=None):
    out = random_inputs(graph, env, seed=seed, device=device, dtype=dtype)
    out["cos"], out["sin"] = rope_tables(env["s"], env["d"], device=device)
    return out


_PREFILL = {"prefill": {"b": 4, "h": 32, "s": 4096, "d": 128}}
_GQA_PREFILL = {"prefill": {"b": 4, "hkv": 8, "g": 4, "s": 4096, "d": 128}}
_SMALL = ({"b": 1, "h": 3, "s": 37, "d": 16}, {"b": 2, "h": 2, "s": 21, "d": 32})
_GQA_SMALL = ({"b": 1, "hkv": 2, "g": 3, "s": 37, "d": 16}, {"b": 2, "hkv": 1, "g": 2, "s": 21, "d": 32})
_DYN = {"q": {0: "b", 2: "s"}, "k": {0: "b", 2: "s"}, "v": {0: "b", 2: "s"}}  # a serving step batches prompts

for _causal in (False, True):
    _suffix = "_causal" if _causal else ""
    register(Workload(
        f"mha{_suffix}", f"multi-head prefill attention{', causal' if _causal else ''}",
        lambda c=_causal, n=f"mha{_suffix}": _attention_graph(n, c, grouped=False),
        _ref(_causal), _PREFILL, _SMALL, _DYN))
    register(Workload(
        f"gqa{_suffix}", f"grouped-query prefill attention (32 q heads, 8 kv heads){', causal' if _causal else ''}",
        lambda c=_causal, n=f"gqa{_suffix}": _attention_graph(n, c, grouped=True),
        _ref(_causal), _GQA_PREFILL, _GQA_SMALL, _DYN))

register(Workload(
    "rope_attention_causal", "rotate-half RoPE on q and k, then causal attention",
    _rope_attention_graph, reference_rope_attention, _PREFILL,
    ({"b": 1, "h": 3, "s": 37, "d": 16}, {"b": 2, "h": 2, "s": 21, "d": 32}),
    {"q": {2: "s"}, "k": {2: "s"}, "v": {2: "s"}, "cos": {0: "s"}, "sin": {0: "s"}},
    make_inputs=_rope_inputs))
