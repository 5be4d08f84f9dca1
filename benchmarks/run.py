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
import math
import pathlib
import sys
import time

import torch


def _bench(fn, warmup=25, rep=100) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not out.is_floating_point():
        return float((out.cpu() != ref.cpu()).float().mean())
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return math.inf
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bench_file(path: pathlib.Path, skip_baselines: set[str]) -> dict:
    from cleave import workloads
    from cleave.scheduler import Plan, launch

    from .baselines import baselines

    spec = json.loads(path.read_text())
    w = workloads.get(spec["workload"])
    env = spec["env"]
    inputs = w.inputs(env, seed=1234, device="cuda")
    ref_inputs = {k: (v.float() if v.is_floating_point() else v) for k, v in inputs.items()}
    reference = w.run_reference(ref_inputs)
    row = {"workload": spec["workload"], "preset": spec["preset"], "env": env, "plans": []}
    for k, plan_json in enumerate(spec["plans"]):
        plan = Plan.from_json(plan_json)
        try:
            out = launch(plan, inputs)
            torch.cuda.synchronize()
            err = max(_rel_err(o, r) for o, r in zip(out, reference) if o.is_floating_point())
            ms = _bench(lambda: launch(plan, inputs))
        except Exception as exc:  # a plan that fails on the GPU is reported, not hidden
            row["plans"].append({"index": k, "error": f"{type(exc).__name__}: {exc}"[:400]})
            _log(f"  plan {k}: FAILED {exc}")
            continue
        row["plans"].append({"index": k, "ms": ms, "rel_err": err, "split": plan.split, "tiles": plan.tiles,
                             "kernels": len(plan.kernels)})
        _log(f"  plan {k}: {ms:.4f} ms  err {err:.2e}  split {plan.split}  tiles {plan.tiles}")
    good = [p for p in row["plans"] if "ms" in p and p["rel_err"] <= 2e-2]
    row["cleave_ms"] = min((p["ms"] for p in good), default=None)
    row["baselines"] = {}
    for name, fn in baselines(spec["workload"], w.reference).items():
        if name in skip_baselines:
            continue
        try:
            fn(**inputs)
            torch.cuda.synchronize()
            row["baselines"][name] = _bench(lambda: fn(**inputs))
        except Exception as exc:
            row["baselines"][name] = None
            _log(f"  baseline {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
    return row


def table(rows: list[dict]) -> str:
    names: list[str] = []
    for r in rows:
        names += [n for n in r["baselines"] if n not in names]
    lines = ["| workload | preset | cleave ms | " + " | ".join(f"{n} ms" for n in names) + " | "
             + " | ".join(f"×{n}" for n in names) + " | err |",
             "|" + "---|" * (4 + 2 * len(names))]
    for r in rows:
        c = r["cleave_ms"]
        times = [r["baselines"].get(n) for n in names]
        errs = [p["rel_err"] for p in r["plans"] if "rel_err" in p]
        cells = [r["workload"], r["preset"], f"{c:.4f}" if c else "failed"]
        cells += [f"{t:.4f}" if t else "—" for t in times]
        cells += [f"{t / c:.2f}" if (t and c) else "—" for t in times]
        cells.append(f"{min(errs):.1e}" if errs else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    rows = []
    for f in files:
        _log(f"[{len(rows) + 1}/{len(files)}] {f.name}")
        t0 = time.time()
        rows.append(bench_file(f, set(args.skip_baselines)))
        _log(f"  done in {time.time() - t0:.1f}s")
        (out / "bench.json").write_text(json.dumps(rows, indent=1))
    header = (f"## {datetime.date.today()} — {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"triton {triton.__version__}\n\nRatios are baseline time / cleave time (higher is better); "
              f"medians of triton.testing.do_bench; err is the relative L2 error of cleave's output against "
              f"the fp32 PyTorch reference.\n\n")
    text = header + table(rows) + "\n"
    (out / "bench.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
