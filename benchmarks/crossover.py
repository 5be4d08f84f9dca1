"""Fuse a MatMul's computed operand or materialise it: the cost model's crossover,
measured on both sides (issue 13). RoPE + causal attention rotates each key once per
query tile when fused, once in a producer kernel when cut; the model fuses at short
sequences and cuts at long ones (scheduler/recompute.py). For each length this writes
one plan file whose plan 0 is the model's choice and plan 1 the other partition
(`Target.recompute_weight` 0 or inf), for `benchmarks.run` to time with its baselines.

    python -m benchmarks.crossover --out DIR [--seqs 256 512 1024]
    python -m benchmarks.run --plans DIR --out OUT          # on the GPU
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
import time

WORKLOAD = "rope_attention_causal"


def specs(seqs: list[int]) -> list[dict]:
    """Per length: the model's plan and the other partition's, with the choice named."""
    from cleave import search, workloads
    from cleave.scheduler import H200, schedule

    w = workloads.get(WORKLOAD)
    start = time.time()
    result = search(w.graph)
    searched = time.time() - start
    candidate = result.candidates[0]
    out = []
    for s in seqs:
        env = {**w.presets["prefill"], "s": s}
        chosen = schedule(candidate, env, top_k=1)[0]
        fused = len(chosen.kernels) == 1
        weight = math.inf if fused else 0.0
        other = schedule(candidate, env, top_k=1, target=dataclasses.replace(H200, recompute_weight=weight))[0]
        if len(other.kernels) == len(chosen.kernels):
            raise SystemExit(f"{WORKLOAD} s={s}: forcing the other side gave the same partition")
        out.append({"workload": WORKLOAD, "preset": f"s{s}", "env": env, "search_seconds": searched,
                    "candidates": [{"text": candidate.graph.text(), "derivation": candidate.derivation}],
                    "plan_candidates": [0, 0], "plans": [chosen.to_json(), other.to_json()],
                    "crossover": {"model": "fused" if fused else "cut", "plan 1": "cut" if fused else "fused"}})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--seqs", nargs="*", type=int, default=[256, 512, 1024])
    args = p.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for spec in specs(args.seqs):
        path = out / f"{WORKLOAD}__{spec['preset']}.json"
        path.write_text(json.dumps(spec, indent=1))
        print(f"{spec['preset']}: model {spec['crossover']['model']} "
              f"({len(spec['plans'][0]['kernels'])} kernel(s)), plan 1 {spec['crossover']['plan 1']} -> {path}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
