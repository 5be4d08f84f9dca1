"""What each workload is measured against, in the same run: eager PyTorch (the
workload's reference function), torch.compile of it, and for attention SDPA and
flex_attention. Only plain PyTorch here; nothing from cleave's compiler."""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from .attention import rotate_half

ATTENTION = {"mha", "gqa", "mha_causal", "gqa_causal"}
DECODE = {"gqa_decode", "mqa_decode"}


def _sdpa(causal: bool):
    def run(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return run


def _flex(causal: bool):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention)
    masks: dict = {}

    def causal_mod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def run(q, k, v):
        mask = None
        if causal:
            key = (q.shape[2], k.shape[2])
            if key not in masks:
                masks[key] = create_block_mask(causal_mod, None, None, q.shape[2], k.shape[2], device=q.device)
            mask = masks[key]
        return compiled(q, k, v, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    return run


def _rope(x, cos, sin):
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)


def _with_rope(attend):
    def run(q, k, v, cos, sin):
        return attend(_rope(q, cos, sin), _rope(k, cos, sin), v)
    return run


def baselines(name: str, reference: Callable) -> dict[str, Callable]:
    """Callables taking the workload's inputs by name, keyed by baseline name."""
    out = {"eager": reference, "torch.compile": torch.compile(reference)}
    if name in ATTENTION or name in DECODE:
        causal = name.endswith("_causal")
        out["sdpa"] = _sdpa(causal)
        out["flex"] = _flex(causal)
    elif name == "rope_attention_causal":
        out["rope+sdpa"] = _with_rope(_sdpa(True))
        out["rope+flex"] = _with_rope(_flex(True))
    elif name == "mla_decode":
        def mla_sdpa(q_nope, q_pe, ckv, kpe):
            q = torch.cat([q_nope, q_pe], -1).unsqueeze(2)
            k = torch.cat([ckv, kpe], -1).unsqueeze(1)
            scale = 1.0 / math.sqrt(q.shape[-1])
            return F.scaled_dot_product_attention(q, k, ckv.unsqueeze(1), scale=scale, enable_gqa=True).squeeze(2)
        out["sdpa"] = mla_sdpa
    return out
