"""Search and schedule every workload preset here (egglog and z3 live on this
machine), writing the ranked plans as JSON for `benchmarks.run` on the GPU box.

    python -m benchmarks.build --out benchmarks/plans [--only gqa_decode mha]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time


def build(name: str, out: pathlib.Path, top_plans: int) -> None:
    import cleave
    from cleave import workloads

    w = workloads.get(name)
    t0 = time.time()
    result = cleave.search(w.graph)
    searched = time.time() - t0
    for preset, env in w.presets.items():
        plans = []
        for cand_index, candidate in enumerate(result.candidates):
            for plan in cleave.schedule(candidate, env, dynamic=set(), top_k=top_plans):
                plans.append((plan.cost, cand_index, plan))
        plans.sort(key=lambda t: t[0])
        chosen = plans[:top_plans]
        record = {
            "workload": name, "preset": preset, "env": env, "search_seconds": searched,
            "candidates": [{"text": c.graph.text(), "derivation": c.derivation} for c in result.candidates],
            "plan_candidates": [i for _, i, _ in chosen],
            "plans": [p.to_json() for _, _, p in chosen],
        }
        path = out / f"{name}__{preset}.json"
        path.write_text(json.dumps(record, indent=1))
        print(f"{name} {preset}: {len(chosen)} plans, kernels per plan "
              f"{[len(p.kernels) for _, _, p in chosen]}, search {searched:.1f}s -> {path}", file=sys.stderr)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/plans")
    p.add_argument("--only", nargs="*")
    p.add_argument("--top-plans", type=int, default=4)
    args = p.parse_args(argv)
    from cleave import workloads

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only or workloads.names():
        build(name, out, args.top_plans)
    return 0


if __name__ == "__main__":
    sys.exit(main())
