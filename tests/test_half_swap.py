"""A projection feeding RoPE: rotate_half reads the projection at the head index j + c
and j - c (c = half the head dim). With the head dim tiled whole, the kernel runs the
projection's tl.dot once and swaps the tile's halves in registers (scheduler/half_swap.py);
otherwise it computes each rotated half as before. Both against the fp64 interpreter."""
from __future__ import annotations

import pytest

import cleave
from cleave.ir import Graph
from kernel_check import LOOPS, run_and_check

SMALL = {"s": 37, "k": 40, "h": 2, "d": 32}  # odd rows, two heads, c = 16


def projection_rope(dtype: str, half=None) -> Graph:
    """rope(x @ w) per head: x (s, k), w (h, k, d) -> (h, s, d); rotated by `half` of the
    head dim (d/2 unless given: any other is no rotate_half, nor a half swap)."""
    g = Graph(f"projection_rope_{dtype}")
    x = g.input("x", ("s", "k"), dtype)
    w = g.input("w", ("h", "k", "d"), dtype)
    cos = g.input("cos", ("s", "d"), "f32")
    sin = g.input("sin", ("s", "d"), "f32")
    y = (x @ w).cast("f32")
    d = y.shape[-1]
    c = d / 2 if half is None else half
    rotated = g.add("concat", -y.slice(-1, c, d), y.slice(-1, 0, c), axis=2)
    return g.output((y * cos + rotated * sin).cast(dtype), names=["o"])


def _kernel(graph, env, **kw):
    (plan,) = cleave.schedule(graph, env, top_k=1, **kw)
    (kernel,) = plan.kernels
    return plan, kernel.source


def dots_per_step(source: str) -> float:
    """tl.dot calls per step over K: per loop segment (whole tiles, then the tail), or
    in all when K is held whole."""
    return source.count("tl.dot(") / max(1, source.count("for start"))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("target", ["whole_k", "k_loop"])
def test_rotated_halves_of_a_projection_share_its_dot(dtype, target):
    graph = projection_rope(dtype)
    plan, source = _kernel(graph, SMALL, **({"target": LOOPS} if target == "k_loop" else {}))
    assert dots_per_step(source) == 1, source
    assert source.count("tl.split(") == 1, source  # the +c and -c rolls are one roll
    if target == "k_loop":
        assert "for start" in source
    for seed in range(2):
        run_and_check(graph, plan, SMALL, seed=seed)


@pytest.mark.parametrize("case", ["quarter_shift", "head_48", "dynamic_head", "partial_head_tile"])
def test_without_one_period_per_tile_each_half_is_computed(case):
    """A roll by a quarter (not a half), a head of 48 (its tile of 64 is no period), a
    dynamic head dim (its tile is not known to be one period), a head tiled in halves:
    the old path, still exact."""
    env, kw = dict(SMALL), {}
    graph = projection_rope("f32", half=8 if case == "quarter_shift" else None)
    if case == "head_48":
        env["d"] = 48
    if case == "dynamic_head":
        kw["dynamic"] = {"d"}
    if case == "partial_head_tile":
        env["d"] = 512  # past hold_matmul: tiled in 64 to 256
        kw["target"] = LOOPS
    plan, source = _kernel(graph, env, **kw)
    assert "tl.split(" not in source and dots_per_step(source) == 3, source
    run_and_check(graph, plan, env, seed=0)


def test_rotated_halves_of_loaded_queries_and_keys_are_loaded_once():
    """RoPE in attention's prologue: q and k are each read once, their rotated halves
    swapped from that tile."""
    from cleave import workloads
    from kernel_check import loaded

    graph = workloads.get("rope_attention_causal").graph
    env = {"b": 1, "h": 3, "s": 37, "d": 16}
    (plan,) = cleave.schedule(graph, env, top_k=1)
    (kernel,) = plan.kernels
    assert len(loaded(kernel.source, "q")) == 1 and kernel.source.count("tl.split(") >= 2, kernel.source
    run_and_check(graph, plan, env, seed=0)
