"""A split at count 1 is scheduled as the reshape it is (scheduler/unsplit.py): the
split-K candidate of a MatMul at s_k = 1, which the search ranks first, gets the kernel
of the MatMul as written, TMA descriptors included, and stays exact."""
import dataclasses

import pytest
import torch

from cleave import workloads as W
from cleave.interpreter import interpret
from cleave.runtime.launch import launch
from cleave.scheduler import H200, schedule
from cleave.scheduler.unsplit import unsplit
from kernel_check import check_outputs
from test_combine_in_kernel import split_k


def test_a_split_at_one_is_a_reshape_node_for_node():
    g = split_k()
    ones = unsplit(g, {"s": 1})
    assert [n.op for n in ones.nodes].count("split") == 0
    assert [n.id for n in ones.nodes] == [n.id for n in g.nodes]
    assert "s" not in {s.name for s in ones.symbols()}
    assert unsplit(g, {"s": 2}) is None


def test_split_k_at_one_gets_the_matmuls_kernel_with_descriptors():
    env = W.get("matmul").presets["s4096"]
    (split,) = schedule(split_k(), {"m": env["s"], "k": env["k"], "n": env["n"]}, top_k=1, split={"s": 1})
    (kernel,) = split.kernels
    assert {d[1] for d in kernel.descriptors} == {"x", "w"} and "s" not in kernel.args
    assert split.split == {"s": 1}


@pytest.mark.parametrize("m, k, n", [(37, 56, 40), (5, 200, 33)])
def test_split_k_at_one_is_exact(m, k, n):
    one_sm = dataclasses.replace(H200, sms=1, tma_min_tile=16)  # tiny grids get descriptors too
    (plan,) = schedule(split_k(), {"m": m, "k": k, "n": n}, top_k=1, split={"s": 1}, target=one_sm)
    gen = torch.Generator().manual_seed(m * k)
    inputs = {"x": torch.randn(m, k, generator=gen).bfloat16(), "w": torch.randn(k, n, generator=gen).bfloat16()}
    out = [torch.full((m, n), float("nan"), dtype=torch.bfloat16)]
    got = launch(plan, inputs, out=out)
    check_outputs(got, interpret(split_k(), inputs, compute_dtype=torch.float64, env={"s": 1}), f"{m}x{k}x{n}")
