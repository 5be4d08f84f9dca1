"""Causal attention variants SDPA cannot express (a user reaches for flex_attention):
tanh soft-capped scores, ALiBi's per-head linear bias, and a sliding window. Each is
written naively: the full score matrix, modified, masked, then a safe softmax."""
from __future__ import annotations

import functools
import math

import torch

from ..ir import Graph, Node
from .attention import _PREFILL, _SMALL, NEG_INF, causal_mask, safe_softmax, scale
from .registry import Workload, register

SOFTCAP = 30.0
WINDOW = 1024


def _causal_graph(name: str, modify) -> Graph:
    """Causal attention whose scaled scores pass through `modify(g, scores)` before the mask."""
    g = Graph(name)
    q, k, v = (g.input(n, ("b", "h", "s", "d"), "bf16") for n in "qkv")
    scores = modify(g, (q @ k.T).cast("f32") * scale(g, "d"))
    return g.output(safe_softmax(scores).cast("bf16") @ v, names=["o"])


def _softcap(g: Graph, scores: Node) -> Node:
    return causal_mask(g, (scores / SOFTCAP).tanh() * SOFTCAP, "s", "s")


def alibi_slopes(g: Graph) -> Node:
    """2^(-8(h+1)/H) for head h of H, shaped (h, 1, 1) to broadcast over a head's scores."""
    head = g.iota(("h", 1, 1), axis=0).cast("f32")
    heads = g.add("size", value="h", dtype="f32")
    return ((head + 1.0) * (-8.0 * math.log(2.0)) / heads).exp()


def _alibi(g: Graph, scores: Node) -> Node:
    distance = (g.iota(("s", "s"), axis=1) - g.iota(("s", "s"), axis=0)).cast("f32")  # j - i
    return causal_mask(g, scores + alibi_slopes(g) * distance, "s", "s")


def _window(window: int):
    def modify(g: Graph, scores: Node) -> Node:
        """Key j is visible from query i when i - window < j <= i."""
        i, j = g.iota(("s", "s"), axis=0), g.iota(("s", "s"), axis=1)
        return g.add("where", j > i - window, causal_mask(g, scores, "s", "s"), g.const(NEG_INF))
    return modify


def window_graph(window: int = WINDOW) -> Graph:
    """The sliding-window workload at any window (tests use one shorter than their sequences)."""
    return _causal_graph("mha_window", _window(window))


def _scores(q, k):
    return (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])


def _causal_softmax_av(scores, v, visible=None):
    s = scores.shape[-1]
    i = torch.arange(s, device=v.device)[:, None]
    j = torch.arange(s, device=v.device)[None, :]
    keep = (j <= i) if visible is None else (j <= i) & visible(i, j)
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v


def reference_softcap(q, k, v):
    return _causal_softmax_av(torch.tanh(_scores(q, k) / SOFTCAP) * SOFTCAP, v)


def reference_alibi(q, k, v):
    heads, s = q.shape[1], q.shape[2]
    slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, device=q.device) / heads)
    pos = torch.arange(s, device=q.device)
    bias = slopes[:, None, None] * (pos[None, :] - pos[:, None])  # slope_h * (j - i)
    return _causal_softmax_av(_scores(q, k) + bias.float(), v)


def reference_window(q, k, v, window: int = WINDOW):
    return _causal_softmax_av(_scores(q, k), v, visible=lambda i, j: j > i - window)


_DYN = {"q": {0: "b", 2: "s"}, "k": {0: "b", 2: "s"}, "v": {0: "b", 2: "s"}}

register(Workload(
    "mha_softcap", f"causal attention with tanh soft-capped scores ({SOFTCAP:g} * tanh(s / {SOFTCAP:g}))",
    lambda: _causal_graph("mha_softcap", _softcap), reference_softcap, _PREFILL, _SMALL, _DYN))
register(Workload(
    "mha_alibi", "causal attention with ALiBi's per-head linear bias slope_h * (j - i)",
    lambda: _causal_graph("mha_alibi", _alibi), reference_alibi, _PREFILL, _SMALL, _DYN))
register(Workload(
    "mha_window", f"causal sliding-window attention: the last {WINDOW} keys",
    window_graph, functools.partial(reference_window, window=WINDOW), _PREFILL, _SMALL, _DYN))
