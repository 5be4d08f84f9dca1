"""The baselines a user would reach for, per workload: eager PyTorch, torch.compile,
SDPA on each backend, flex_attention, Hugging Face's RoPE compiled, cuBLAS, and
torch.compile's max-autotune for the GEMM family, and for the paged definitions padded
SDPA and paged flex_attention (benchmarks/paged_baselines.py). Plain PyTorch only; which one is
strongest is decided by measurement (benchmarks/strongest.py)."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from cleave.workloads.attention_variants import SOFTCAP, WINDOW
from cleave.workloads.flashinfer import DEFINITIONS

from . import paged_baselines
from .strongest import Baseline, compiles_within

GEMM = {"matmul", "matmul_f32", "rmsnorm_matmul", "swiglu", "matmul_matmul", "matmul_rowsum", "matmul_w4"}
# Autotuning that takes longer than this is not what a user waits for.
AUTOTUNE_BUDGET_S = 60.0


@dataclass(frozen=True)
class Attention:
    """What an attention workload computes, in the terms SDPA and flex_attention take."""
    causal: bool = False
    window: int | None = None  # a causal sliding window: keys less than `window` positions back
    softcap: float | None = None  # scores become softcap * tanh(scores / softcap)
    alibi: bool = False  # scores gain -slope_h * (q_idx - kv_idx), slopes 2^(-8(h+1)/H)

    @property
    def sdpa_expressible(self) -> bool:
        return self.window is None and self.softcap is None and not self.alibi


ATTENTION = {
    "mha": Attention(), "gqa": Attention(),
    "mha_causal": Attention(causal=True), "gqa_causal": Attention(causal=True),
    "gqa_decode": Attention(), "mqa_decode": Attention(),
    "mha_softcap": Attention(causal=True, softcap=SOFTCAP), "mha_alibi": Attention(causal=True, alibi=True),
    "mha_window": Attention(causal=True, window=WINDOW),
}
ROPE_ATTENTION = {"rope_attention_causal": Attention(causal=True)}


def _sdpa_backends() -> list[tuple[str, object]]:
    from torch.nn.attention import SDPBackend

    return [("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def _on_each_sdpa_backend(name: str, fn: Callable, **fields) -> list[Baseline]:
    """`fn` (which calls SDPA) once per backend; the math backend only if none of them runs.
    `fields`: the Baselines' other fields (prepare, outputs, secondary)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = [Baseline(f"{name} {label}", fn, context=functools.partial(sdpa_kernel, [backend]), **fields)
           for label, backend in _sdpa_backends()]
    return out + [Baseline(f"{name} math", fn, context=functools.partial(sdpa_kernel, [SDPBackend.MATH]),
                           fallback=True, **fields)]


def _sdpa(variant: Attention) -> Callable:
    def run(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=variant.causal,
                                              enable_gqa=q.shape[1] != k.shape[1])
    return run


def flex_mods(variant: Attention, heads: int, device) -> tuple[Callable | None, Callable | None]:
    """flex_attention's (mask_mod, score_mod) for a variant; None where it needs none."""
    def keep(b, h, q_idx, kv_idx):
        inside = q_idx >= kv_idx
        if variant.window is not None:
            inside = inside & (q_idx - kv_idx < variant.window)
        return inside

    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=device)

    def score_mod(score, b, h, q_idx, kv_idx):
        if variant.softcap is not None:
            score = variant.softcap * torch.tanh(score / variant.softcap)
        if variant.alibi:
            score = score - slopes[h] * (q_idx - kv_idx)
        return score

    masked = variant.causal or variant.window is not None
    plain = variant.softcap is None and not variant.alibi
    return (keep if masked else None), (None if plain else score_mod)


def _flex(variant: Attention) -> Callable:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    built: dict = {}

    def run(q, k, v):
        key = (q.shape[1], q.shape[2], k.shape[2], q.device)
        # Built once per shape, as a model builds its block mask once per batch.
        if key not in built:
            keep, score_mod = flex_mods(variant, q.shape[1], q.device)
            mask = keep and create_block_mask(keep, None, None, q.shape[2], k.shape[2], device=q.device)
            built[key] = mask, score_mod
        mask, score_mod = built[key]
        return compiled(q, k, v, score_mod=score_mod, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    return run


def _rotate_half(x):
    # As Hugging Face's Llama writes it.
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _hf_rope(q, k, cos, sin):
    # Hugging Face hands the layers cos/sin in the activations' dtype (bf16), broadcast over
    # batch and heads, so the rotation runs in bf16, not in the workload's f32.
    cos, sin = cos.to(q.dtype)[None, None], sin.to(q.dtype)[None, None]
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _after_rope(rope: Callable, attend: Callable) -> Callable:
    def run(q, k, v, cos, sin):
        qr, kr = rope(q, k, cos, sin)
        return attend(qr, kr, v)
    return run


def _mla_sdpa(q_nope, q_pe, ckv, kpe):
    # Absorbed MLA as one attention: keys are [ckv, kpe] shared by every head, values ckv.
    q = torch.cat([q_nope, q_pe], -1).unsqueeze(2)
    k = torch.cat([ckv, kpe], -1).unsqueeze(1)
    scale = 1.0 / math.sqrt(q.shape[-1])
    return F.scaled_dot_product_attention(q, k, ckv.unsqueeze(1), scale=scale, enable_gqa=True).squeeze(2)


_CUBLAS = {
    "matmul": lambda x, w: torch.mm(x, w),
    "matmul_f32": lambda x, w: torch.mm(x, w),
    "matmul_matmul": lambda x, w1, w2: torch.bmm(torch.bmm(x, w1), w2),
}


# A fused workload's GEMMs alone on cuBLAS, without the norm or the activation: what
# the fused kernel cannot run under while its GEMM runs at cuBLAS's rate.
_FLOORS = {
    "rmsnorm_matmul": ("floor: the GEMM alone on cuBLAS (x·W, no norm)", lambda x, w: torch.mm(x, w)),
    "swiglu": ("floor: the two GEMMs alone on cuBLAS (x·W1, x·W2)", lambda x, w1, w2: (torch.mm(x, w1), torch.mm(x, w2))),
}


def _dequantised_once(inputs: dict) -> dict:
    """matmul_w4's weight unpacked and scaled to x's dtype, outside the timing."""
    from cleave.workloads.mlp import reference_matmul_w4

    eye = torch.eye(inputs["packed"].shape[1] * 2, dtype=inputs["x"].dtype, device=inputs["x"].device)
    return {"x": inputs["x"], "w": reference_matmul_w4(eye, inputs["packed"], inputs["scale"]).t().contiguous()}


def for_workload(name: str, reference: Callable) -> list[Baseline]:
    """Fresh baselines for one preset: compiled ones compile for its shapes alone."""
    out = [Baseline("eager", reference), Baseline("torch.compile", torch.compile(reference, dynamic=False))]
    if name in _CUBLAS:
        out.append(Baseline("cuBLAS", _CUBLAS[name]))
    if name in _FLOORS:
        out.append(Baseline(*_FLOORS[name], floor=True))
    if name in ROPE_ATTENTION:  # the attention alone on the unrotated q and k, on SDPA's fastest backend here
        from torch.nn.attention import SDPBackend, sdpa_kernel

        attend = _sdpa(ROPE_ATTENTION[name])
        out.append(Baseline("floor: SDPA cuDNN without the RoPE", lambda q, k, v, cos, sin: attend(q, k, v),
                            context=functools.partial(sdpa_kernel, [SDPBackend.CUDNN_ATTENTION]), floor=True))
    if name == "matmul_w4":  # the bf16 GEMM on weights dequantised ahead: not the same work, a reference
        out.append(Baseline("cuBLAS on W dequantised once", lambda x, w: x @ w.t(), prepare=_dequantised_once,
                            secondary=True))
    if name in GEMM:
        autotuned = torch.compile(reference, mode="max-autotune-no-cudagraphs", dynamic=False)
        preflight = functools.partial(compiles_within, name, "max-autotune-no-cudagraphs", AUTOTUNE_BUDGET_S)
        out.append(Baseline("torch.compile max-autotune", autotuned, first_call_budget_s=AUTOTUNE_BUDGET_S,
                            preflight=preflight))
    if name in ATTENTION:
        variant = ATTENTION[name]
        if variant.sdpa_expressible:
            out += _on_each_sdpa_backend("SDPA", _sdpa(variant))
        out.append(Baseline("flex_attention", _flex(variant)))
    if name in ROPE_ATTENTION:
        variant = ROPE_ATTENTION[name]
        rope = torch.compile(_hf_rope, dynamic=False)
        out += _on_each_sdpa_backend("compiled HF RoPE + SDPA", _after_rope(rope, _sdpa(variant)))
        out.append(Baseline("compiled HF RoPE + flex_attention", _after_rope(rope, _flex(variant))))
    if name == "mla_decode":
        out += _on_each_sdpa_backend("SDPA", _mla_sdpa)
    if name in DEFINITIONS:
        out += paged_baselines.for_definition(name, _on_each_sdpa_backend)
    return out
