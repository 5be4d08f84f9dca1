"""A split chunk runs relative to its program's own range (bounds.Window): chunk c of s
covers the c-th of s equal windows of the union of the program's requests' ranges, not
the c-th fixed slice of the packed kv axis. With fixed slices a request shorter than a
slice finds its pages in one or two chunks and the other programs of its row tile idle:
the kv4 decode's split plans reached 49% of the copy ceiling on the H200 that way."""
import torch

import cleave
from cleave import workloads as W
from cleave.interpreter import interpret
from cleave.runtime.launch import launch
from kernel_check import check_outputs
from paged_decode_case import paged_decode_case


def _split(plan) -> int:
    return max(plan.split.values(), default=1)


def test_a_large_decode_step_splits_each_request_over_its_chunks():
    """64 requests of 4096 pages, 4 kv heads: 256 (request, kv head) programs unsplit. The
    split plans' loops are relative, and each (row tile, chunk) program runs 1/s of its
    tile's requests (a loop share of k/64 of the chunk's extent for k requests per tile),
    so every program of the grid works and the model ranks a split plan first."""
    w = W.get("gqa_paged_decode_h32_kv4_d128_ps1")
    cand = cleave.search(w.graph).candidates[0]
    plans = cleave.schedule(cand, w.presets["h200_large"], top_k=4)
    assert _split(plans[0]) > 1, [p.split for p in plans]
    for p in plans:
        if _split(p) > 1:
            (loop,) = p.kernels[0].loops
            assert loop["relative"], loop
            rows = p.tiles[f"{p.kernels[0].name}.X1.rows"] if f"{p.kernels[0].name}.X1.rows" in p.tiles \
                else p.tiles[f"{p.kernels[0].name}.X1"]
            assert abs(loop["fraction"] - max(1, rows // 8) / 64) < 0.01, (p.tiles, loop)


def test_relative_chunks_match_fp64_with_long_short_and_empty_requests():
    """A request longer than a loop tile split over the chunks, short and empty ones, row
    tiles of several requests (their union split) and of one (replicated rows), scattered
    pages and poisoned outputs: every split plan against the fp64 interpreter."""
    graph, inputs, env, dynamic, cand = paged_decode_case([70, 0, 33, 1, 9], pool=131, heads=8, seed=5)
    plans = cleave.schedule(cand, env, dynamic=dynamic, top_k=2)
    ref = interpret(graph, inputs, compute_dtype=torch.float64)
    ran = set()
    for p in plans:
        replicated = any(k.endswith(".rows") for k in p.tiles)
        if (_split(p), replicated) not in ((2, False), (4, True)):  # one of each suffices
            continue
        assert all(loop["relative"] for loop in p.kernels[0].loops), p.kernels[0].loops
        outs = [torch.full(tuple(r.shape), float("nan"), dtype=r.dtype) for r in interpret(graph, inputs)]
        check_outputs(launch(p, inputs, out=outs), ref, f"split {p.split}, tiles {p.tiles}")
        ran.add((_split(p), replicated))
    assert ran == {(2, False), (4, True)}, ran
