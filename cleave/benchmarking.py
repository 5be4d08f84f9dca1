"""Timing compiled plans against eager PyTorch, torch.compile, SDPA and
flex_attention on the same inputs, as ratios. Used by `cleave bench` and by
`benchmarks/run.py`; imports only torch, triton and cleave's runtime."""
from __future__ import annotations

import contextlib
import math
import sys

import torch

from .ir import CleaveError

# Relative L2 error against the fp32 reference past which a plan's result is wrong
TOLERANCE = 2e-2


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


def plan_specs(name: str, top_plans: int = 4, presets: list[str] | None = None,
               f32_matmul: str = "highest", index_prefetch: bool = False) -> list[dict]:
    """Search a workload once, schedule it at each preset, and keep the best plans
    by cost (the GPU profiles them). Needs the search, so it runs on the dev machine.
    `f32_matmul`: the torch float32 MatMul precision the plans honour (Target.f32_matmul);
    `bench_spec` runs the baselines under it too. `index_prefetch`: Target.index_prefetch,
    for timing it beside the default plans."""
    import dataclasses
    import time

    from . import search, workloads
    from .scheduler import H200, schedule

    target = dataclasses.replace(H200, f32_matmul=f32_matmul, index_prefetch=index_prefetch)

    w = workloads.get(name)
    t0 = time.time()
    result = search(w.graph)
    searched = time.time() - t0
    specs = []
    for preset, env in w.presets.items():
        if presets and preset not in presets:
            continue
        scheduled = []
        for index, candidate in enumerate(result.candidates):
            try:
                plans = schedule(candidate, env, dynamic=set(), top_k=top_plans, target=target)
            except CleaveError as err:  # another candidate may still schedule
                _log(f"{name} {preset}: candidate {index} not scheduled: {err}")
                continue
            if plans:
                scheduled.append((min(p.cost for p in plans), index, plans))
        if not scheduled:
            raise CleaveError(f"{name} {preset}: no candidate could be scheduled")
        # as the runtime keeps them (runtime/operator.py): the plans of the candidate whose
        # best plan the model costs least; the GPU profiles those
        _, index, plans = min(scheduled, key=lambda t: t[:2])
        chosen = [(p.cost, index, p) for p in plans]  # the ranked top_plans and a Gluon twin
        specs.append({
            "workload": name, "preset": preset, "env": env, "search_seconds": searched, "f32_matmul": f32_matmul,
            "candidates": [{"text": c.graph.text(), "derivation": c.derivation} for c in result.candidates],
            "plan_candidates": [i for _, i, _ in chosen],
            "plans": [p.to_json() for _, _, p in chosen],
        })
    return specs


def bench_spec(spec: dict, skip_baselines: set[str] = frozenset()) -> dict:
    """Time every plan of one preset and the baselines on the same CUDA inputs.
    `spec` is a plan file's content (see benchmarks/build.py)."""
    from cleave.scheduler import Plan

    from . import workloads
    from .workloads.baselines import baselines

    w = workloads.get(spec["workload"])
    env = spec["env"]
    inputs = w.inputs(env, seed=1234, device="cuda")
    ref_inputs = {k: (v.float() if v.is_floating_point() else v) for k, v in inputs.items()}
    reference = w.run_reference(ref_inputs)
    row = {"workload": spec["workload"], "preset": spec["preset"], "env": env, "plans": []}
    plans = [Plan.from_json(p) for p in spec["plans"]]
    for k, plan in enumerate(plans):
        _time_plan(row, k, plan, inputs, reference)
    _serve(row, plans, inputs, reference)
    row["baselines"] = {}
    # The baselines run at the precision cleave's plans were built for (a user's setting
    # applies to both); the reference above ran at torch's default, the error's yardstick.
    row["f32_matmul"] = spec.get("f32_matmul", "highest")
    with at_f32_matmul_precision(row["f32_matmul"]):
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


@contextlib.contextmanager
def at_f32_matmul_precision(precision: str):
    """torch.set_float32_matmul_precision(precision) inside the block only."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _serve(row: dict, plans: list, inputs: dict, reference) -> None:
    """cleave's time is what the runtime serves on these inputs, chosen as it chooses: its
    ranking of the plans that ran (CUDA-graph replays, the L2 flushed: profile.rank), then
    each kernel's fastest option within the fastest plan's partition (mix.fastest_kernels).
    The fastest of everything timed here (an oracle's pick among noisy timings) is
    reported beside it as best_ms. A served plan past the tolerance leaves no time. The
    served plan is also replayed from a CUDA graph (`graph_time`): cleave_graph_ms."""
    from cleave.runtime.launch import launch
    from cleave.runtime.mix import compose, fastest_kernels
    from cleave.runtime.profile import rank

    ran = [p["index"] for p in row["plans"] if "ms" in p]
    served = None
    if ran:
        order = [ran[i] for i in rank([plans[i] for i in ran], inputs)]
        picks = fastest_kernels(plans, order, inputs)
        if picks:
            plans.append(compose(plans, picks))
            _time_plan(row, len(plans) - 1, plans[-1], inputs, reference, picks)
            served = row["plans"][-1]
        else:
            served = next(p for p in row["plans"] if p["index"] == order[0])
    good = [p for p in row["plans"] if "ms" in p and p["rel_err"] <= TOLERANCE]
    row["best_ms"] = min((p["ms"] for p in good), default=None)
    row["served"] = served and (f"mix of plans {served['picks']}" if served.get("picks") else f"plan {served['index']}")
    row["cleave_ms"] = served["ms"] if served in good else None
    row["cleave_graph_ms"] = None
    if row["cleave_ms"]:
        plan = plans[served["index"]]
        row["cleave_graph_ms"] = graph_time(lambda: launch(plan, inputs))
    if served is not None:
        _log(f"  served (the runtime's choice): {row['served']}, "
             + (f"{row['cleave_ms']:.4f} ms" if row["cleave_ms"] else "failed or wrong")
             + (f", {row['cleave_graph_ms']:.4f} ms in CUDA graphs" if row["cleave_graph_ms"] else ""))


def graph_time(fn, calls: int = 10) -> float | None:
    """Milliseconds per call of fn replayed from a CUDA graph, the L2 flushed before each
    call (`profile.graph_timer`, cold): no launch gaps between an operator's kernels, as a
    serving engine replays its decode steps. None where fn cannot be captured."""
    from cleave.runtime.profile import graph_ms

    try:
        return graph_ms(fn, calls, cold=True)
    except Exception as exc:  # a baseline that syncs or allocates on the host in its call
        _log(f"  CUDA graph capture failed: {type(exc).__name__}: {str(exc)[:200]}")
        return None


def _time_plan(row: dict, index: int, plan, inputs: dict, reference, picks=None) -> None:
    """Time one plan and check it against the reference; appends its record (or its
    failure) to row["plans"]."""
    from cleave.runtime.launch import launch

    label = f"mix of plans {picks}" if picks else f"plan {index}"
    try:
        out = launch(plan, inputs)
        torch.cuda.synchronize()
        err = max(_rel_err(o, r) for o, r in zip(out, reference) if o.is_floating_point())
        ms = _bench(lambda: launch(plan, inputs))
    except Exception as exc:  # a plan that fails on the GPU is reported, not hidden
        row["plans"].append({"index": index, "picks": picks, "error": f"{type(exc).__name__}: {exc}"[:400]})
        _log(f"  {label}: FAILED {exc}")
        return
    row["plans"].append({"index": index, "picks": picks, "ms": ms, "rel_err": err, "split": plan.split,
                         "tiles": plan.tiles, "kernels": len(plan.kernels)})
    # a plan past the tolerance is a wrong result (a compiler bug), not a slow plan: said as
    # a failure, though the timing skips it either way
    wrong = f"FAILED (wrong result: err {err:.2e} > {TOLERANCE:g}) " if err > TOLERANCE else ""
    _log(f"  {label}: {wrong}{ms:.4f} ms  err {err:.2e}  split {plan.split}  tiles {plan.tiles}  "
         f"launch {[(k.num_warps, k.num_stages) for k in plan.kernels]}")


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
