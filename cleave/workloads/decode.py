"""Decode attention: one query token per sequence against a long KV cache."""
from __future__ import annotations

import math

import torch

from ..ir import Graph
from .attention import safe_softmax, scale
from .registry import Workload, register


def _grouped_decode_graph(name: str) -> Graph:
    g = Graph(name)
    q = g.input("q", ("b", "hkv*g", 1, "d"), "bf16")
    k = g.input("k", ("b", "hkv", "L", "d"), "bf16")
    v = g.input("v", ("b", "hkv", "L", "d"), "bf16")
    qg = q.reshape("b", "hkv", "g", "d")  # the q heads that share one kv head are its rows
    scores = (qg @ k.T).cast("f32") * scale(g, "d")
    o = safe_softmax(scores).cast("bf16") @ v
    return g.output(o.reshape("b", "hkv*g", 1, "d"), names=["o"])


def reference_decode(q, k, v):
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1).to(q.dtype) @ v


def _mla_decode_graph() -> Graph:
    g = Graph("mla_decode")
    q_nope = g.input("q_nope", ("b", "h", "c"), "bf16")
    q_pe = g.input("q_pe", ("b", "h", "r"), "bf16")
    ckv = g.input("ckv", ("b", "L", "c"), "bf16")
    kpe = g.input("kpe", ("b", "L", "r"), "bf16")
    scores = (q_nope @ ckv.T).cast("f32") + (q_pe @ kpe.T).cast("f32")
    scores = scores * g.add("size", value="c+r", dtype="f32").rsqrt()
    return g.output(safe_softmax(scores).cast("bf16") @ ckv, names=["o"])


def reference_mla_decode(q_nope, q_pe, ckv, kpe):
    scores = (q_nope @ ckv.transpose(-2, -1)).float() + (q_pe @ kpe.transpose(-2, -1)).float()
    scores = scores / math.sqrt(q_nope.shape[-1] + q_pe.shape[-1])
    return torch.softmax(scores, dim=-1).to(q_nope.dtype) @ ckv


_GQA_PRESETS = {
    "b8_L8192": {"b": 8, "hkv": 8, "g": 4, "L": 8192, "d": 128},
    "b64_L4096": {"b": 64, "hkv": 8, "g": 4, "L": 4096, "d": 128},
    "b1_L131072": {"b": 1, "hkv": 8, "g": 4, "L": 131072, "d": 128},
}
_DYN = {"q": {0: "b"}, "k": {0: "b", 2: "L"}, "v": {0: "b", 2: "L"}}

register(Workload(
    "gqa_decode", "GQA decode: q (b, 32, 1, 128) against k, v (b, 8, L, 128)",
    lambda: _grouped_decode_graph("gqa_decode"), reference_decode, _GQA_PRESETS,
    ({"b": 2, "hkv": 2, "g": 3, "L": 77, "d": 16}, {"b": 3, "hkv": 1, "g": 4, "L": 45, "d": 32}), _DYN))
register(Workload(
    "mqa_decode", "MQA decode: 32 q heads share 1 kv head",
    lambda: _grouped_decode_graph("mqa_decode"), reference_decode,
    {name: {**env, "hkv": 1, "g": 32} for name, env in _GQA_PRESETS.items()},
    ({"b": 2, "hkv": 1, "g": 5, "L": 77, "d": 16}, {"b": 3, "hkv": 1, "g": 3, "L": 45, "d": 32}), _DYN))
register(Workload(
    "mla_decode", "MLA decode (absorbed): scores from latent and rope parts, output from the latent",
    _mla_decode_graph, reference_mla_decode,
    {"b64_L4096": {"b": 64, "h": 128, "c": 512, "r": 64, "L": 4096}},
    ({"b": 2, "h": 3, "c": 16, "r": 8, "L": 53}, {"b": 1, "h": 5, "c": 32, "r": 16, "L": 29}),
    {"q_nope": {0: "b"}, "q_pe": {0: "b"}, "ckv": {0: "b", 1: "L"}, "kpe": {0: "b", 1: "L"}}))
