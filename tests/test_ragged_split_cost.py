"""The cost model over a packed ragged extent split into chunks (FlashDecoding over CSR
pages): a row tile of several requests runs the union of their pages, and most (row
tile, chunk) programs find none of theirs. At 64 requests of 4096 tokens the H200 ran
the model's first plan at 0.98 TB/s (0.76x padded cuDNN SDPA): it tiled 128 rows (32
requests) per program, with 4 chunks, so about 120 programs worked."""
import dataclasses

import cleave
from cleave import workloads as W
from cleave.scheduler import H200
from cleave.scheduler.cost import kernel_time
from cleave.scheduler.kernel_stats import Stats

NAME = "gqa_paged_decode_h32_kv8_d128_ps1"


def _first_plans(preset, top_k=3):
    w = W.get(NAME)
    cand = cleave.search(w.graph).candidates[0]
    return w.presets[preset], cleave.schedule(cand, w.presets[preset], top_k=top_k)


def test_a_row_tile_of_several_requests_runs_their_pages():
    """The loop's expected share of its chunk is the tile's requests over all of them:
    32 merged rows of 4 heads hold 8 of the 8 requests (all), 16 rows hold 4."""
    env, plans = _first_plans("h200", top_k=8)
    for p in plans:
        rows = p.tiles.get(f"{NAME}_k0.X1.rows", p.tiles[f"{NAME}_k0.X1"])
        for loop in p.kernels[0].loops:
            assert loop["fraction"] == min(1.0, rows / 4 / env["batch_size"]), (rows, loop)


def test_only_the_programs_that_find_pages_count_as_parallel_work():
    stats = Stats(bytes=4e6, flops=1e6, mma_flops=1e6, per_buffer={"k": 4e6}, footprint={"k": 4e9},
                  stage_smem={"k": 16384})
    busy = kernel_time(stats, 132, 4, 3, H200)
    quarter = dataclasses.replace(stats, bytes=1e6, flops=2.5e5, mma_flops=2.5e5, per_buffer={"k": 1e6}, active=0.25)
    assert kernel_time(quarter, 4 * 132, 4, 3, H200) == busy


def test_a_large_decode_step_keeps_every_sm_streaming():
    """T row tiles and s chunks make T + s - 1 working programs per kv head: the first
    plan's must cover the SMs."""
    env, plans = _first_plans("h200_large")
    plan = plans[0]
    tiles = 4 * env["batch_size"] // plan.tiles.get(f"{NAME}_k0.X1.rows", plan.tiles[f"{NAME}_k0.X1"])
    (chunks,) = plan.split.values() or (1,)
    assert (tiles + chunks - 1) * 8 >= H200.sms, (tiles, chunks)


def test_a_prefill_query_tile_counts_its_own_request_once():
    """A ragged prefill's query tile finds its request through segment ids, which it
    computes by reading every interior boundary of qo_indptr: those reads are not the
    requests it spans (counted as such, its loop was costed over the whole kv extent
    and the single-pass plan, 0.17 ms on the H200, ranked below six-kernel split plans)."""
    w = W.get("gqa_ragged_prefill_causal_h32_kv4_d128")
    cand = cleave.search(w.graph).candidates[0]
    (plan,) = cleave.schedule(cand, w.presets["h200"], top_k=1)
    assert len(plan.kernels) == 1
    assert all(loop["fraction"] <= 0.25 for loop in plan.kernels[0].loops), plan.kernels[0].loops


def test_mla_rows_of_sixteen_heads_tile_one_request():
    """MLA's merged rows are 16 heads per request (16*batch_size): a 16-row tile holds one
    request, and the large step's plans take it (64-row tiles, 4 requests each, left too
    few programs working: 0.23 TB/s on the H200, session 8)."""
    name = "mla_paged_decode_h16_ckv512_kpe64_ps1"
    w = W.get(name)
    cand = cleave.search(w.graph).candidates[0]
    plans = cleave.schedule(cand, w.presets["h200_large"], top_k=3)
    assert any(p.tiles[f"{name}_k0.X0"] == 16 for p in plans), [p.tiles[f"{name}_k0.X0"] for p in plans]
