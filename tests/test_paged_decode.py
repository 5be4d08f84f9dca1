"""Paged decode attention written in plain PyTorch, compiled by cleave.compile (issue 14).

K/V live in a page cache [num_pages, page_size, kv_heads, d]; a request reads its pages
through a block table (vLLM) or a CSR page list (FlashInfer). Positions at or past a
request's length are masked with -inf, so whole split chunks, and for an empty request
whole rows, hold nothing else. An empty request's output is NaN, as eagerly (softmax
over nothing but -inf); FlashInfer's kernel returns 0 there instead. Each call has fresh
random inputs at small odd shapes and is checked against eager PyTorch in fp64.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import cleave
from kernel_check import assert_loops_bounded_by, check_outputs, plan_sources

PAGE = 3  # tokens per page: static, as in a serving engine


def paged_decode(q, k_cache, v_cache, block_tables, seq_lens):
    """q [b, h, d]; caches [pages, PAGE, hkv, d]; block_tables [b, max_blocks]; seq_lens [b]."""
    b, h, d = q.shape
    hkv = k_cache.shape[2]
    n = block_tables.shape[1] * k_cache.shape[1]
    k = k_cache[block_tables].reshape(b, n, hkv, d).transpose(1, 2).repeat_interleave(h // hkv, dim=1)
    v = v_cache[block_tables].reshape(b, n, hkv, d).transpose(1, 2).repeat_interleave(h // hkv, dim=1)
    s = (q.unsqueeze(2) @ k.transpose(-1, -2)).squeeze(2) / math.sqrt(d)            # [b, h, n]
    keep = torch.arange(n, device=q.device)[None, :] < seq_lens[:, None]
    s = s.masked_fill(~keep[:, None, :], float("-inf"))
    return (torch.softmax(s, dim=-1).unsqueeze(2) @ v).squeeze(2)


def _csr_attention(q, k_cache, v_cache, kv_indices, keep):
    b, h, d = q.shape
    hkv, n = k_cache.shape[2], kv_indices.shape[0] * k_cache.shape[1]
    k = k_cache[kv_indices].reshape(n, hkv, d).repeat_interleave(h // hkv, dim=1)       # [n, h, d]
    v = v_cache[kv_indices].reshape(n, hkv, d).repeat_interleave(h // hkv, dim=1)
    s = torch.einsum("bhd,nhd->bhn", q, k) / math.sqrt(d)
    s = s.masked_fill(~keep[:, None, :], float("-inf"))
    return torch.einsum("bhn,nhd->bhd", torch.softmax(s, dim=-1), v)


def _page_and_slot(nnz, device):
    """Each token's page and slot, from 2-d aranges (see the last test for // and %)."""
    page = torch.arange(nnz, device=device)[:, None].expand(nnz, PAGE).reshape(nnz * PAGE)
    slot = torch.arange(PAGE, device=device)[None, :].expand(nnz, PAGE).reshape(nnz * PAGE)
    return page, slot


def csr_decode(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len):
    """Request r owns pages kv_indices[kv_indptr[r]:kv_indptr[r+1]], its last page filled to
    kv_last_page_len[r]: a token is r's when its page lies in r's range."""
    page, slot = _page_and_slot(kv_indices.shape[0], q.device)
    start, end = kv_indptr[:-1, None], kv_indptr[1:, None]
    keep = (page >= start) & (page < end) & ((page < end - 1) | (slot < kv_last_page_len[:, None]))
    return _csr_attention(q, k_cache, v_cache, kv_indices, keep)


def csr_decode_segments(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len):
    """As csr_decode, through each page's segment id (its request), counted from the indptr."""
    nnz = kv_indices.shape[0]
    seg = (torch.arange(nnz, device=q.device)[:, None] >= kv_indptr[None, 1:]).sum(1)     # [nnz]
    page, slot = _page_and_slot(nnz, q.device)
    mine = seg[page][None, :] == torch.arange(q.shape[0], device=q.device)[:, None]
    last = page[None, :] == kv_indptr[1:, None] - 1
    keep = mine & (~last | (slot[None, :] < kv_last_page_len[:, None]))
    return _csr_attention(q, k_cache, v_cache, kv_indices, keep)


def _caches(gen, pages, hkv, d, dtype):
    return [torch.randn(pages, PAGE, hkv, d, generator=gen).to(dtype) for _ in range(2)]


def block_table_inputs(gen, lens, blocks, pages, h=6, hkv=2, d=16, dtype=torch.float32):
    q = torch.randn(len(lens), h, d, generator=gen).to(dtype)
    k, v = _caches(gen, pages, hkv, d, dtype)
    table = torch.randint(0, pages, (len(lens), blocks), generator=gen, dtype=torch.int32)
    return q, k, v, table, torch.tensor(lens, dtype=torch.int32)


def csr_inputs(gen, lens, pages, h=6, hkv=2, d=16):
    used = [-(-n // PAGE) for n in lens]
    indptr = torch.tensor([0] + torch.tensor(used).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(len(lens), h, d, generator=gen)
    k, v = _caches(gen, pages, hkv, d, torch.float32)
    indices = torch.randint(0, pages, (int(indptr[-1]),), generator=gen, dtype=torch.int32)
    last = torch.tensor([(n - 1) % PAGE + 1 if n else 0 for n in lens], dtype=torch.int32)
    return q, k, v, indptr, indices, last


def _check(f, fn, args, context):
    """cleave equals eager in fp64 (within the inputs' dtype); an empty request is NaN in both."""
    got = f(*args)
    want = fn(*[x.double() if x.is_floating_point() else x for x in args])
    assert got.dtype == args[0].dtype
    check_outputs([got], [want], context)
    assert torch.equal(got.isnan(), fn(*args).isnan()), f"{context}: NaN where eager has none, or not where it has"


BLOCK_TABLE_DYNAMIC = {"q": {0: "b"}, "k_cache": {0: "pages"}, "v_cache": {0: "pages"},
                       "block_tables": {0: "b", 1: "blocks"}, "seq_lens": {0: "b"}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_table_decode_compiles_once_and_matches_eager(dtype):
    seed = torch.seed() % 10_000
    gen = torch.Generator().manual_seed(seed)
    f = cleave.compile(paged_decode, dynamic=BLOCK_TABLE_DYNAMIC, verbose=False)
    for blocks, pages, lens in ((5, 11, [7, 1, 15]), (7, 13, [0, 20, 4, 9, 2]), (1, 2, [2])):
        args = block_table_inputs(gen, lens, blocks, pages, dtype=dtype)
        _check(f, paged_decode, args, f"seed {seed}, lens {lens}, {blocks} blocks of {PAGE}, {pages} pages")
    assert f.stats["failed"] == 0 and f.stats["graph_breaks"] == 0
    assert f.stats["searches"] == 1 and f.stats["compiles"] == 1
    assert_loops_bounded_by(plan_sources(f), "seq_lens", sides=("hi",))  # a request's loop ends at its length


@pytest.mark.parametrize("fn", [csr_decode, csr_decode_segments])
def test_csr_decode_compiles_and_matches_eager(fn):
    """The segment ids are a sum of bools that a kernel of their own materializes: counts,
    not bools (a bool-typed sum once stored them as 0/1)."""
    seed = torch.seed() % 10_000
    gen = torch.Generator().manual_seed(seed)
    f = cleave.compile(fn, verbose=False, dynamic={
        "q": {0: "b"}, "k_cache": {0: "pages"}, "v_cache": {0: "pages"}, "kv_indptr": {0: "b1"},
        "kv_indices": {0: "nnz"}, "kv_last_page_len": {0: "b"}})
    for lens in ([5, 1, 7], [4, 0, 3, 8, 2]):
        _check(f, fn, csr_inputs(gen, lens, pages=11), f"seed {seed}, lens {lens}")
    assert f.stats["failed"] == 0 and f.stats["graph_breaks"] == 0 and f.stats["compiles"] == 1


def csr_pages_by_division(kv_indices):
    pos = torch.arange(kv_indices.shape[0] * PAGE, device=kv_indices.device)
    return kv_indices[pos // PAGE] * PAGE + pos % PAGE


def test_integer_division_of_positions_compiles_exactly():
    """`pos // PAGE` is idiv on integers, `pos % PAGE` fmod (tests/test_modulo_ops.py): a
    token's page and slot as a user computes them, gathered through the page list, with
    no fallback (it ran eagerly before idiv)."""
    kv_indices = torch.tensor([5, 0, 3, 9, 2], dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        got = cleave.compile(csr_pages_by_division, verbose=False)(kv_indices)
    assert torch.equal(got, csr_pages_by_division(kv_indices))
