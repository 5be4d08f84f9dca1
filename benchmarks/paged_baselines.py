"""Baselines for the paged and ragged definitions (`cleave/workloads/flashinfer.py`,
issue 14), as a user without a paged kernel would write them, and the bytes a decode
step must move (its bandwidth against the copy ceiling).

- **Padded SDPA**: gather each request's K/V (through its CSR page list, block table or
  ragged offsets) into a dense [batch, kv_heads, max_kv, d] batch, queries likewise
  (prefill), then `F.scaled_dot_product_attention` with a boolean mask: key padding, and
  for prefill the causal bound with queries aligned to the end of their kv, as FlashInfer
  aligns them. Two forms: `enable_gqa=True`, and the query heads of each kv head folded
  into the query length (no GQA argument, so every backend that takes a mask can run it).
  The timed region is the gather, SDPA and the scatter back to packed rows; SDPA alone on
  pre-gathered K/V is a secondary number. SDPA cannot return the lse: these return the
  output alone and are checked on it.
- **Paged flex_attention**: compiled flex_attention straight over the physical cache, the
  whole batch as one query sequence against every token of the pool, with a mask_mod
  mapping a physical token to its request and logical position (pages are not shared
  between requests). Returns output and lse.

The per-step metadata (gather indices, masks, the block mask, host-side lengths and
sm_scale) is built once per batch, untimed (`Baseline.prepare`): a serving engine builds
it once per step for all layers.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cleave.workloads.flashinfer import DEFINITIONS, KINDS

from .strongest import Baseline

LOG2E = 1 / math.log(2.0)
COPY_CEILING_BYTES_PER_S = 4.3e12  # the H200's measured copy bandwidth


@dataclass(frozen=True)
class Layout:
    """One step's requests, padded: token ids into the flattened kv store per request."""
    tokens: torch.Tensor  # [b, max_kv] ids into the store (0 past a request's length)
    q_rows: torch.Tensor | None  # [b, max_q] packed query rows (prefill); None in decode
    seg: torch.Tensor  # [rows]: each packed query row's request
    pos: torch.Tensor  # [rows]: its position among its request's queries
    keep: torch.Tensor  # [b, 1, max_q, max_kv]; a row that sees nothing keeps everything
    row_valid: torch.Tensor  # [rows]: False where the definition gives output 0, lse -inf
    bound: torch.Tensor  # [rows]: the last logical kv position a row sees (-1: none)
    kv_len: torch.Tensor  # [b]
    scale: float
    groups: int  # query heads per kv head


def _kind(name: str) -> str:
    return DEFINITIONS[name][0]


def _store(kind: str, inputs: dict) -> dict[str, torch.Tensor]:
    """The kv tensors with their tokens on the first axis: [tokens, (kv_heads,) d]."""
    if kind.startswith("mla"):
        return {"ckv": inputs["ckv_cache"].flatten(0, 1), "kpe": inputs["kpe_cache"].flatten(0, 1)}
    if kind == "gqa_ragged_prefill":
        return {"k": inputs["k"], "v": inputs["v"]}
    return {"k": inputs["k_cache"].flatten(0, 1), "v": inputs["v_cache"].flatten(0, 1)}


def _queries(kind: str, inputs: dict) -> torch.Tensor:
    return torch.cat([inputs["q_nope"], inputs["q_pe"]], -1) if kind.startswith("mla") else inputs["q"]


def layout(name: str, inputs: dict) -> Layout:
    """The padded layout of a call's requests (host syncs allowed: built once per step)."""
    kind = _kind(name)
    q = _queries(kind, inputs)
    dev = q.device
    if kind == "block_table_decode":
        ps = inputs["k_cache"].shape[1]
        kv_len = inputs["seq_lens"].long()
        pages = inputs["block_tables"].long()
        page_of = lambda b, j: pages.gather(1, (j // ps).clamp(max=pages.shape[1] - 1).expand(b, -1))  # noqa: E731
    elif kind == "gqa_ragged_prefill":
        ps, indptr = 1, inputs["kv_indptr"].long()
        kv_len = indptr[1:] - indptr[:-1]
        page_of = lambda b, j: indptr[:-1, None] + j  # noqa: E731
    else:
        cache = inputs["ckv_cache" if kind.startswith("mla") else "k_cache"]
        ps, indptr, indices = cache.shape[1], inputs["kv_indptr"].long(), inputs["kv_indices"].long()
        count = indptr[1:] - indptr[:-1]
        kv_len = count * ps
        if "kv_last_page_len" in inputs:
            kv_len = torch.where(count > 0, (count - 1) * ps + inputs["kv_last_page_len"].long(), 0)
        padded = torch.cat([indices, indices.new_zeros(1)])  # index nnz: a harmless page 0
        page_of = lambda b, j: padded[(indptr[:-1, None] + j // ps).clamp(max=indices.shape[0])]  # noqa: E731
    b = kv_len.shape[0]
    max_kv = max(int(kv_len.max()) if b else 0, 1)
    j = torch.arange(max_kv, device=dev)[None, :]
    inside = j < kv_len[:, None]
    paged = kind not in ("gqa_ragged_prefill",)
    tokens = (page_of(b, j) * ps + j % ps) if paged else page_of(b, j)
    tokens = torch.where(inside, tokens, 0)
    if KINDS[kind].prefill:
        qo = inputs["qo_indptr"].long()
        q_len = qo[1:] - qo[:-1]
        max_q = max(int(q_len.max()) if b else 0, 1)
        a = torch.arange(max_q, device=dev)
        q_rows = torch.where(a[None, :] < q_len[:, None], qo[:-1, None] + a, 0)
        rows = torch.arange(q.shape[0], device=dev)
        seg = torch.searchsorted(qo[1:], rows, right=True)
        pos = rows - qo[:-1][seg]
        pad_bound = a[None, :] + (kv_len - q_len)[:, None]  # [b, max_q]: FlashInfer's end alignment
        pad_bound = torch.minimum(pad_bound, kv_len[:, None] - 1)
    else:
        max_q, q_rows = 1, None
        seg, pos = torch.arange(b, device=dev), torch.zeros(b, dtype=torch.long, device=dev)
        pad_bound = (kv_len - 1)[:, None]
    keep = j[:, None, :] <= pad_bound[:, :, None]  # [b, max_q, max_kv]
    sees = keep.any(-1)
    keep = keep | ~sees[:, :, None]
    bound = torch.where(sees, pad_bound, -1)[seg, pos]
    heads = q.shape[1]
    kv_heads = 1 if kind.startswith("mla") else inputs["k" if "k" in inputs else "k_cache"].shape[-2]
    return Layout(tokens, q_rows, seg, pos, keep[:, None], sees[seg, pos], bound, kv_len,
                  float(inputs["sm_scale"]), heads // kv_heads)


def _gather(kind: str, inputs: dict, lay: Layout):
    """(q [b, h, max_q, dk], k [b, hkv, max_kv, dk], v [b, hkv, max_kv, dv]) of the step."""
    store = _store(kind, inputs)
    if kind.startswith("mla"):
        ckv = store["ckv"][lay.tokens]
        k, v = torch.cat([ckv, store["kpe"][lay.tokens]], -1)[:, None], ckv[:, None]
    else:
        k, v = store["k"][lay.tokens].transpose(1, 2), store["v"][lay.tokens].transpose(1, 2)
    q = _queries(kind, inputs)
    q = q[:, :, None] if lay.q_rows is None else q[lay.q_rows].transpose(1, 2)
    return q, k, v


def _unpad(out: torch.Tensor, lay: Layout) -> torch.Tensor:
    """[b, h, max_q, dv] -> packed rows [rows, h, dv], 0 where the definition gives 0."""
    rows = out.transpose(1, 2)[lay.seg, lay.pos]
    return torch.where(lay.row_valid[:, None, None], rows, 0)


def _sdpa(q, k, v, lay: Layout, folded: bool):
    if not folded:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=lay.keep, scale=lay.scale, enable_gqa=True)
    b, h, m, dk = q.shape
    hkv, g = k.shape[1], lay.groups
    qf = q.reshape(b, hkv, g, m, dk).transpose(2, 3).reshape(b, hkv, m * g, dk)
    mask = lay.keep if m == 1 else lay.keep.repeat_interleave(g, 2)
    out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, scale=lay.scale)
    return out.reshape(b, hkv, m, g, -1).transpose(2, 3).reshape(b, h, m, -1)


def _prepare_padded(name: str, inputs: dict, pregather: bool) -> dict:
    lay = layout(name, inputs)
    if pregather:
        return {"gathered": _gather(_kind(name), inputs, lay), "lay": lay}
    return {"inputs": inputs, "lay": lay}


def padded_sdpa(name: str, folded: bool):
    """Gather, SDPA, scatter back (the timed region); takes `_prepare_padded`'s output."""
    kind = _kind(name)

    def run(inputs, lay):
        q, k, v = _gather(kind, inputs, lay)
        return _unpad(_sdpa(q, k, v, lay, folded), lay)
    return run


def pregathered_sdpa(folded: bool):
    def run(gathered, lay):
        return _unpad(_sdpa(*gathered, lay, folded), lay)
    return run


def _flex_lse_kwargs() -> dict:
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # before torch 2.9
        return {"return_lse": True}
    return {"return_aux": AuxRequest(lse=True)}


def _prepare_flex(name: str, inputs: dict) -> dict:
    """The paged block mask over the physical pool: token t of the pool belongs to request
    owner[t] at logical position logical[t]; query row r (of request seg[r]) sees it when
    the owners match and logical[t] <= bound[r]."""
    from torch.nn.attention.flex_attention import create_block_mask

    kind = _kind(name)
    lay = layout(name, inputs)
    store = next(iter(_store(kind, inputs).values()))
    dev = store.device
    b, max_kv = lay.tokens.shape
    inside = torch.arange(max_kv, device=dev)[None, :] < lay.kv_len[:, None]
    # The tables reach past the sequences to whole blocks of 128 (flex's), in case a kernel
    # evaluates the mask_mod on a partial block's tail: owner -1 there, row's request -2.
    owner = torch.full((_whole_blocks(store.shape[0]),), -1, dtype=torch.long, device=dev)
    logical = torch.zeros_like(owner)
    owner[lay.tokens[inside]] = torch.arange(b, device=dev)[:, None].expand(b, max_kv)[inside]
    logical[lay.tokens[inside]] = torch.arange(max_kv, device=dev)[None, :].expand(b, max_kv)[inside]
    seg = torch.full((_whole_blocks(lay.seg.shape[0]),), -2, dtype=torch.long, device=dev)
    bound = torch.full_like(seg, -1)
    seg[:lay.seg.shape[0]], bound[:lay.seg.shape[0]] = lay.seg, lay.bound

    def paged(batch, head, q_idx, kv_idx):
        return (owner[kv_idx] == seg[q_idx]) & (logical[kv_idx] <= bound[q_idx])

    mask = create_block_mask(paged, None, None, lay.seg.shape[0], store.shape[0], device=dev)
    return {"inputs": inputs, "mask": mask, "scale": lay.scale}


def _whole_blocks(n: int, block: int = 128) -> int:
    return -(-max(n, 1) // block) * block


def paged_flex(name: str, compiled: bool = True):
    """flex_attention over the physical pool; (output, base-2 lse) as the definition's."""
    from torch.nn.attention.flex_attention import flex_attention

    kind = _kind(name)
    attend = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
    lse_kwargs = _flex_lse_kwargs()

    def run(inputs, mask, scale):
        store = _store(kind, inputs)
        q = _queries(kind, inputs).transpose(0, 1)[None]  # [1, h, rows, dk]
        if kind.startswith("mla"):
            k = torch.cat([store["ckv"], store["kpe"]], -1)[None, None]
            v = store["ckv"][None, None]
        else:
            k, v = store["k"].transpose(0, 1)[None], store["v"].transpose(0, 1)[None]
        out, aux = attend(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1], **lse_kwargs)
        lse = aux if isinstance(aux, torch.Tensor) else aux.lse
        return out[0].transpose(0, 1), lse[0].transpose(0, 1).float() * LOG2E
    return run


def for_definition(name: str, on_each_sdpa_backend) -> list[Baseline]:
    """The paged baselines of one definition (`on_each_sdpa_backend`: baselines.py's)."""
    out = []
    for folded, label in ((False, "padded SDPA (enable_gqa)"), (True, "padded SDPA (GQA folded)")):
        out += on_each_sdpa_backend(label, padded_sdpa(name, folded), outputs=1,
                                    prepare=functools.partial(_prepare_padded, name, pregather=False))
    out += [b for b in on_each_sdpa_backend("pre-gathered SDPA (GQA folded)", pregathered_sdpa(True), outputs=1,
                                            secondary=True,
                                            prepare=functools.partial(_prepare_padded, name, pregather=True))
            if not b.fallback]
    out.append(Baseline("paged flex_attention", paged_flex(name), prepare=functools.partial(_prepare_flex, name)))
    return out


def decode_bytes(name: str, inputs: dict) -> int | None:
    """Bytes a decode step must move: the K and V pages its requests use (MLA's latent
    pages once: they are keys and values), q, and the outputs (output in q's dtype, lse
    in f32). Index tensors are left out (4 bytes a page). None for prefill definitions."""
    kind = _kind(name)
    if KINDS[kind].prefill:
        return None
    if kind.startswith("mla"):
        q, caches = _queries(kind, inputs), [inputs["ckv_cache"], inputs["kpe_cache"]]
        dv = inputs["ckv_cache"].shape[-1]
    else:
        q, caches, dv = inputs["q"], [inputs["k_cache"], inputs["v_cache"]], inputs["v_cache"].shape[-1]
    if kind == "block_table_decode":
        ps = inputs["k_cache"].shape[1]
        pages = int(((inputs["seq_lens"].long() + ps - 1) // ps).sum())
    else:
        pages = inputs["kv_indices"].shape[0]
    per_page = sum(c[0].numel() * c.element_size() for c in caches)
    rows, heads = q.shape[:2]
    outputs = rows * heads * (dv * q.element_size() + 4)
    return pages * per_page + q.numel() * q.element_size() + outputs


def copy_ceiling_fraction(nbytes: int | None, ms: float | None) -> float | None:
    """nbytes / (ms) as a fraction of the copy ceiling; None where either is missing."""
    if not nbytes or not ms:
        return None
    return nbytes / (ms * 1e-3) / COPY_CEILING_BYTES_PER_S
