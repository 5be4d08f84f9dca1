"""A split's zero pad over a gathered operand (MLA's latent rows, `take(ckv, kv_indices)`)
needs no `tl.where`: a lane whose index load is masked gathers through a stand-in index,
and that gathered load is masked too, so the lane reads 0 like a plain masked load. The
where kept the V tile in registers and off the pipelined loads (the MLA decode's large
step ran 0.36 ms with it, 0.15-0.21 without, H200: RESULTS.md, session 11)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import re

import pytest
import torch

from cleave.interpreter import interpret
from cleave.ir import Graph
from cleave.runtime.launch import launch
from cleave.scheduler import schedule
from kernel_check import LOOPS, check_outputs, loaded


def gathered_split_dot(index_view=None) -> Graph:
    """sum over s of P's chunks times the gathered rows' chunks (FlashDecoding's P·V)."""
    g = Graph("gathered_split_dot")
    p = g.input("p", ("m", "n"), "f32")
    v = g.input("v", ("pages", "d"), "bf16")
    if index_view == "slice":  # an index read past a slice's stop still lies in the tensor
        idx = g.input("idx", ("n + 3",), "i32")
        idx = idx.slice(0, 0, idx.shape[0] - 3)
    else:
        idx = g.input("idx", ("n",), "i32")
    rows = g.add("take", v, idx, axis=0)
    chunks = p.split(1, "s", pad=0.0).permute(1, 0, 2) @ rows.split(0, "s", pad=0.0)
    g.output(chunks.sum(0), names=["y"])
    return g


def _inputs(env, seed):
    """Row 0 of v, where a masked index lane points, is NaN; no valid lane gathers it."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(env["pages"], env["d"], generator=gen).to(torch.bfloat16)
    v[0] = float("nan")
    n = env["n"]
    idx = torch.randint(1, env["pages"], (n + env.get("extra", 0),), generator=gen, dtype=torch.int32)
    idx[n:] = 0  # past a slice's stop: the NaN row
    return {"p": torch.rand(env["m"], n, generator=gen), "v": v, "idx": idx}


def _check(g, plan, env, seed):
    inputs = _inputs(env, seed)
    ref = interpret(g, inputs, compute_dtype=torch.float64, env=plan.split)
    out = [torch.full(tuple(r.shape), float("nan"), dtype=torch.float32) for r in ref]
    check_outputs(launch(plan, inputs, out=out), ref, f"split {plan.split}, binding {env}")


@pytest.mark.parametrize("count, n", [(3, 50), (4, 50), (4, 48)])  # 50 = 3 * 17 - 1 = 4 * 13 - 2: chunks overhang
def test_a_gathered_operand_is_padded_by_its_masked_index(count, n):
    env = {"m": 5, "n": n, "pages": 23, "d": 16}
    g = gathered_split_dot()
    plans = schedule(g, env, target=LOOPS, top_k=3, split={"s": count})
    for plan in plans:
        source = plan.kernels[0].source
        for name in loaded(source, "v"):  # the rows go to the dot as loaded, not re-masked
            assert not re.search(rf"tl\.where\([^\n]*\b{name}\b", source), source
        _check(g, plan, env, seed=count)


def test_a_sliced_index_keeps_the_pad():
    env = {"m": 5, "n": 50, "pages": 23, "d": 16, "extra": 3}
    g = gathered_split_dot("slice")
    (plan,) = schedule(g, {k: v for k, v in env.items() if k != "extra"}, target=LOOPS, top_k=1, split={"s": 3})
    _check(g, plan, env, seed=5)


def test_a_gather_no_pad_relies_on_keeps_its_own_mask():
    """At a count of 1 no lane reaches the pad: the rows' load is not predicated on the
    index load's mask too (that predicate slowed MLA decode's unsplit plan by 37%)."""
    env = {"m": 5, "n": 50, "pages": 23, "d": 16}
    g = gathered_split_dot()
    (plan,) = schedule(g, env, target=LOOPS, top_k=1, split={"s": 1})
    source = plan.kernels[0].source
    index_masks = set(re.findall(r"tl\.load\(idx_ptr[^\n]*mask=(\w+)", source))
    assert index_masks, source
    for line in source.splitlines():
        if "tl.load(v_ptr" in line:
            assert not any(re.search(rf"\b{m}\b", line) for m in index_masks), line
    _check(g, plan, env, seed=1)
