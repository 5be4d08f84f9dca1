"""Search and schedule every workload preset here (egglog and z3 live on this
machine), writing the ranked plans as JSON for `benchmarks.run` on the GPU box.

    python -m benchmarks.build --out benchmarks/plans [--only gqa_decode mha] [--f32-matmul medium] [--index-prefetch]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

from cleave.benchmarking import plan_specs
from cleave.scheduler.target import F32_MATMUL_PRECISIONS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/plans")
    p.add_argument("--only", nargs="*")
    p.add_argument("--top-plans", type=int, default=4)
    p.add_argument("--f32-matmul", default="highest", choices=F32_MATMUL_PRECISIONS,
                   help="the torch.set_float32_matmul_precision the plans honour, and the baselines run at")
    p.add_argument("--index-prefetch", action="store_true",
                   help="load loops' index tiles a step ahead (Target.index_prefetch), to time beside the default")
    args = p.parse_args(argv)
    from cleave import workloads

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only or workloads.names():
        for spec in plan_specs(name, args.top_plans, f32_matmul=args.f32_matmul, index_prefetch=args.index_prefetch):
            path = out / f"{name}__{spec['preset']}.json"
            path.write_text(json.dumps(spec, indent=1))
            kernels = [len(p["kernels"]) for p in spec["plans"]]
            print(f"{name} {spec['preset']}: {len(kernels)} plans, kernels per plan {kernels}, "
                  f"search {spec['search_seconds']:.1f}s -> {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
