"""Loop bounds loaded per program (scheduler/bounds.py): a mask `pos < lens[b]`, or a
CSR range `start[b] <= pos < end[b]`, bounds each program's kv loop by its own request,
read from the index tensor; the tiles at the range's ends keep the mask. An `or` of
compares does not bound the loop (skipping a tile is exact only where the where takes
its neutral constant on all of it). Run under TRITON_INTERPRET=1 against the fp64
interpreter, with random lengths, empty requests included.
"""
import os
import re

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from cleave.interpreter import interpret
from cleave.ir import Graph
from cleave.runtime.launch import launch
from cleave.scheduler import schedule
from kernel_check import LOOPS, check_outputs, loaded, loop_bounds

NEG_INF = float("-inf")


def _attention(g, q, k, v, keep):
    """Softmax over the kept positions, @ v, with FlashInfer's empty rows: output 0."""
    s = g.add("where", keep, (q @ k.T).cast("f32"), g.const(NEG_INF))
    m = s.max(-1, keepdim=True)
    m = g.add("where", m.eq(g.const(NEG_INF)), g.const(0.0), m)
    e = (s - m).exp()
    total = e.sum(-1, keepdim=True)
    return (e.cast("bf16") @ v) / g.add("where", total.eq(g.const(0.0)), g.const(1.0), total)


def _graph(mask: str) -> Graph:
    """q [b, h, d] against each request's own k, v [b, n, d]; request b keeps positions
    by `mask`: "len" (pos < ends[b]), "csr" (starts[b] <= pos < ends[b]) or "or"
    (pos < ends[b] or pos >= starts[b])."""
    g = Graph(f"loaded_bounds_{mask}")
    q = g.input("q", ("b", "h", "d"), "bf16")
    k, v = (g.input(name, ("b", "n", "d"), "bf16") for name in "kv")
    starts, ends = (g.input(name, ("b",), "i32") for name in ("starts", "ends"))
    pos = g.iota(("b", "h", "n"), axis=2, dtype="i32")
    lo, hi = (x.reshape("b", 1, 1) for x in (starts, ends))
    below, above = pos < hi, pos >= lo
    keep = {"len": below, "csr": g.add("where", above, below, g.const(False, "bool")),
            "or": g.add("where", below, g.const(True, "bool"), above)}[mask]
    g.output(_attention(g, q, k, v, keep).cast("bf16"), names=["o"])
    return g


def _paged_graph() -> Graph:
    """As _graph("csr"), over pages of p tokens: request b keeps the tokens of pages
    starts[b] <= page < ends[b], a token's page read through the reshape of [m, p]
    page numbers into m*p tokens (floor(token / p) % m as an index)."""
    g = Graph("loaded_bounds_pages")
    q = g.input("q", ("b", "h", "d"), "bf16")
    k, v = (g.input(name, ("b", "m", "p", "d"), "bf16").reshape("b", "m*p", "d") for name in "kv")
    starts, ends = (g.input(name, ("b",), "i32") for name in ("starts", "ends"))
    page = g.iota(("b", "h", "m", "p"), axis=2, dtype="i32").reshape("b", "h", "m*p")
    lo, hi = (x.reshape("b", 1, 1) for x in (starts, ends))
    keep = g.add("where", page >= lo, page < hi, g.const(False, "bool"))
    g.output(_attention(g, q, k, v, keep).cast("bf16"), names=["o"])
    return g


def _inputs(env, starts, ends, seed):
    gen = torch.Generator().manual_seed(seed)
    b, h, d = (env[a] for a in "bhd")
    tokens = (env["n"],) if "n" in env else (env["m"], env["p"])  # a paged graph's kv: [b, m, p, d]
    floats = {name: torch.randn(*shape, generator=gen).to(torch.bfloat16)
              for name, shape in (("q", (b, h, d)), ("k", (b, *tokens, d)), ("v", (b, *tokens, d)))}
    return {**floats, "starts": torch.tensor(starts, dtype=torch.int32), "ends": torch.tensor(ends, dtype=torch.int32)}


def _run(mask, env, starts, ends, seed):
    g = _paged_graph() if mask == "pages" else _graph(mask)
    plan = schedule(g, env, target=LOOPS, top_k=1)[0]
    inputs = _inputs(env, starts, ends, seed)
    want = interpret(g, inputs, compute_dtype=torch.float64)
    check_outputs(launch(plan, inputs), want, f"{mask}: starts {starts}, ends {ends}")
    return plan


def test_length_mask_bounds_each_programs_loop_by_its_loaded_length():
    env = {"b": 4, "h": 3, "n": 45, "d": 16}
    plan = _run("len", env, [0] * 4, [45, 0, 17, 1], seed=1)
    (kernel,) = [k for k in plan.kernels if loop_bounds(k.source)]
    ends = loaded(kernel.source, "ends")
    assert ends, kernel.source
    for start, stop in loop_bounds(kernel.source):  # every loop: up to the loaded length at most
        assert stop != "45" and re.search(rf"{stop} = .*\b({'|'.join(ends)})\b", kernel.source), (stop, kernel.source)


def test_csr_range_bounds_the_loop_from_both_loaded_ends():
    env = {"b": 5, "h": 3, "n": 70, "d": 16}
    starts, ends = [3, 40, 40, 0, 69], [38, 40, 70, 64, 70]  # an empty request, and one of 1 token
    plan = _run("csr", env, starts, ends, seed=2)
    source = "\n".join(k.source for k in plan.kernels)
    bounds = loop_bounds(source)
    assert bounds and all(start != "0" for start, _ in bounds), bounds
    first = re.search(r"(lo\d+) = (.*)", source)
    assert first and loaded(source, "starts") & set(re.findall(r"v\d+", first.group(2))), source
    # whole tiles inside every request's range run without the mask
    assert any(start.startswith("full_lo") for start, _ in bounds)


def test_or_of_compares_keeps_the_whole_loop():
    env = {"b": 3, "h": 2, "n": 37, "d": 16}
    plan = _run("or", env, [30, 37, 5], [4, 0, 9], seed=3)
    bounds = [b for k in plan.kernels for b in loop_bounds(k.source)]
    assert bounds and all(start in ("0", "whole") or start.startswith("whole") for start, _ in bounds), bounds


def test_page_range_bounds_the_token_loop_through_the_page_division():
    """Tokens are m pages of p: the page of a token is floor(token / p) % m, and the CSR
    range over pages bounds the loop over tokens at p * starts[b] .. p * ends[b]."""
    env = {"b": 4, "h": 2, "m": 9, "p": 3, "d": 16}
    starts, ends = [2, 5, 5, 0], [5, 5, 9, 1]  # an empty request, one of a single page
    plan = _run("pages", env, starts, ends, seed=4)
    source = "\n".join(k.source for k in plan.kernels)
    bounds = loop_bounds(source)
    assert bounds and all(start != "0" for start, _ in bounds), bounds
    for side, buffer in (("lo", "starts"), ("hi", "ends")):
        bound = re.search(rf"^\s*{side}\d+ = (.*)$", source, re.M)
        assert bound and loaded(source, buffer) & set(re.findall(r"v\d+", bound.group(1))), (side, source)
        assert re.search(r"v\d+ \* p\b", bound.group(1)), bound.group(1)  # the page's first token


def test_cost_model_counts_a_programs_own_range_not_the_whole_loop():
    """With loaded bounds a program runs its own request's tiles: a CSR over b requests
    partitions the extent (1/b of it per program, on average), a length against a padded
    extent is taken as half of it. The kernel's `loops` carry the share the cost model
    counts (scheduled only: nothing runs)."""
    for mask, share in (("csr", 1 / 4), ("len", 1 / 2), ("or", 1.0)):
        env = {"b": 4, "h": 2, "n": 4096, "d": 16}
        plan = schedule(_graph(mask), env, target=LOOPS, top_k=1)[0]
        loops = [loop for k in plan.kernels for loop in k.loops if loop["extent"] == "n"]
        assert loops and all(abs(loop["fraction"] - share) < 0.02 for loop in loops), (mask, loops)


def test_a_bound_is_worth_what_its_printed_code_computes():
    """Bounds stay values until codegen prints them (scheduler/loop_bounds.py), and the
    cost model evaluates them at the scheduled shapes: each value must be what the
    printed line computes, for starts below 0 too (clamped before rounding to a tile)."""
    import types

    import sympy

    from cleave.scheduler.loop_bounds import Tiles, maximum, minimum, nest, render, symbol, tid, value

    row, n = tid(0), sympy.Symbol("n", integer=True, positive=True)
    lo = Tiles(maximum(nest("minimum", [16 * row - 40, sympy.floor(row / 3) * 5]), 0), 16)
    full_lo = maximum(Tiles(maximum(16 * row + 15 - 40, 0), 16, up=True), symbol("lo1"))
    hi = minimum(n, 16 * row + 16)
    assert render(Tiles(maximum(symbol("hi1"), 0), 16)) == "tl.maximum(hi1, 0) // 16 * 16"
    tl = types.SimpleNamespace(maximum=max, minimum=min)
    for t in range(6):
        env = {"tid0": t, "n": 45, "lo1": value(lo, {"tid0": t})}
        for bound in (lo, full_lo, hi):
            assert value(bound, env) == eval(render(bound), {"tl": tl}, env), (render(bound), env)
