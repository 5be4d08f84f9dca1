"""`cleave explain WORKLOAD`: compile a workload's reference and show what cleave did."""
from __future__ import annotations

import argparse
import sys

from ..ir import CleaveError

EPILOG = """examples:
  TRITON_INTERPRET=1 cleave explain rmsnorm_matmul
  TRITON_INTERPRET=1 cleave explain gqa_decode --binding 1
  cleave explain gqa_decode --preset b8_L8192 --device cuda
"""


def register(sub) -> None:
    p = sub.add_parser("explain", help="compile a workload and show graph, derivation, schedule, kernels",
                       description="Compile a workload's PyTorch reference with cleave.compile (dynamic axes as "
                                   "the workload declares them) and print cleave.explain's report: the captured "
                                   "graph, the chosen candidate and its derivation, the schedule and every "
                                   "kernel's Triton source and grid.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    p.add_argument("workload")
    p.add_argument("--binding", type=int, default=0, help="index of the workload's small test binding (CPU)")
    p.add_argument("--preset", help="a named shape preset instead (GPU-sized)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.set_defaults(func=_explain)


def _explain(args) -> int:
    import torch

    from .. import compile, explain, workloads

    if args.device == "cuda" and not torch.cuda.is_available():
        raise CleaveError("--device cuda: no CUDA device here (use --device cpu with TRITON_INTERPRET=1)")
    w = workloads.get(args.workload)
    if args.preset:
        env = w.presets.get(args.preset)
        if env is None:
            raise ValueError(f"{w.name} has no preset {args.preset!r}; presets: {', '.join(w.presets)}")
    else:
        if not 0 <= args.binding < len(w.test_bindings):
            raise ValueError(f"--binding must be in 0..{len(w.test_bindings) - 1}")
        env = w.test_bindings[args.binding]
    inputs = w.inputs(env, device=args.device)
    print(f"compiling {w.name} at " + " ".join(f"{k}={v}" for k, v in env.items()) + " ...",
          file=sys.stderr, flush=True)
    print(explain(compile(w.reference, dynamic=w.dynamic, device=args.device), *inputs.values()))
    return 0
