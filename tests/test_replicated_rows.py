"""Grouped rows replicated over a tl.dot's lanes (Tiling.step): a decode's g query heads
per kv head fill the 16 rows of a dot g rows at a time, repeated, so that one program
serves one request and loops over its own pages only. Before, a 16-row tile held 16/g
requests, whose pages lie apart in the packed CSR axis: fewer programs found pages,
and the ones that did ran the union of their requests' ranges. The FlashInfer decode's
replicated plans (g = 4, split counts included) run against fp64 in
test_layout_sink.py."""
import torch

import cleave
from cleave import workloads as W
from cleave.interpreter import interpret
from cleave.runtime.launch import launch
from kernel_check import check_outputs
from paged_decode_case import paged_decode_case

NAME = "gqa_paged_decode_h32_kv8_d128_ps1"


def _replicated(plans, kernel: str):
    return [p for p in plans if f"{kernel}.X1.rows" in p.tiles]


def test_a_large_decode_step_tiles_one_request_per_program():
    """At 64 requests the model's first plans include one that takes one request per
    program (512 programs over 8 kv heads: every SM streams pages of a single request),
    unsplit; beside it, split plans whose chunks divide each tile's requests
    (test_relative_chunks.py) cost the same."""
    w = W.get(NAME)
    cand = cleave.search(w.graph).candidates[0]
    plans = cleave.schedule(cand, w.presets["h200_large"], top_k=3)
    replicated = [p for p in _replicated(plans, f"{NAME}_k0") if not p.split or max(p.split.values()) == 1]
    assert replicated, [p.tiles for p in plans]
    kernel = replicated[0].kernels[0]
    assert "tl.arange(0, 16) % 4" in kernel.source
    assert all(loop["fraction"] <= 1 / 64 + 1e-9 for loop in kernel.loops), kernel.loops


def test_three_heads_per_kv_head_replicate_over_sixteen_lanes():
    """g = 3 does not divide 16: lanes hold rows 0, 1, 2, 0, 1, 2, ... of one request.
    Random scattered pages, a request without any, odd batch and pool sizes."""
    lens = [5, 0, 9, 1, 7]
    graph, inputs, env, dynamic, cand = paged_decode_case(lens, pool=31, heads=6, seed=3)
    plans = cleave.schedule(cand, env, dynamic=dynamic, top_k=4)
    replicated = [p for p in plans if any(k.endswith(".rows") for k in p.tiles)]
    assert replicated, [p.tiles for p in plans]
    ref = interpret(graph, inputs, compute_dtype=torch.float64)
    assert ref[1][1].isinf().all()  # the empty request: lse -inf (and output 0)
    ran = []
    for p in replicated:
        (s,) = p.split.values() or (1,)
        if s > 2 or (s - 1) * -(-sum(lens) // s) >= sum(lens):
            continue  # unsplit and one split are enough here; an empty chunk is excluded by the plan
        assert any("tl.arange(0, 16) % 3" in k.source for k in p.kernels), [k.source for k in p.kernels]
        outs = [torch.full(tuple(r.shape), float("nan"), dtype=r.dtype) for r in interpret(graph, inputs)]
        got = launch(p, inputs, out=outs)
        check_outputs(got, ref, f"g=3, split {p.split}")
        ran.append(s)
    assert ran, [p.split for p in replicated]
