"""`cleave bench WORKLOAD`: time the compiled plans against the baselines on CUDA."""
from __future__ import annotations

import argparse
import json

from ..ir import CleaveError


def register(sub) -> None:
    p = sub.add_parser(
        "bench", help="time a workload's compiled plans against eager, torch.compile, SDPA, flex (CUDA)",
        description="Search and schedule WORKLOAD at its presets (or load plans written by "
                    "`python -m benchmarks.build`), then time every kept plan and the baselines on the "
                    "same CUDA inputs and print ratios. Needs a CUDA device.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  cleave bench gqa_decode\n  cleave bench gqa_decode --preset b1_L131072\n"
               "  cleave bench mha --plans benchmarks/plans/mha__prefill.json")
    p.add_argument("workload")
    p.add_argument("--preset", action="append", help="preset name (repeatable; default: all)")
    p.add_argument("--plans", help="a plan file from benchmarks.build (skips the search)")
    p.set_defaults(func=_bench)


def _bench(args) -> int:
    import torch

    from .. import workloads
    from ..benchmarking import bench_spec, plan_specs, table

    if not torch.cuda.is_available():
        raise CleaveError("bench needs a CUDA device: timings under the Triton interpreter mean nothing")
    if args.plans:
        with open(args.plans) as f:
            specs = [json.load(f)]
    else:
        presets = workloads.get(args.workload).presets
        unknown = [p for p in args.preset or () if p not in presets]
        if unknown:  # plan_specs would skip them and time nothing
            raise CleaveError(f"--preset: {args.workload} has no preset {', '.join(unknown)}; "
                              f"presets: {', '.join(presets)}")
        specs = plan_specs(args.workload, presets=args.preset)
    print(table([bench_spec(spec) for spec in specs]))
    return 0
