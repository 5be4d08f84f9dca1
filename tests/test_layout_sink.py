"""A MatMul's result is carried in its own layout through the softmax to the next MatMul
(cleave/frontends/layout_sink.py), so the search sees MatMul -> softmax -> MatMul and
splits P·V over the kv axis (FlashDecoding) in grouped and paged attention."""
import math

import torch

import cleave
from cleave import workloads as W
from cleave.frontends.capture import capture
from cleave.frontends.layout_sink import sink_layouts
from cleave.interpreter import interpret
from kernel_check import computed_kernels, run_and_check

LAYOUT = ("reshape", "permute")


def grouped_attention(q, k, v, keep):
    """q [rows, h, d] against k, v [n, kv_heads, d] where keep [rows, n], written with
    einsums over the kv heads' groups."""
    rows, h, d = q.shape
    qg = q.reshape(rows, k.shape[1], h // k.shape[1], d)
    s = torch.einsum("rkgd,nkd->rkgn", qg, k) / math.sqrt(d)
    s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    out = torch.einsum("rkgn,nkd->rkgd", p, v) / p.sum(-1, keepdim=True)
    return out.reshape(rows, h, d), s.amax(-1)


def example(rows=5, n=11, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=gen) for s in ((rows, 6, 8), (n, 2, 8), (n, 2, 8)))
    keep = torch.rand(rows, n, generator=gen) < 0.7
    keep[:, 0] = True
    return q, k, v, keep


def producers(node, stop):
    """The ops between `stop` and `node` (operand chains that reach `stop`)."""
    if node is stop:
        return [stop.op]
    found = [p for x in node.inputs for p in producers(x, stop)]
    return [node.op] + found if found else []


def test_the_softmax_between_two_einsums_runs_in_the_first_matmuls_layout():
    g = capture(grouped_attention, *example(), dynamic={"q": {0: "r"}, "k": {0: "n"}, "v": {0: "n"}, "keep": {0: "r", 1: "n"}})
    scores, pv = [n for n in g.live_nodes() if n.op == "matmul"]
    between = producers(pv.inputs[0], scores)
    assert between and not set(between) & set(LAYOUT), between  # exp(sub(where(mask, s*c)...)) of the scores
    assert pv.inputs[0].op == "exp"
    args = example(rows=7, n=13, seed=1)
    got = interpret(g, dict(zip(("q", "k", "v", "keep"), args)), compute_dtype=torch.float64)
    want = grouped_attention(*(a.double() if a.is_floating_point() else a for a in args))
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_a_layout_that_never_cancels_leaves_the_graph_as_it_is():
    def scores(q, k):
        return torch.einsum("rkgd,nkd->rkgn", q, k).relu()

    g = capture(scores, torch.randn(3, 2, 2, 4), torch.randn(5, 2, 4))
    assert sink_layouts(g) is g


def test_paged_decode_gets_flash_decoding_plans():
    """Split-KV as FlashDecoding computes it: each program reads one chunk of its request's
    pages, keeps the chunk's max, sum and P·V, and one combine kernel rescales them. The
    einsums' layout ops hid P·V from the split rules before: the split plans then had four
    kernels and the first materialised every request's scores against every token."""
    name = "gqa_paged_decode_h32_kv8_d128_ps1"
    w = W.get(name)
    cand = cleave.search(w.graph).candidates[0]
    plans = cleave.schedule(cand, w.presets["h200"], top_k=3)
    split = [p for p in plans if p.split and any(v > 1 for v in p.split.values())]
    assert split and all(computed_kernels(p) == 2 for p in split), [(p.split, len(p.kernels)) for p in plans]
    partial = split[0].kernels[0]
    assert any("kv_indptr" in loop["loaded"].get("lo", ()) for loop in partial.loops), partial.loops


def test_flash_decoding_plans_match_the_reference_with_an_empty_request():
    """Every chunk count of the dynamic ladder that fits the test batches (an empty
    request in each): a chunk holding no token of a request gives its rows max -inf,
    sum 0 and P·V 0. Most plans hold one request per program (test_replicated_rows.py)."""
    w = W.get("gqa_paged_decode_h32_kv8_d128_ps1")
    cand = cleave.search(w.graph).candidates[0]
    for binding in w.test_bindings[:1]:  # 3 requests, one empty (the second binding added 33 s, no path)
        plans = cleave.schedule(cand, binding, dynamic=set(binding), top_k=1)
        by_count = {p.split.get("s_num_kv_indices", 1): p for p in reversed(plans)}
        nnz = binding["num_kv_indices"]
        counts = [s for s in by_count if (s - 1) * -(-nnz // s) < nnz]
        assert len([s for s in counts if s > 1]) >= 2, sorted(by_count)
        # one request per program (its 4 heads replicated over 16 lanes), split or not
        replicated = [s for s in counts if any(k.endswith(".rows") for k in by_count[s].tiles)]
        assert 1 in replicated and len(replicated) >= 2, replicated
        for s in counts:
            run_and_check(cand.graph, by_count[s], binding, seed=s)
