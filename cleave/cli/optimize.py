"""`cleave optimize WORKLOAD`: the algebraic search's candidates (text, derivation,
cost, facts) and statistics. `report()` builds the JSON object; later stages add keys."""
from __future__ import annotations

import argparse
import json
import sys

from ..ir import CleaveError


def register(sub) -> None:
    p = sub.add_parser("optimize", help="search a workload's rewrites and print the top candidates",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  cleave optimize gqa_decode --json\n  cleave optimize matmul --top-k 3 --seconds 10")
    p.add_argument("target", help="workload name, or a file holding a graph's text")
    p.add_argument("--top-k", type=int, default=3, help="candidates to print (default 3)")
    p.add_argument("--iterations", type=int, help="saturation iteration budget (default 30)")
    p.add_argument("--enodes", type=int, help="e-node budget (default 20000)")
    p.add_argument("--seconds", type=float, help="time budget in seconds (default 30)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--preset", help="workload preset to schedule at (default: the first)")
    p.add_argument("--shape", action="append", default=[], metavar="SYM=N",
                   help="bind a symbol for scheduling (repeatable); needed for a graph file")
    p.add_argument("--no-schedule", action="store_true", help="search only, no plan")
    p.add_argument("--emit", metavar="DIR", help="write the plan's kernels as readable, runnable .py files")
    p.set_defaults(func=_optimize)


def report(result, plan=None, candidate_index=None, shapes=None) -> dict:
    out = {
        "candidates": [{"text": c.graph.text(), "derivation": c.derivation, "cost": str(c.cost),
                        "facts": [f.to_json() for f in c.facts]} for c in result.candidates],
        "stats": result.stats,
    }
    if plan is not None:
        out["plan"] = {
            "candidate": candidate_index, "shapes": shapes,
            "kernels": [{"name": k.name, "grid": k.grid, "num_warps": k.num_warps, "num_stages": k.num_stages,
                         "source": k.source} for k in plan.kernels],
            "split": plan.split, "tiles": plan.tiles, "cost": plan.cost,
        }
    return out


def _shapes(args, graph) -> dict[str, int] | None:
    """The binding to schedule at: --shape values over the workload preset."""
    from .. import workloads
    from ..ir import CleaveError

    shapes: dict[str, int] = {}
    if args.target in workloads.names():
        presets = workloads.get(args.target).presets
        name = args.preset or next(iter(presets))
        if name not in presets:
            raise CleaveError(f"workload {args.target!r} has no preset {name!r}; presets: {', '.join(presets)}")
        shapes.update(presets[name])
    for item in args.shape:
        key, _, value = item.partition("=")
        if not value.isdigit():
            raise CleaveError(f"--shape takes SYM=N, got {item!r}")
        shapes[key.strip()] = int(value)
    missing = [s.name for s in graph.symbols() if s.name not in shapes and not s.name.startswith("s_")]
    if missing:
        raise CleaveError(f"cannot schedule: no value for {', '.join(missing)} (give --shape SYM=N)")
    return shapes


def best_plan(result, shapes):
    """The cheapest plan over all candidates, by the scheduler's cost model."""
    from ..scheduler import schedule

    ranked = []
    for index, candidate in enumerate(result.candidates):
        plans = schedule(candidate, shapes, top_k=1)
        if plans:
            ranked.append((plans[0].cost, index, plans[0]))
    ranked.sort(key=lambda t: t[0])
    return ranked[0][2], ranked[0][1]


def emit(plan, directory: str) -> list[str]:
    """Each kernel as its own module, the plan as JSON, and a script that runs it."""
    import os

    os.makedirs(directory, exist_ok=True)
    written = []
    for k in plan.kernels:
        path = os.path.join(directory, f"{k.name}.py")
        with open(path, "w") as f:
            f.write(f"# grid: {k.grid}, num_warps={k.num_warps}, num_stages={k.num_stages}\n"
                    f"# launch arguments, in order: {', '.join(k.args)}\n" + k.source)
        written.append(path)
    with open(os.path.join(directory, "plan.json"), "w") as f:
        json.dump(plan.to_json(), f, indent=1)
    with open(os.path.join(directory, "run.py"), "w") as f:
        f.write(_RUNNER)
    return written + [os.path.join(directory, "plan.json"), os.path.join(directory, "run.py")]


_RUNNER = '''"""Run this plan on random inputs and compare with cleave's fp64 reference interpreter.

    python run.py            (on CPU: TRITON_INTERPRET=1 python run.py)
"""
import json
import os

import torch

from cleave.interpreter import interpret
from cleave.ir import parse_graph
from cleave.scheduler import Plan, launch
from cleave.workloads import random_inputs

plan = Plan.from_json(json.load(open(os.path.join(os.path.dirname(__file__), "plan.json"))))
graph = parse_graph(plan.graph)
device = "cuda" if torch.cuda.is_available() else "cpu"
inputs = random_inputs(graph, plan.env, seed=0, device=device)
outputs = launch(plan, inputs)
expected = interpret(graph, {k: v.cpu() for k, v in inputs.items()}, compute_dtype=torch.float64, env=plan.split)
for out, ref in zip(outputs, expected):
    err = ((out.cpu().double() - ref).norm() / ref.norm()).item() if ref.is_floating_point() else 0.0
    print(f"shape {list(out.shape)}  relative error {err:.2e}")
'''


def _optimize(args) -> int:
    from ..search import search
    from .show import load_graph

    graph = load_graph(args.target)
    result = search(graph, top_k=args.top_k, iterations=args.iterations, enodes=args.enodes,
                    seconds=args.seconds, progress=not args.quiet)
    plan = index = shapes = None
    if not args.no_schedule:
        shapes = _shapes(args, graph)
        plan, index = best_plan(result, shapes)
    out = report(result, plan, index, shapes)
    if args.emit:
        if plan is None:
            raise CleaveError("--emit needs a plan (drop --no-schedule)")
        for path in emit(plan, args.emit):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for i, c in enumerate(out["candidates"]):
        print(f"# candidate {i}: cost {c['cost']}\n# derivation: {', '.join(c['derivation']) or '(input graph)'}")
        for f in c["facts"]:
            print(f"# separable: %{f['node']} by %{f['factor']}, rescale {f['rescale']}")
        print(c["text"])
    print("stats: " + json.dumps(out["stats"]))
    if plan is not None:
        print(f"# plan at {shapes}: candidate {index}, {len(plan.kernels)} kernel(s), split {plan.split}, "
              f"cost {plan.cost:.3g}")
        for k in plan.kernels:
            print(f"# kernel {k.name}: grid {k.grid}, num_warps={k.num_warps}, num_stages={k.num_stages}")
    return 0
