"""Tiles gathered through indices loaded in the same loop (a paged KV cache's pages) as
Triton 3.6 pipelines them for sm_90: one buffer in shared memory from 1 to 4 stages,
so one tile in flight ahead of the one in use, and the same code at 4 stages as at 3
(the MLA paged decode's fused kernel: 56320 bytes of shared memory at 2 stages, 56576
at 3 and 4). Costed as one buffer per stage, the model had ranked MLA's 32-key steps at
4 stages first; 64-key steps ran 9% faster on the H200 (RESULTS.md, session 15)."""
import pytest

from cleave import search, workloads
from cleave.runtime.mix import launch_variants
from cleave.scheduler import schedule
from cleave.scheduler.kernel_stats import Stats
from cleave.scheduler.plan import Kernel

MLA = "mla_paged_decode_h16_ckv512_kpe64_ps1"


def _stats(gathered):
    return Stats(bytes=2e6, flops=1e6, mma_flops=1e6, per_buffer={"rows": 2e6}, footprint={"rows": 3e8},
                 stage_smem={"index": 256, "rows": 65536}, fixed_smem={"q": 18432},
                 gathered={"rows"} if gathered else set())


def test_a_gathered_tile_takes_one_buffer_and_is_one_tile_ahead():
    stats = _stats(gathered=True)
    assert [stats.smem(s) for s in (1, 2, 3)] == [256 * s + 65536 + 18432 for s in (1, 2, 3)]
    assert stats.in_flight(1) == 0.5 * (256 + 65536)
    assert stats.in_flight(3) == 2 * 256 + 65536
    dense = _stats(gathered=False)
    assert dense.smem(3) == 3 * (256 + 65536) + 18432 and dense.in_flight(3) == 2 * (256 + 65536)


def test_a_gathering_kernel_is_not_launched_past_three_stages():
    k = Kernel("k", "src", ["1"], [], 4, 3, loops=[{"label": "X0"}], max_stages=3)
    again = Kernel.from_json(k.to_json())
    assert again.max_stages == 3 and again.launches(4, 3) and not again.launches(4, 4)
    assert (4, 4) not in launch_variants(again) and (4, 2) in launch_variants(again)
    old = {key: v for key, v in k.to_json().items() if key != "max_stages"}
    assert Kernel.from_json(old).launches(4, 4)


def _plans(name, preset, top_k):
    w = workloads.get(name)
    return [schedule(cand, w.presets[preset], dynamic=set(), top_k=top_k) for cand in search(w.graph).candidates]


@pytest.fixture(scope="module")
def mla_large():
    """The FlashDecoding form's plans at 4 chunks."""
    w = workloads.get(MLA)
    (cand,) = [c for c in search(w.graph).candidates if "split-softmax-matmul" in c.derivation]
    return schedule(cand, w.presets["h200_large"], dynamic=set(), top_k=4, split={"s_num_kv_indices": 4})


def test_paged_kernels_gather_and_dense_ones_do_not(mla_large):
    paged = [k for p in mla_large for k in p.kernels if k.loops and "kv_indices" in k.source]
    assert paged and all(k.max_stages == 3 and k.num_stages <= 3 for k in paged)
    dense = [k for plans in _plans("gqa_decode", "b8_L8192", 2) for p in plans for k in p.kernels if k.loops]
    assert dense and not any(k.max_stages for k in dense)


def test_mla_large_step_streams_more_than_32_keys_a_step(mla_large):
    """The FlashDecoding form's first plan (its partial kernel holds the whole 512-wide
    latent contraction in a 16-row tile of one request) steps over 64 or more keys."""
    best = mla_large[0]
    steps = [best.tiles[f"{k.name}.{loop['label']}"] for k in best.kernels if "kv_indices" in k.source
             for loop in k.loops]
    assert steps and all(step >= 64 for step in steps), steps
