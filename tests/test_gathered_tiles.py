"""Tiles gathered through indices loaded in the same loop (a paged KV cache's pages) as
Triton 3.6 pipelines them for sm_90: (stages - 1) // 2 buffers in shared memory, one at
least (the MLA paged decode's fused kernel: one at 2-4 stages, two at 5 and 6, three at
7). With one buffer the next step's copy waits for this step's dots, so a program loads
and computes in turn, as at one stage. Costed as one buffer per stage, the model had
ranked MLA's 32-key steps at 4 stages first; 64-key steps ran 9% faster on the H200
(RESULTS.md, session 15)."""
import pytest

from cleave import search, workloads
from cleave.runtime.mix import launch_variants
from cleave.scheduler import schedule
from cleave.scheduler.kernel_stats import Stats
from cleave.scheduler.plan import Kernel

MLA = "mla_paged_decode_h16_ckv512_kpe64_ps1"
FLASH_DECODING = ["split-max", "split-softmax-matmul", "split-softmax-sum"]  # the split form without scale-add


def _stats(gathered):
    return Stats(bytes=2e6, flops=1e6, mma_flops=1e6, per_buffer={"rows": 2e6}, footprint={"rows": 3e8},
                 stage_smem={"index": 256, "rows": 65536}, fixed_smem={"q": 18432},
                 gathered={"rows"} if gathered else set())


def test_a_gathered_tile_takes_a_buffer_per_two_stages_and_is_one_tile_ahead():
    stats = _stats(gathered=True)
    assert [stats.smem(s) for s in (1, 2, 3, 4)] == [256 * s + 65536 + 18432 for s in (1, 2, 3, 4)]
    assert stats.smem(5) == 5 * 256 + 2 * 65536 + 18432 and stats.smem(7) == 7 * 256 + 3 * 65536 + 18432
    assert stats.in_flight(1) == 0.5 * (256 + 65536)
    assert stats.in_flight(3) == 2 * 256 + 65536
    assert stats.in_flight(5) == 4 * 256 + 65536
    dense = _stats(gathered=False)
    assert dense.smem(3) == 3 * (256 + 65536) + 18432 and dense.in_flight(3) == 2 * (256 + 65536)


def test_a_gathering_kernel_launches_at_one_to_three_stages():
    k = Kernel("k", "src", ["1"], [], 4, 3, loops=[{"label": "X0"}], stage_choices=(1, 2, 3))
    again = Kernel.from_json(k.to_json())
    assert again.stage_choices == (1, 2, 3) and again.launches(4, 3) and not again.launches(4, 4)
    assert sorted(launch_variants(again)) == [(4, 2), (8, 2), (8, 3)]
    old = {key: v for key, v in k.to_json().items() if key != "stage_choices"}
    assert Kernel.from_json(old).launches(4, 4)
    dense = Kernel("k", "src", ["1"], [], 4, 2, loops=[{"label": "X0"}])
    assert sorted(launch_variants(dense)) == [(4, 1), (4, 3), (8, 1), (8, 2), (8, 3)]


def _plans(name, preset, top_k):
    w = workloads.get(name)
    return [schedule(cand, w.presets[preset], dynamic=set(), top_k=top_k) for cand in search(w.graph).candidates]


@pytest.fixture(scope="module")
def mla_large():
    """The FlashDecoding form's plans at 4 chunks."""
    w = workloads.get(MLA)
    cand = next(c for c in search(w.graph).candidates if c.derivation == FLASH_DECODING)
    return schedule(cand, w.presets["h200_large"], dynamic=set(), top_k=4, split={"s_num_kv_indices": 4})


def test_paged_kernels_gather_and_dense_ones_do_not(mla_large):
    paged = [k for p in mla_large for k in p.kernels if k.loops and "kv_indices" in k.source]
    assert paged and all(k.stage_choices == (1, 2, 3) and k.num_stages <= 3 for k in paged)
    dense = [k for plans in _plans("gqa_decode", "b8_L8192", 2) for p in plans for k in p.kernels if k.loops]
    assert dense and not any(k.stage_choices for k in dense)


def test_mla_large_step_streams_more_than_32_keys_a_step(mla_large):
    """The FlashDecoding form's first plan (its partial kernel holds the whole 512-wide
    latent contraction in a 16-row tile of one request) steps over 64 or more keys."""
    best = mla_large[0]
    steps = [best.tiles[f"{k.name}.{loop['label']}"] for k in best.kernels if "kv_indices" in k.source
             for loop in k.loops]
    assert steps and all(step >= 64 for step in steps), steps


def test_mla_large_step_keeps_its_contraction_whole(mla_large):
    """At 4 chunks a request the model had ranked first the plan whose 512-wide
    contraction loops in 64-column steps inside the key loop, each key step then loading
    its 64 x 512 value tile unpipelined: 0.193 ms on the H200 against 0.103 with the
    contraction whole (RESULTS.md session 26)."""
    loops = [ln for k in mla_large[0].kernels for ln in k.source.splitlines() if ln.lstrip().startswith("for start")]
    assert loops and len({len(ln) - len(ln.lstrip()) for ln in loops}) == 1, loops
