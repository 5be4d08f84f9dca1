"""Target.early_loads (off by default; `benchmarks.build --early-loads`): each load of a
buffer the kernel only reads moves up its block to just after what its address reads
(scheduler/load_order.py), so a decode's V tile is requested beside its K tile, before
the scores' MatMul. The pass on lines, then plans built with it against fp64."""
import dataclasses
import re

import cleave
from cleave import workloads as W
from cleave.scheduler import H200
from cleave.scheduler.load_order import issued_early
from kernel_check import LOOPS, run_and_check
from paged_decode_case import paged_decode_case
from test_index_prefetch import _check

EARLY = dataclasses.replace(H200, early_loads=True)


def test_a_load_moves_up_to_just_after_what_its_address_reads():
    lines = ["a = tl.load(x_ptr + i)", "s = a * 2", "j = i + 1", "t = s + 1", "b = tl.load(y_ptr + j)", "u = t + b"]
    assert issued_early(lines, {"x", "y"}) == [
        "a = tl.load(x_ptr + i)", "s = a * 2", "j = i + 1", "b = tl.load(y_ptr + j)", "t = s + 1", "u = t + b"]


def test_it_passes_a_store_but_no_load_loop_or_atomic_and_only_read_only_buffers():
    store = ["a = tl.load(x_ptr + i)", "tl.store(o_ptr + i, a)", "s = a * 2", "b = tl.load(y_ptr + i)"]
    assert issued_early(store, {"x", "y"}) == [store[0], store[3], store[1], store[2]]
    # a buffer the kernel also writes stays where it is read
    assert issued_early(store, {"x"}) == store
    loop = ["c = 0", "for start1 in range(0, n, 16):", "    c = c + tl.load(x_ptr + start1)", "b = tl.load(y_ptr)"]
    assert issued_early(loop, {"x", "y"}) == loop
    atomic = ["n = tl.atomic_add(cnt_ptr, 1)", "s = i * 2", "b = tl.load(y_ptr + i)"]
    assert issued_early(atomic, {"y"}) == [atomic[0], atomic[2], atomic[1]]
    assert issued_early(["t = 1", "a = tl.load(x_ptr)", "b = tl.load(y_ptr)"], {"x", "y"}) == \
        ["a = tl.load(x_ptr)", "b = tl.load(y_ptr)", "t = 1"]


def test_an_index_tile_loaded_for_the_next_step_stays_after_its_reads():
    """A carried tile (Target.index_prefetch) is read in the step, then loaded again for
    the next one: moved above the read, the step would use the next step's pages."""
    body = ["idx1 = start1 + tl.arange(0, 16)", "p = pf0 * 8", "w = p + 1", "pf0 = tl.load(kv_indices_ptr + idx1 + 16)"]
    assert issued_early(body, {"kv_indices"}) == [body[0], body[1], body[3], body[2]]


def _first(source: str, pattern: str) -> int:
    return next(i for i, line in enumerate(source.splitlines()) if re.search(pattern, line))


def test_decode_plans_load_v_before_the_scores_and_match_fp64():
    for name in ("gqa_decode", "mqa_decode"):
        w = W.get(name)
        cand = cleave.search(w.graph).candidates[0]
        for env in w.test_bindings:
            for target in (EARLY, dataclasses.replace(LOOPS, early_loads=True)):
                plans = cleave.schedule(cand, env, top_k=2, target=target)
                assert plans
                for plan in plans:
                    src = next(k.source for k in plan.kernels if "v_ptr" in k.source)
                    assert _first(src, r"= tl\.load\(v_ptr") < _first(src, r"tl\.dot\("), src
                    run_and_check(w.graph, plan, env, seed=3)


def test_a_paged_decode_with_early_loads_matches_fp64():
    """Loads through gathered page indices move only as far as the indices' own load."""
    graph, inputs, env, dynamic, cand = paged_decode_case([70, 0, 33, 1, 9], pool=131, heads=8, seed=5)
    plans = cleave.schedule(cand, env, dynamic=dynamic, top_k=1, target=EARLY)
    assert plans
    for plan in plans:
        for k in plan.kernels:
            for line in k.source.splitlines():
                m = re.match(r"\s*(\w+) = tl\.load\(kv_indices_ptr", line)
                if m:  # every gather through it comes after it
                    gathers = [i for i, ln in enumerate(k.source.splitlines()) if f"{m.group(1)}" in ln
                               and "_cache_ptr" in ln]
                    assert all(i > k.source.splitlines().index(line) for i in gathers)
    _check(graph, plans, inputs, env, "gqa paged, early loads")
