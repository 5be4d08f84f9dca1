"""The FlashInfer-Trace references of the paged and ragged definitions: one loop over
requests, each request attended on its own, computed in f32 (f64 for f64 inputs).
Their source is the definitions' `reference` field (`flashinfer.reference_source`), so
every function here is self-contained apart from `attend`.

Semantics are FlashInfer's: an empty request gives output 0 and lse -inf; queries are
aligned to the end of their kv sequence under the causal mask; lse is in base 2.
MLA is GQA with one kv head whose key is the latent and rope parts side by side and
whose value is the latent.
"""
import math

import torch


def attend(q, k, v, sm_scale, causal):
    """One request: q [m, h, dk], k [n, hkv, dk], v [n, hkv, dv] -> output [m, h, dv], lse [m, h]."""
    work = torch.promote_types(q.dtype, torch.float32)
    q, k, v = q.to(work), k.to(work), v.to(work)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    logits = torch.einsum("mhd,nhd->mhn", q, k) * sm_scale
    if causal:
        m, n = q.shape[0], k.shape[0]
        future = torch.arange(n, device=q.device)[None, :] > torch.arange(m, device=q.device)[:, None] + (n - m)
        logits = logits.masked_fill(future[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, -1) / math.log(2.0)
    return torch.einsum("mhn,nhd->mhd", torch.softmax(logits, -1), v), lse


def _outputs(rows, q, dv):
    work = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(rows, q.shape[1], dv, dtype=work, device=q.device)
    return out, torch.full((rows, q.shape[1]), float("-inf"), dtype=work, device=q.device)


def _pages(cache, indices, tokens):
    """The first `tokens` rows of the listed pages, in list order."""
    return cache[indices.long()].flatten(0, 1)[:tokens]


def gqa_paged_decode(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, kv_last_page_len=None):
    page_size = k_cache.shape[1]
    out, lse = _outputs(q.shape[0], q, v_cache.shape[-1])
    for b in range(q.shape[0]):
        start, end = int(kv_indptr[b]), int(kv_indptr[b + 1])
        last = page_size if kv_last_page_len is None else int(kv_last_page_len[b])
        tokens = (end - start - 1) * page_size + last
        if end > start and tokens > 0:
            pages = kv_indices[start:end]
            out[b], lse[b] = (x[0] for x in attend(q[b:b + 1], _pages(k_cache, pages, tokens),
                                                    _pages(v_cache, pages, tokens), sm_scale, causal=False))
    return out.to(q.dtype), lse


def gqa_paged_decode_last_page(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    return gqa_paged_decode(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, kv_last_page_len)


def block_table_decode(q, k_cache, v_cache, block_tables, seq_lens, sm_scale):
    out, lse = _outputs(q.shape[0], q, v_cache.shape[-1])
    for b in range(q.shape[0]):
        tokens = int(seq_lens[b])
        if tokens > 0:
            pages = block_tables[b]
            out[b], lse[b] = (x[0] for x in attend(q[b:b + 1], _pages(k_cache, pages, tokens),
                                                    _pages(v_cache, pages, tokens), sm_scale, causal=False))
    return out.to(q.dtype), lse


def gqa_ragged_prefill_causal(q, k, v, qo_indptr, kv_indptr, sm_scale):
    out, lse = _outputs(q.shape[0], q, v.shape[-1])
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe, ks, ke = int(qo_indptr[b]), int(qo_indptr[b + 1]), int(kv_indptr[b]), int(kv_indptr[b + 1])
        if qe > qs and ke > ks:
            out[qs:qe], lse[qs:qe] = attend(q[qs:qe], k[ks:ke], v[ks:ke], sm_scale, causal=True)
    return out.to(q.dtype), lse


def gqa_paged_prefill_causal(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    page_size = k_cache.shape[1]
    out, lse = _outputs(q.shape[0], q, v_cache.shape[-1])
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe, ks, ke = int(qo_indptr[b]), int(qo_indptr[b + 1]), int(kv_indptr[b]), int(kv_indptr[b + 1])
        if qe > qs and ke > ks:
            pages = kv_indices[ks:ke]
            k, v = _pages(k_cache, pages, (ke - ks) * page_size), _pages(v_cache, pages, (ke - ks) * page_size)
            out[qs:qe], lse[qs:qe] = attend(q[qs:qe], k, v, sm_scale, causal=True)
    return out.to(q.dtype), lse


def mla_paged_decode(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    q = torch.cat([q_nope, q_pe], -1)
    k = torch.cat([ckv_cache, kpe_cache], -1)[:, :, None, :]
    out, lse = gqa_paged_decode(q, k, ckv_cache[:, :, None, :], kv_indptr, kv_indices, sm_scale)
    return out.to(q_nope.dtype), lse


def mla_paged_prefill_causal(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    q = torch.cat([q_nope, q_pe], -1)
    k = torch.cat([ckv_cache, kpe_cache], -1)[:, :, None, :]
    out, lse = gqa_paged_prefill_causal(q, k, ckv_cache[:, :, None, :], qo_indptr, kv_indptr, kv_indices, sm_scale)
    return out.to(q_nope.dtype), lse
