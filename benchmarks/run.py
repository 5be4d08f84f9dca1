"""GPU benchmark: cleave's compiled plans against the strongest baseline a user would
pick (eager, torch.compile, max-autotune, cuBLAS, SDPA on each backend, flex_attention,
compiled RoPE + SDPA), in one run, as ratios. Runs on the GPU box with the runtime
alone (torch + triton; no egglog, no z3): the plans were searched and scheduled on
the development machine by `python -m benchmarks.build`.

    python3 -m benchmarks.run --plans .gpu_plans --out $OUT    # cleave against the baselines
    python3 -m benchmarks.run --out $OUT                       # the baselines alone, at the presets
    python3 -m benchmarks.run --device cpu --out /tmp/dry      # dry run: tiny shapes, no plans
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import fnmatch
import json
import pathlib
import statistics
import sys
import time

import torch

from cleave.workloads.flashinfer import DEFINITIONS

from . import baselines, paged_baselines, report
from .strongest import Outcome, best, measure


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _jobs(args) -> list[tuple[str, str, dict, dict | None]]:
    """(workload, preset, binding, plan file or None), in the order they run."""
    from cleave import workloads

    names = args.only or workloads.names()
    if args.device == "cpu":
        return [(n, "test", workloads.get(n).test_bindings[0], None) for n in names]
    if args.plans:
        specs = [json.loads(f.read_text()) for f in sorted(pathlib.Path(args.plans).glob("*.json"))]
        return [(s["workload"], s["preset"], s["env"], s) for s in specs if s["workload"] in names]
    return [(n, preset, env, None) for n in names for preset, env in workloads.get(n).presets.items()]


def _time_plans(spec: dict) -> dict:
    from cleave import workloads
    from cleave.benchmarking import bench_spec
    from cleave.workloads.baselines import baselines as legacy

    # bench_spec's own baselines are replaced by the ones below: time cleave's plans alone.
    skip = set(legacy(spec["workload"], workloads.get(spec["workload"]).reference))
    return bench_spec(spec, skip_baselines=skip)


def _gpu_timer(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _cpu_timer(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _baseline_row(name: str, env: dict, device: str, skip: list[str], precision: str = "highest") -> dict:
    """The baselines run at the f32 MatMul precision cleave's plans were built for (a
    user's setting applies to both); the reference at torch's default, the yardstick."""
    from cleave import workloads
    from cleave.benchmarking import at_f32_matmul_precision, graph_time

    w = workloads.get(name)
    inputs = w.inputs(env, seed=1234, device=device)  # the inputs bench_spec times cleave on
    reference = w.run_reference({k: (v.float() if v.is_floating_point() else v) for k, v in inputs.items()})
    candidates = baselines.for_workload(name, w.reference)
    chosen = [b for b in candidates if not any(fnmatch.fnmatch(b.name, p) for p in skip)]
    with at_f32_matmul_precision(precision):
        outcomes = iter(measure(chosen, inputs, reference,
                                timer=_gpu_timer if device == "cuda" else _cpu_timer,
                                sync=torch.cuda.synchronize if device == "cuda" else (lambda: None), log=_log,
                                graph_timer=graph_time if device == "cuda" else None))
        rows = [next(outcomes) if b in chosen else Outcome(b.name, skipped="not run: --skip") for b in candidates]
    winner, graph_winner = best(rows), best(rows, "graph_ms")
    return {"baselines": [dataclasses.asdict(o) for o in rows],
            "strongest": dataclasses.asdict(winner) if winner else None,
            "strongest_graph": dataclasses.asdict(graph_winner) if graph_winner else None,
            "decode_bytes": paged_baselines.decode_bytes(name, inputs) if name in DEFINITIONS else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plans", help="folder of plan files from benchmarks.build (default: baselines alone)")
    p.add_argument("--out", default=".")
    p.add_argument("--only", nargs="*", help="workload names to run (default: all)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: a dry run of the baseline selection at each workload's first test binding")
    p.add_argument("--skip", nargs="*", default=[], help="baseline names to leave out (fnmatch patterns)")
    args = p.parse_args(argv)
    # Every preset compiles the same reference functions again, at new static shapes and in two modes.
    torch._dynamo.config.recompile_limit = 64

    if args.device == "cuda":
        import triton
        where = f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}"
    else:
        where = f"CPU dry run at tiny shapes (timings mean nothing), torch {torch.__version__}"
    header = (f"## {datetime.date.today()} — {where}\n\nRatios are baseline time / cleave time (higher is "
              f"better); medians of triton.testing.do_bench. cleave ms is what the runtime serves: the plan "
              f"(or kernel-wise mix) its own tuning picks on these inputs, timed like the baselines; best "
              f"timed is the fastest of every plan and mix timed here. The strongest baseline is the fastest of those "
              f"that ran and agreed with the fp32 reference (relative L2 error <= 2e-2, as for cleave's "
              f"plans); err is cleave's relative L2 error against that reference. For decode steps, "
              f"copy ceiling is the bytes the step must move (K/V pages used, q, outputs) per second as "
              f"a share of the H200's 4.3 TB/s, for cleave / the strongest baseline. The \"in CUDA graphs\" "
              f"columns replay cleave's served plan and every baseline that ran from a CUDA graph of 10 "
              f"calls, the L2 flushed before each call and the flush's time taken out: no launch gaps "
              f"between an operator's kernels, as a serving engine replays a decode step; the strongest "
              f"there is the fastest baseline in graphs.\n\n")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = _jobs(args)
    rows = []
    for k, (name, preset, env, spec) in enumerate(jobs):
        _log(f"[{k + 1}/{len(jobs)}] {name} {preset}")
        t0 = time.time()
        row = _time_plans(spec) if spec else {"workload": name, "preset": preset, "env": env, "plans": [],
                                              "cleave_ms": None}
        precision = spec.get("f32_matmul", "highest") if spec else "highest"
        row.update(_baseline_row(name, env, args.device, args.skip, precision))
        if precision != "highest":  # the table names the precision both sides ran at
            row["preset"] = f"{preset} (f32 MatMuls at \"{precision}\")"
        rows.append(row)
        strongest = row["strongest"]
        _log(f"  strongest: {strongest['name']} {strongest['ms']:.4f} ms" if strongest else "  strongest: none ran")
        _log(f"  done in {time.time() - t0:.1f}s")
        # Written after every preset, so that a run cut short still leaves its table.
        (out / "bench.json").write_text(json.dumps(rows, indent=1, default=str))
        (out / "bench.md").write_text(header + report.table(rows) + "\n\n" + report.secondary(rows) + "\n\n"
                                      + report.skipped(rows) + "\n")
    print((out / "bench.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
