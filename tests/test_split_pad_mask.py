"""A Split's padding is masked in only where a valid lane can reach it: at a count of 1
(the plan the scheduler ranks first for a prefill's kv) every chunk index is in range,
and the lanes past a label's extent are masked by the reductions that read them. The
ragged prefill's whole-tile kv segment had a where per score, per probability and per V
element from the three splits of its keys."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from cleave.ir import Graph
from cleave.scheduler import schedule
from kernel_check import LOOPS, run_and_check


def split_exp_sum() -> Graph:
    g = Graph("split_exp_sum")
    x = g.input("x", ("m", "n"), "f32")
    g.output(x.exp().split(1, "s", pad=0.0).sum(-1).sum(-1), names=["y"])
    return g


@pytest.mark.parametrize("n", [64, 50])
def test_a_split_of_count_one_masks_no_padding(n):
    g, env = split_exp_sum(), {"m": 5, "n": n}
    (plan,) = schedule(g, env, target=LOOPS, top_k=1, split={"s": 1})
    source = plan.kernels[0].source
    body = source[source.index(f"def {plan.kernels[0].name}("):]
    if n % 32 == 0:  # tiles divide the axis: nothing to mask at all
        assert "tl.where" not in body, body
    run_and_check(g, plan, env, seed=n)


def test_a_split_whose_chunks_overhang_keeps_its_padding():
    g, env = split_exp_sum(), {"m": 5, "n": 50}
    (plan,) = schedule(g, env, target=LOOPS, top_k=1, split={"s": 3})
    source = plan.kernels[0].source
    assert "tl.where" in source[source.index(f"def {plan.kernels[0].name}("):]
    run_and_check(g, plan, env, seed=3)
