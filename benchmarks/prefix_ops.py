"""Prefix reductions (cumsum, position ids from a mask, logcumsumexp, cummax) compiled by
cleave as reductions over the triangle j <= i, against eager and torch.compile (whose
Triton backend has a scan) on the GPU. The triangle costs O(n^2) adds and O(n^2/tile)
reads where a scan needs O(n): this measures what that costs at serving lengths.

    python -m benchmarks.prefix_ops build --out .gpu_artifacts12/prefix   # here: search, schedule
    python -m benchmarks.prefix_ops run --artifact DIR                    # on the GPU
"""
from __future__ import annotations

import argparse
import sys

import torch

import cleave
from cleave.benchmarking import _bench, _rel_err

# name: (function, dynamic axes of x, shape of x, dtype of x)
PROGRAMS = {
    "cumsum": (lambda x: torch.cumsum(x, dim=-1), {1: "n"}, (8, 4096), torch.float32),
    "positions": (lambda x: (x > 0).long().cumsum(-1) - 1, {1: "n"}, (8, 4096), torch.float32),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, dim=-1), {1: "n"}, (64, 2048), torch.float32),
    "cummax": (lambda x: torch.cummax(x, dim=-1).values, {1: "n"}, (64, 2048), torch.float32),
}


def _compiled(name: str, artifact: str):
    fn, dynamic, _, _ = PROGRAMS[name]
    return cleave.compile(fn, dynamic={"x": dynamic}, artifact=artifact, verbose=False)


def build(out: str) -> None:
    for name, (_, _, shape, dtype) in PROGRAMS.items():
        _compiled(name, out).prepare(torch.empty(shape, dtype=dtype, device="meta"))
        print(f"{name}: prepared in {out}", file=sys.stderr)


def run(artifact: str) -> None:
    print("| program | shape | cleave ms | eager ms | torch.compile ms | × eager | × torch.compile | err |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (fn, _, shape, dtype) in PROGRAMS.items():
        x = torch.randn(shape, dtype=dtype, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        mine, inductor = _compiled(name, artifact), torch.compile(fn, dynamic=True)
        got, want = mine(x), fn(x.double())
        err = _rel_err(got, want.to(got.dtype) if not want.is_floating_point() else want)
        times = [_bench(lambda f=f: f(x)) for f in (mine, fn, inductor)]
        print(f"| {name} | {list(shape)} | {times[0]:.4f} | {times[1]:.4f} | {times[2]:.4f} | "
              f"{times[1] / times[0]:.2f} | {times[2] / times[0]:.2f} | {err:.1e} |", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build").add_argument("--out", required=True)
    sub.add_parser("run").add_argument("--artifact", required=True)
    args = p.parse_args(argv)
    build(args.out) if args.cmd == "build" else run(args.artifact)
    return 0


if __name__ == "__main__":
    sys.exit(main())
