"""Shared check for generated kernels: launch a plan on fresh random inputs into
NaN-poisoned outputs and compare with the fp64 reference interpreter."""
import dataclasses

import torch

from cleave import workloads as W
from cleave.interpreter import interpret
from cleave.scheduler import H200, launch

# Holds no reduction whole in a block: every reduction runs as a loop, so tiny test
# shapes exercise iterative tiling, horizontal fusion and the incremental cascade.
LOOPS = dataclasses.replace(H200, full_reduce=16, full_matmul=16)


def run_and_check(graph, plan, env, seed, reference=None):
    """`reference` (default: `graph`) is the graph whose fp64 value the kernels must match."""
    reference = reference or graph
    inputs = W.get(graph.name).inputs(env, seed=seed)
    outs = [torch.full(tuple(int(x) for x in r.shape), float("nan"), dtype=r.dtype) if r.dtype.is_floating_point
            else torch.full(tuple(r.shape), -1, dtype=r.dtype)
            for r in interpret(graph, inputs, env=plan.split)]
    got = launch(plan, inputs, out=outs)
    ref = interpret(reference, inputs, compute_dtype=torch.float64, env=plan.split)
    for g, r, o in zip(got, ref, outs):
        assert g is o
        if r.dtype.is_floating_point:
            err = ((g.double() - r).norm() / r.norm()).item()
            tol = 1e-2 if g.dtype in (torch.bfloat16, torch.float16) else 1e-5
            assert err < tol, f"{graph.name}: relative error {err:.2e} (tolerance {tol:.0e})"
        else:
            assert torch.equal(g.to(r.dtype), r), f"{graph.name}: integer output differs"
