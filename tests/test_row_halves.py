"""Two row tiles per program (scheduler/row_halves.py): where a loop step chains two
MatMuls (attention's S = q·Kᵀ, then P·V), the scheduler also offers each tiling with
a program holding two row tiles side by side, K and V loaded once for both. Each such
kernel must match the fp64 reference, its second tile's rows past the extent masked."""
import pytest

from cleave import search
from cleave import workloads as W
from cleave.ir.graph import rebuild
from cleave.scheduler import api, row_halves, schedule
from cleave.scheduler.partition import partition
from cleave.scheduler.tiles import enumerate_tilings
from kernel_check import ATTENTION_BINDINGS, LOOPS, check_every_length, only_tilings, run_and_check


@pytest.fixture
def halves_only(monkeypatch):
    """Schedule only the options with two row tiles per program."""
    only_tilings(monkeypatch, lambda t: t.unroll)


def _stores(kernel, buffer="o") -> list[str]:
    return [ln.strip() for ln in kernel.source.splitlines() if ln.strip().startswith(f"tl.store({buffer}_ptr")]


@pytest.mark.parametrize("name", ["mha", "mha_causal", "gqa_causal", "mha_window", "rope_attention_causal"])
def test_two_row_tiles_per_program_match_the_reference(halves_only, name):
    env = ATTENTION_BINDINGS[name]
    g = W.get(name).graph
    plans = schedule(search(g).candidates[0], env, top_k=2, target=LOOPS)
    for plan in plans:
        attention = [k for k in plan.kernels if len(_stores(k)) == 2]
        assert attention, [k.name for k in plan.kernels]
        for seed in (0, 1):
            run_and_check(g, plan, env, seed)


def test_one_compile_serves_every_length(halves_only):
    check_every_length("mha_causal", {"b": 1, "h": 1, "s": 200, "d": 16}, "s", (1, 64, 65, 129, 257), stores=2)


def test_a_second_tile_inside_the_extent_is_not_masked(halves_only):
    """Over an extent both tiles divide, the later tile's rows stay inside it: its
    loads and stores take no mask."""
    env = {"b": 1, "h": 1, "s": 256, "d": 16}
    g = W.get("mha").graph
    plan = schedule(search(g).candidates[0], env, top_k=1, target=LOOPS)[0]
    stores = _stores(plan.kernels[0])
    assert len(stores) == 2 and not any("mask" in st for st in stores), stores
    run_and_check(g, plan, env, seed=3)


@pytest.mark.parametrize("name,env", [
    ("matmul", {"s": 300, "k": 200, "n": 300}),  # one MatMul per step: nothing to overlap
    ("gqa_decode", {"b": 2, "hkv": 2, "g": 3, "L": 500, "d": 16}),  # 16-row tiles
])
def test_offered_only_where_a_loop_chains_matmuls_over_wide_row_tiles(name, env):
    g = rebuild(search(W.get(name).graph).candidates[0].graph)
    env = {**env, **{s: 1 for s in api.split_symbols(g)}}
    for spec, _ in partition(g, env, target=LOOPS):
        for t in enumerate_tilings(spec.views, spec.root_labels, env, set(), LOOPS):
            assert row_halves.options(spec, t) == []
