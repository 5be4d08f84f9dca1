"""GPU benchmark: cleave's compiled plans against eager, torch.compile, SDPA and
flex_attention, in one run, as ratios. Runs on the GPU box with the runtime alone
(torch + triton; no egglog, no z3): the plans were searched and scheduled on the
development machine by `python -m benchmarks.build`.

    python3 -m benchmarks.run --plans benchmarks/plans --out $OUT
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
import time

import torch

from cleave.benchmarking import bench_spec, table


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plans", default="benchmarks/plans")
    p.add_argument("--out", default=".")
    p.add_argument("--only", nargs="*", help="workload names to run (default: all plan files)")
    p.add_argument("--skip-baselines", nargs="*", default=[])
    args = p.parse_args(argv)
    import triton

    files = sorted(pathlib.Path(args.plans).glob("*.json"))
    if args.only:
        files = [f for f in files if json.loads(f.read_text())["workload"] in args.only]
    out = pathlib.Path(args.out)
    header = (f"## {datetime.date.today()} — {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"triton {triton.__version__}\n\nRatios are baseline time / cleave time (higher is better); "
              f"medians of triton.testing.do_bench; err is the relative L2 error of cleave's output against "
              f"the fp32 PyTorch reference.\n\n")
    rows = []
    for f in files:
        _log(f"[{len(rows) + 1}/{len(files)}] {f.name}")
        t0 = time.time()
        rows.append(bench_spec(json.loads(f.read_text()), set(args.skip_baselines)))
        _log(f"  done in {time.time() - t0:.1f}s")
        # Written after every preset, so that a run cut short still leaves its table.
        (out / "bench.json").write_text(json.dumps(rows, indent=1))
        (out / "bench.md").write_text(header + table(rows) + "\n")
    print((out / "bench.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
