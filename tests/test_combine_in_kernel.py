"""A split's combine runs in its partial kernel (scheduler/combine.py): the last program
of each group to arrive reduces the group's partials, so a split plan is one launch. It
must be exact whatever the order of arrival, leave its counters zero for the next call,
and stay two kernels where the combine's tiles do not fit the partial's."""
import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from cleave import workloads as W
from cleave.interpreter import interpret
from cleave.ir import Graph, parse_graph
from cleave.runtime import launch as L
from cleave.scheduler import combine, schedule
from fixtures_candidates import CANDIDATES
from kernel_check import LOOPS, check_outputs


def _counters_zero() -> bool:
    return all(int(t.abs().sum()) == 0 for t in L._ARRIVALS.values())


def _check(graph, plan, inputs, reference=None, calls=2):
    ref = interpret(reference or graph, inputs, compute_dtype=torch.float64, env=plan.split)
    dtypes = [t.dtype for t in interpret(graph, inputs, env=plan.split)]
    for call in range(calls):  # the second call finds the counters the first one left
        out = [torch.full(tuple(r.shape), float("nan"), dtype=dtype) for r, dtype in zip(ref, dtypes)]
        check_outputs(L.launch(plan, inputs, out=out), ref, f"call {call}, split {plan.split}")
        assert _counters_zero()


@pytest.mark.parametrize("b, L_", [(3, 77), (1, 130), (5, 40)])
def test_split_decode_is_one_launch_at_every_shape(b, L_):
    env = {"b": 3, "hkv": 2, "g": 3, "L": 77, "d": 16}
    (plan,) = schedule(CANDIDATES["gqa_decode"](), env, dynamic={"b", "L"}, target=LOOPS, top_k=1, split={"sp": 4})
    assert [bool(k.arrivals) for k in plan.kernels] == [True]
    assert 'cache_modifier=".cg"' in plan.kernels[0].source  # partials are read past L1
    w = W.get("gqa_decode")
    inputs = w.inputs({**env, "b": b, "L": L_}, seed=b * L_)
    _check(parse_graph(plan.graph), plan, inputs, reference=w.graph)


def split_k() -> Graph:
    g = Graph("split_k")
    x = g.input("x", ("m", "k"), "bf16")
    w = g.input("w", ("k", "n"), "bf16")
    chunks = x.split(1, "s", pad=0.0).permute(1, 0, 2) @ w.split(0, "s", pad=0.0)
    g.output(chunks.cast("f32").sum(0).cast("bf16"), names=["y"])
    return g


def _matmul_inputs(m, k, n, seed):
    gen = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(m, k, generator=gen).bfloat16(), "w": torch.randn(k, n, generator=gen).bfloat16()}


def test_every_ranked_split_k_tiling_can_combine_in_the_partial_kernel(monkeypatch):
    """Where the model would fuse (its serialized tail forced to 0 here), every plan is one
    launch: the combine's best tiling may be wider than the partial's tile, and the
    first of its tilings that fits is taken."""
    monkeypatch.setattr(combine, "serial_tail", lambda *args, **kwargs: 0.0)
    g, env = split_k(), {"m": 300, "k": 200, "n": 260}
    plans = schedule(g, env, top_k=4, split={"s": 3})
    assert len(plans) == 4 and all([bool(k.arrivals) for k in p.kernels] == [True] for p in plans)
    for p in plans:
        _check(g, p, _matmul_inputs(300, 200, 260, seed=len(p.kernels[0].source)))


def test_a_persistent_split_k_gemm_combines_per_tile(monkeypatch):
    """A persistent GEMM's programs loop over tiles: each tile arrives in its group."""
    monkeypatch.setattr(combine, "serial_tail", lambda *args, **kwargs: 0.0)
    g = split_k()
    (plan,) = schedule(g, {"m": 4096, "k": 4096, "n": 4096}, dynamic={"m", "k", "n"}, top_k=1, split={"s": 2})
    (kernel,) = plan.kernels
    assert kernel.arrivals and kernel.programs_per_sm > 0
    # triton 3.6 fails to flatten the tile loop with its K loop around the combine's `if`
    # (an s = 4 plan at 4096 x 4096 x 6144): that loop runs unflattened; a GEMM's without
    # a combine stays flattened
    assert "tl.num_programs(0)):" in kernel.source and "flatten=True" not in kernel.source
    (plain,) = schedule(g, {"m": 4096, "k": 4096, "n": 4096}, dynamic={"m", "k", "n"}, top_k=1, split={"s": 1})
    assert plain.kernels[0].programs_per_sm > 0 and "flatten=True" in plain.kernels[0].source
    for m, k, n in ((37, 70, 45), (130, 33, 300)):  # more tiles than the interpreter's 4 SMs run at once
        _check(g, plan, _matmul_inputs(m, k, n, seed=m))


def test_a_long_serial_combine_keeps_its_own_kernel(monkeypatch):
    """MQA decode at b = 1: one group holds all 32 heads, whose combine tiles the last
    program would run one after another (0.55 ms on the H200 against 0.04 for the two
    kernels): the tiles fit, the model refuses."""
    tails = []
    real = combine.serial_tail

    def spy(*args, **kwargs):
        tails.append(real(*args, **kwargs))
        return tails[-1]

    monkeypatch.setattr(combine, "serial_tail", spy)
    env = W.get("mqa_decode").presets["b1_L131072"]
    plans = schedule(CANDIDATES["mqa_decode"](), env, top_k=2, split={"sp": 264})
    assert tails and all(len(p.kernels) == 2 and not any(k.arrivals for k in p.kernels) for p in plans)


def test_a_combine_tile_wider_than_the_partial_tile_is_refused(monkeypatch):
    seen = []
    real = combine.tile_map

    def spy(p, pt, c, ct):
        seen.append((p, pt, c, ct))
        return real(p, pt, c, ct)

    monkeypatch.setattr(combine, "tile_map", spy)
    schedule(split_k(), {"m": 300, "k": 200, "n": 260}, top_k=1, split={"s": 3})
    p, pt, c, ct = next(x for x in seen if real(*x))
    # a label the partial tiles in more than one tile: a combine tile twice as wide
    # would wait on two groups
    cl, (pl, _, _) = next((cl, v) for cl, v in real(p, pt, c, ct).items() if v[2] and 1 < pt.rows(v[0]) < 300)
    assert real(p, pt, c, dataclasses.replace(ct, block={**ct.block, cl: 2 * pt.rows(pl)}, step={})) is None
    assert real(p, pt, c, dataclasses.replace(ct, block={**ct.block, cl: pt.rows(pl) // 2}, step={})) is not None
