"""Every workload end to end: search (rules, saturation, extraction), then schedule,
then Triton codegen, run under TRITON_INTERPRET=1 at small odd shapes against the
fp64 interpreter of the *naive* graph, with NaN-poisoned outputs. Kernel counts are
those the fused schedules must reach."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave
from cleave import workloads as W
from cleave.scheduler import schedule
from kernel_check import LOOPS, computed_kernels, run_and_check

DECODE = ("gqa_decode", "mqa_decode", "mla_decode")
ONE_KERNEL = ("mha", "gqa", "mha_causal", "gqa_causal", "rope_attention_causal", "rmsnorm_matmul", "swiglu",
              "moe_routing", "layernorm")
OTHERS = ("matmul", "matmul_matmul", "matmul_rowsum")

_SEARCHED: dict = {}


def best(name: str):
    """The search's best candidate, searched once per test session."""
    if name not in _SEARCHED:
        _SEARCHED[name] = cleave.search(W.get(name).graph, progress=False).best
    return _SEARCHED[name]


def _splits(candidate, value: int) -> dict[str, int]:
    return {s.name: value for s in candidate.graph.symbols() if s.name.startswith("s_")}


@pytest.mark.parametrize("name", ONE_KERNEL)
def test_fuses_to_one_kernel(name):
    cand = best(name)
    env = dict(W.get(name).test_bindings[0])
    plan = schedule(cand, env, target=LOOPS, top_k=1, split=_splits(cand, 1))[0]
    assert len(plan.kernels) == 1, [k.name for k in plan.kernels]
    run_and_check(cand.graph, plan, env, seed=torch.seed() % 1000, reference=W.get(name).graph)


@pytest.mark.parametrize("name", DECODE)
def test_decode_is_two_kernels_when_split_and_one_when_not(name):
    cand = best(name)
    assert _splits(cand, 1), "the decode candidate splits the kv axis"
    env = dict(W.get(name).test_bindings[0])
    split = schedule(cand, env, target=LOOPS, top_k=1, split=_splits(cand, 3))[0]
    assert computed_kernels(split) == 2
    run_and_check(cand.graph, split, env, seed=torch.seed() % 1000, reference=W.get(name).graph)
    whole = schedule(cand, env, target=LOOPS, top_k=1, split=_splits(cand, 1))[0]
    assert len(whole.kernels) == 1
    run_and_check(cand.graph, whole, env, seed=torch.seed() % 1000, reference=W.get(name).graph)


@pytest.mark.parametrize("name", OTHERS)
def test_other_workloads_run(name):
    cand = best(name)
    env = dict(W.get(name).test_bindings[1])
    plan = schedule(cand, env, top_k=1)[0]
    run_and_check(cand.graph, plan, env, seed=torch.seed() % 1000, reference=W.get(name).graph)


@pytest.mark.parametrize("name, axis_sizes", [
    ("gqa_decode", {"b": (2, 1, 3), "L": (77, 40, 129)}),
    ("mha_causal", {"s": (37, 21, 50)}),
])
def test_one_dynamic_plan_serves_three_sizes(name, axis_sizes):
    from cleave.runtime.launch import _MODULES

    cand = best(name)
    base = dict(W.get(name).test_bindings[0])
    split = _splits(cand, 3)
    plan = schedule(cand, base, dynamic=set(axis_sizes), target=LOOPS, top_k=1, split=split)[0]
    for k in range(3):
        env = dict(base, **{axis: sizes[k] for axis, sizes in axis_sizes.items()})
        run_and_check(cand.graph, plan, env, seed=k, reference=W.get(name).graph)
    # One module per kernel, loaded once: later sizes reuse it (the GPU's JIT cache is
    # checked by `cleave trace replay`, which counts Triton recompiles there).
    keys = [(k.name, hash(k.source)) for k in plan.kernels]
    assert all(key in _MODULES for key in keys) and len(set(keys)) == len(plan.kernels)
