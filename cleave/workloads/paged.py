"""Paged and ragged attention as a serving engine calls it (issue 14): FlashInfer-Bench's
nine operators, and vLLM's block-table decode, each written the way a user writes it in
PyTorch: no Python loop over requests, but a gather through the page indices, each
token's request (its segment id) counted from the indptr, and masks.

Every program returns `(output, lse)`: output in the queries' dtype, lse in f32 and in
base 2. A request with no kv tokens gets what FlashInfer gives it: output 0, lse -inf.
The softmax is written with its guard for that case: the row max of an all -inf row is
replaced by 0, so its exponentials are 0, its sum is 0 and its log -inf, and the output
divides by 1 instead of 0.

K/V pages: `k_cache[kv_indices]` is [nnz, page_size, kv_heads, d], flattened into
nnz * page_size tokens; token t lies in page t // page_size at slot t % page_size, built
from two aranges (the IR has no integer division).
"""
from __future__ import annotations

import math

import torch

LOG2E = 1 / math.log(2.0)
NEG_INF = float("-inf")


def _softmax_attend(scores, keep, values, contract: str):
    """(softmax(scores where keep) @ values, base-2 lse) with FlashInfer's empty rows.
    scores [..., n] (f32), keep broadcasts to scores; `contract` is the einsum of the
    probabilities with `values` ("...n,n...->..."), in the values' dtype (f32 values:
    no cast; bf16 values: the probabilities cast to bf16, as Hugging Face's attention
    and SDPA do, the product back in f32)."""
    s = scores.masked_fill(~keep, NEG_INF)
    m = s.amax(-1, keepdim=True)
    m = m.masked_fill(m == NEG_INF, 0.0)  # an empty row: exp(-inf - 0) = 0, not NaN
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    out = torch.einsum(contract, e.to(values.dtype), values).float() / total.masked_fill(total == 0, 1.0)
    lse = (m + torch.log(total)).squeeze(-1) * LOG2E
    return out, lse


def _tokens(cache, kv_indices):
    """The cache rows of every listed page, in list order: [nnz * page_size, ...]."""
    pages = cache[kv_indices]
    return pages.reshape(pages.shape[0] * pages.shape[1], *pages.shape[2:])


def _page_and_slot(nnz: int, page_size: int, device):
    """Each gathered token's position in the page list, and its slot in its page."""
    page = torch.arange(nnz, device=device)[:, None].expand(nnz, page_size).reshape(nnz * page_size)
    slot = torch.arange(page_size, device=device)[None, :].expand(nnz, page_size).reshape(nnz * page_size)
    return page, slot


def _segments(indptr, count: int):
    """Segment id of each of `count` positions: how many requests end at or before it.
    Only the interior boundaries count, so an id is a valid request whatever the indptr
    holds (the search checks its candidates on random indptrs)."""
    pos = torch.arange(count, device=indptr.device)
    return (pos[:, None] >= indptr[None, 1:-1]).sum(1)


def _decode_keep(kv_indptr, kv_indices, page_size: int, kv_last_page_len=None):
    """[batch, tokens]: token t is request b's when its page lies in b's page range (and,
    on b's last page, its slot is below the page's fill)."""
    page, slot = _page_and_slot(kv_indices.shape[0], page_size, kv_indices.device)
    start, end = kv_indptr[:-1, None], kv_indptr[1:, None]
    keep = (page >= start) & (page < end)
    if kv_last_page_len is not None:
        keep = keep & ((page < end - 1) | (slot < kv_last_page_len[:, None]))
    return keep


def _gqa_attend(q, k, v, keep, sm_scale, pv_in_value_dtype: bool = False):
    """Each row of q [rows, h, d] (a decode request, or a packed prefill query) against
    the gathered tokens k, v [n, kv_heads, d], where keep [rows, n]. P·V in f32, or
    with `pv_in_value_dtype` in v's own dtype (the probabilities cast to it)."""
    rows, h, d = q.shape
    hkv = k.shape[-2]
    qg = q.reshape(rows, hkv, h // hkv, d).float()
    scores = torch.einsum("rkgd,nkd->rkgn", qg, k.float()) * sm_scale
    values = v if pv_in_value_dtype else v.float()
    out, lse = _softmax_attend(scores, keep[:, None, None, :], values, "rkgn,nkd->rkgd")
    return out.reshape(rows, h, d).to(q.dtype), lse.reshape(rows, h)


def gqa_paged_decode(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    """FlashInfer's batch decode, one-token pages: kv_indices lists each request's tokens."""
    keep = _decode_keep(kv_indptr, kv_indices, k_cache.shape[1])
    return _gqa_attend(q, _tokens(k_cache, kv_indices), _tokens(v_cache, kv_indices), keep, sm_scale)


def gqa_paged_decode_last_page(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    """FlashInfer's batch decode over multi-token pages: a request's last page holds
    kv_last_page_len of them."""
    keep = _decode_keep(kv_indptr, kv_indices, k_cache.shape[1], kv_last_page_len)
    return _gqa_attend(q, _tokens(k_cache, kv_indices), _tokens(v_cache, kv_indices), keep, sm_scale)


def block_table_decode(q, k_cache, v_cache, block_tables, seq_lens, sm_scale):
    """vLLM's paged decode: request b reads pages block_tables[b] and its first seq_lens[b]
    tokens; q [b, h, d], caches [pages, page_size, kv_heads, d]."""
    b, h, d = q.shape
    hkv, page_size = k_cache.shape[2], k_cache.shape[1]
    n = block_tables.shape[1] * page_size
    k = k_cache[block_tables].reshape(b, n, hkv, d).float()
    v = v_cache[block_tables].reshape(b, n, hkv, d).float()
    qg = q.reshape(b, hkv, h // hkv, d).float()
    scores = torch.einsum("bkgd,bnkd->bkgn", qg, k) * sm_scale
    keep = torch.arange(n, device=q.device)[None, :] < seq_lens[:, None]
    out, lse = _softmax_attend(scores, keep[:, None, None, :], v, "bkgn,bnkd->bkgd")
    return out.reshape(b, h, d).to(q.dtype), lse.reshape(b, h)


def _causal_keep(qo_indptr, kv_indptr, total_q: int, total_kv: int):
    """[total_q, total_kv]: query i of request r sees r's kv tokens up to its own position,
    queries aligned to the end of r's kv (FlashInfer's causal mask): kv token j is kept
    when kv_start[r] <= j <= i + kv_end[r] - q_end[r]."""
    seg = _segments(qo_indptr, total_q)
    start, end, q_end = kv_indptr[:-1][seg], kv_indptr[1:][seg], qo_indptr[1:][seg]
    j = torch.arange(total_kv, device=qo_indptr.device)[None, :]
    i = torch.arange(total_q, device=qo_indptr.device)[:, None]
    return (j >= start[:, None]) & (j <= i + (end - q_end)[:, None])


def gqa_ragged_prefill_causal(q, k, v, qo_indptr, kv_indptr, sm_scale):
    """FlashInfer's ragged prefill: requests' q and kv tokens packed back to back. The
    softmax is computed in f32 and its probabilities cast to v's dtype (bf16) for P·V,
    the Hugging Face way (SDPA's too): the tensor cores take that product."""
    keep = _causal_keep(qo_indptr, kv_indptr, q.shape[0], k.shape[0])
    return _gqa_attend(q, k, v, keep, sm_scale, pv_in_value_dtype=True)


def gqa_paged_prefill_causal(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    """FlashInfer's paged prefill, one-token pages: request r's kv tokens are the pages
    kv_indices[kv_indptr[r]:kv_indptr[r+1]]."""
    keep = _causal_keep(qo_indptr, kv_indptr, q.shape[0], kv_indices.shape[0])
    return _gqa_attend(q, _tokens(k_cache, kv_indices), _tokens(v_cache, kv_indices), keep, sm_scale)


def _mla(q_nope, q_pe, ckv, kpe, keep, sm_scale):
    """Absorbed MLA: scores from the latent and the rope parts, output from the latent.
    q_* [rows, h, *]; ckv [n, c], kpe [n, r]; keep [rows, n]."""
    scores = (torch.einsum("thc,nc->thn", q_nope.float(), ckv.float())
              + torch.einsum("thr,nr->thn", q_pe.float(), kpe.float())) * sm_scale
    out, lse = _softmax_attend(scores, keep[:, None, :], ckv.float(), "thn,nc->thc")
    return out.to(q_nope.dtype), lse


def mla_paged_decode(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    keep = _decode_keep(kv_indptr, kv_indices, ckv_cache.shape[1])
    return _mla(q_nope, q_pe, _tokens(ckv_cache, kv_indices), _tokens(kpe_cache, kv_indices), keep, sm_scale)


def mla_paged_prefill_causal(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    keep = _causal_keep(qo_indptr, kv_indptr, q_nope.shape[0], kv_indices.shape[0])
    return _mla(q_nope, q_pe, _tokens(ckv_cache, kv_indices), _tokens(kpe_cache, kv_indices), keep, sm_scale)
