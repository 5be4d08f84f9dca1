"""Correctness of every plan at every launch configuration the runtime may give it, on
the GPU: its own, and each one its launch tuning tries (`cleave.runtime.mix
.launch_variants`: the other warp count, a pipeline stage fewer or more at either), against the
workload's fp32 reference. The CPU interpreter cannot see a miscompile of the GPU
backend; the benchmark skips a wrong plan by its error, but the runtime's tuning does not
check results, so a wrong configuration must never be offered.

    python3 -m benchmarks.launch_check --plans DIR    # plan files from benchmarks.build
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

import torch

from cleave.benchmarking import TOLERANCE, _rel_err


def check(spec: dict) -> list[str]:
    """One line per (plan, kernel, configuration) whose result is wrong or fails."""
    from cleave import workloads
    from cleave.runtime.launch import launch
    from cleave.runtime.mix import launch_variants
    from cleave.scheduler import Plan

    w = workloads.get(spec["workload"])
    inputs = w.inputs(spec["env"], seed=1234, device="cuda")
    reference = w.run_reference({k: (v.float() if v.is_floating_point() else v) for k, v in inputs.items()})
    bad, runs = [], 0
    for index, data in enumerate(spec["plans"]):
        plan = Plan.from_json(data)
        for slot, kernel in enumerate(plan.kernels):
            for warps, stages in [(kernel.num_warps, kernel.num_stages)] + launch_variants(kernel):
                if slot and (warps, stages) == (kernel.num_warps, kernel.num_stages):
                    continue  # the plan as built runs once, with slot 0
                kernels = list(plan.kernels)
                kernels[slot] = dataclasses.replace(kernel, num_warps=warps, num_stages=stages)
                label = f"{spec['workload']} {spec['preset']} plan {index} kernel {slot} ({warps} warps, {stages} stages)"
                runs += 1
                try:
                    out = launch(dataclasses.replace(plan, kernels=kernels), inputs)
                    torch.cuda.synchronize()
                    err = max(_rel_err(o, r) for o, r in zip(out, reference) if o.is_floating_point())
                except Exception as exc:
                    bad.append(f"{label}: FAILED {type(exc).__name__}: {str(exc)[:160]}")
                    continue
                if not err <= TOLERANCE:
                    bad.append(f"{label}: WRONG, rel err {err:.2e}")
    print(f"{spec['workload']} {spec['preset']}: {runs} launches, {len(bad)} wrong or failed", file=sys.stderr,
          flush=True)
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plans", required=True)
    args = p.parse_args(argv)
    bad = []
    for f in sorted(pathlib.Path(args.plans).glob("*.json")):
        bad += check(json.loads(f.read_text()))
    print("\n".join(bad) or "every plan at every launch configuration agreed with the reference")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
