"""Heaviest tiles first (scheduler/tile_order.py): a grid tile id along which a loop's
trip count grows is decoded in reverse, so that program 0 runs the longest loop. The
decode is read back from the emitted kernel and evaluated for every program id."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import re
import types

import pytest
import sympy

import cleave
from cleave.ir import Graph
from cleave.scheduler import schedule
from cleave.scheduler.codegen import Emitter
from cleave.scheduler.exprs import evaluate
from cleave.scheduler.loop_bounds import Tiles, maximum, minimum, symbol, tid
from cleave.scheduler.tile_order import trip_direction
from cleave.scheduler.tiles import Tiling
from cleave.workloads.attention import NEG_INF, scale
from cleave.workloads.attention_variants import window_graph
from fixtures_candidates import CANDIDATES, EXP, _cand, _online_softmax_av
from kernel_check import LOOPS

S = sympy.Symbol("s", integer=True, positive=True)
T = tid(3)
CONSTANTS = {"s", "tid0", "tid1"}  # a graph symbol and the other tile ids


@pytest.mark.parametrize("lo, hi, want", [
    (0, minimum(S, 128 + 128 * T), 1),  # causal: the loop stops at the q tile's diagonal
    (Tiles(maximum(128 * T, 0), 128), S, -1),  # upper triangle: the loop starts there
    (Tiles(maximum(128 * T - 1023, 0), 128), minimum(S, 128 + 128 * T), None),  # a window: both move
    (0, minimum(symbol("v7"), 128 + 128 * T), None),  # a bound read from memory
    (0, 64 * sympy.floor((128 * T + 127) / 64), 1),  # a page index of the diagonal
    (0, minimum(S, 128 + 128 * tid(1)), 0),  # another label's tile id
], ids=["causal", "upper", "window", "loaded", "paged", "other"])
def test_trip_direction_follows_the_bounds(lo, hi, want):
    assert trip_direction(lo, hi, T.name, {}, CONSTANTS) == want


def test_trip_direction_reads_through_defined_bounds():
    hi = symbol("hi4")
    defs = {"hi4": minimum(S, 128 + 128 * T), "lo4": Tiles(maximum(hi - 1024, 0), 128)}
    assert trip_direction(0, hi, T.name, defs, CONSTANTS) == 1
    assert trip_direction(symbol("lo4"), hi, T.name, defs, CONSTANTS) is None


def _tile_ids(source: str, pid: int, env: dict) -> dict:
    """The kernel's decode of program `pid` (its `pid = ...` and `tid<L> = ...` lines), run
    in Python: the tile id of each grid label."""
    decode = source.split("    pid = tl.program_id(0)")[1].splitlines()[1:]
    scope = {**env, "pid": pid, "tl": types.SimpleNamespace(minimum=min)}
    for line in decode:
        if not re.match(r"\s+(pid|pmn|first|rows|tid\d+|idx\d+) = ", line):
            break
        if not line.strip().startswith("idx"):
            exec(line.strip(), scope)
    return {k: v for k, v in scope.items() if re.fullmatch(r"tid\d+", k)}


def _bound(source: str, name: str, scope: dict) -> int:
    """A loop bound of the kernel's record (a name defined before the loop, or code)."""
    found = re.search(rf"^    {re.escape(name)} = (.*)$", source, re.M)
    tl = types.SimpleNamespace(minimum=min, maximum=max)
    return eval(found.group(1) if found else name, {**scope, "tl": tl})


def _spans(plan, env):
    """Per program id, its tile ids and the number of keys its kv loop runs over."""
    (kernel,) = plan.kernels
    (loop,) = kernel.loops
    out = []
    for pid in range(evaluate(kernel.grid[0], env)):
        tids = _tile_ids(kernel.source, pid, env)
        scope = {**env, **tids}
        out.append((tids, _bound(kernel.source, loop["hi"], scope) - _bound(kernel.source, loop["lo"], scope)))
    return kernel, loop, out


def test_causal_program_zero_runs_the_longest_kv_loop():
    env = {"b": 2, "h": 2, "s": 163, "d": 16}  # several q tiles, the last one ragged
    plan = schedule(CANDIDATES["mha_causal"](), env, target=LOOPS, top_k=1)[0]
    kernel, loop, spans = _spans(plan, env)
    (q,) = loop["trips"]
    assert loop["trips"] == {q: "increasing"}
    assert spans[0][1] == max(n for _, n in spans) > min(n for _, n in spans)
    assert spans[0][0][f"tid{q[1:]}"] == -(-env["s"] // plan.tiles[f"{kernel.name}.{q}"]) - 1  # the last q tile
    # Every tile still has exactly one program.
    assert len({tuple(sorted(t.items())) for t, _ in spans}) == len(spans)


@pytest.mark.parametrize("backwards", [{2}, {3}, {1, 2, 3}])
def test_grouped_order_counted_backwards_is_still_one_program_per_tile(backwards):
    """The grouped (swizzled) decode of two MatMul sides, 11 row tiles (a ragged last group
    of 8) by 3 column tiles, then 2 heads, with some tile ids counted from the end."""
    tiles = {3: "11", 2: "3", 1: "2"}
    em = types.SimpleNamespace(t=Tiling(role={3: "grid", 2: "grid", 1: "grid"}, block={3: 64, 2: 64, 1: 1}))
    em.lanes = lambda lid: Emitter.lanes(em, lid)
    em.arange = lambda lid: Emitter.arange(em, lid)
    source = "\n".join(["    pid = tl.program_id(0)"] + ["    " + ln for ln in
                                                         Emitter.decode(em, [2, 3, 1], tiles, True, backwards)])
    seen = [_tile_ids(source, pid, {}) for pid in range(11 * 3 * 2)]
    assert sorted(tuple(sorted(t.items())) for t in seen) == \
        [(("tid1", h), ("tid2", n), ("tid3", m)) for h in range(2) for n in range(3) for m in range(11)]
    last = {3: 10, 2: 2, 1: 1}
    assert seen[0] == {f"tid{lid}": last[lid] if lid in backwards else 0 for lid in tiles}


def _upper_triangle() -> Graph:
    """Attention that keeps key j for query j >= i: the q tiles' loops shrink."""
    g = Graph("mha_causal")
    q, k, v = (g.input(n, ("b", "h", "s", "d"), "bf16") for n in "qkv")
    scores = (q @ k.T).cast("f32") * scale(g, "d")
    i, j = g.iota(("s", "s"), axis=0), g.iota(("s", "s"), axis=1)
    o, e, m = _online_softmax_av(g.add("where", j >= i, scores, g.const(NEG_INF)), v)
    g.output(o.cast("bf16"), names=["o"])
    return _cand(g, [(e, m, EXP)])


def _window():
    return cleave.search(window_graph(100), progress=False).best


@pytest.mark.parametrize("make, trips", [(_upper_triangle, "decreasing"), (_window, "unknown")],
                         ids=["upper", "window"])
def test_other_orders_stay(make, trips):
    """Loops that shrink along the q tiles already run longest first; a window's loop
    (both bounds move with the q tile) is not known to grow: program 0 keeps q tile 0."""
    env = {"b": 1, "h": 2, "s": 163, "d": 16}
    plan = schedule(make(), env, target=LOOPS, top_k=1)[0]
    kernel, loop, spans = _spans(plan, env)
    (q,) = loop["trips"]
    assert loop["trips"] == {q: trips}
    assert spans[0][0][f"tid{q[1:]}"] == 0
