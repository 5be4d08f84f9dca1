"""`cleave optimize WORKLOAD`: the algebraic search's candidates (text, derivation,
cost, facts) and statistics. `report()` builds the JSON object; later stages add keys."""
from __future__ import annotations

import argparse
import json
import sys

from ..ir import CleaveError
from .args import positive_float, positive_int, shape_binding


def register(sub) -> None:
    p = sub.add_parser("optimize", help="search a workload's rewrites and print the top candidates",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  cleave optimize gqa_decode --json\n"
                              "  cleave optimize matmul --top-k 3 --seconds 10\n"
                              "  cleave optimize matmul --rules my_rules.txt")
    p.add_argument("target", help="workload name, or a file holding a graph's text")
    p.add_argument("--top-k", type=positive_int, default=3, help="candidates to print (default 3)")
    p.add_argument("--iterations", type=positive_int, help="saturation iteration budget (default 30)")
    p.add_argument("--enodes", type=positive_int, help="e-node budget (default 20000)")
    p.add_argument("--seconds", type=positive_float, help="time budget in seconds (default 30)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--verbose", action="store_true",
                   help="on stderr, why each candidate that could not be scheduled was skipped")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--preset", help="workload preset to schedule at (default: the first)")
    p.add_argument("--shape", action="append", default=[], metavar="SYM=N", type=shape_binding,
                   help="bind a symbol for scheduling (repeatable); needed for a graph file")
    p.add_argument("--no-schedule", action="store_true", help="search only, no plan")
    p.add_argument("--emit", metavar="DIR", help="write the plan's kernels as readable, runnable .py files")
    p.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="a rule file to search with beside the library (repeatable); its rules are proven "
                        "first and an unsound one is refused with its counterexample")
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
                         "descriptors": k.descriptors, "programs_per_sm": k.programs_per_sm,
                         "arrivals": k.arrivals, "source": k.source} for k in plan.kernels],
            "split": plan.split, "tiles": plan.tiles, "cost": plan.cost,
        }
    return out


def _shapes(args, graph) -> dict[str, int] | None:
    """The binding to schedule at: --shape values over the workload preset."""
    from .. import workloads

    shapes: dict[str, int] = {}
    if args.target in workloads.names():
        presets = workloads.get(args.target).presets
        name = args.preset or next(iter(presets))
        if name not in presets:
            raise CleaveError(f"workload {args.target!r} has no preset {name!r}; presets: {', '.join(presets)}")
        shapes.update(presets[name])
    elif args.preset:  # it would be ignored, and the missing sizes named without a word on why
        raise CleaveError(f"--preset {args.preset}: {args.target} is a graph file, not a workload; its presets are "
                          f"not read from it: give its sizes with --shape SYM=N")
    shapes.update(args.shape)
    missing = [s.name for s in graph.symbols() if s.name not in shapes and not s.name.startswith("s_")]
    if missing:
        raise CleaveError(f"cannot schedule: no value for {', '.join(missing)} (give --shape SYM=N)")
    return shapes


def _check_shape_names(bindings: list[tuple[str, int]], graph) -> None:
    """Each --shape names a symbol of the graph: a typo would otherwise be ignored."""
    known = sorted(s.name for s in graph.symbols())
    unknown = [name for name, _ in bindings if name not in known]
    if unknown:
        raise CleaveError(f"--shape {unknown[0]}: graph {graph.name!r} has no symbol {unknown[0]!r}; "
                          f"its symbols: {', '.join(known) or '(none: every dim is static)'}")


def best_plan(result, shapes, graph):
    """(plan, candidate index, skipped) for the cheapest plan, by the scheduler's cost
    model, over the candidates that can be scheduled at `shapes`, then the graph as
    written if none can (index len(candidates)); `skipped` lists (index, reason) for
    those that cannot (no tiling fits the target, say). Only when none can is that an
    error, naming each one's reason."""
    from ..ir.contracts import then_as_written
    from ..scheduler import schedule

    ranked, skipped = [], []
    for index, candidate in enumerate(then_as_written(result.candidates, graph)):
        if ranked and index >= len(result.candidates):
            break
        try:
            plans = schedule(candidate, shapes, top_k=1)
        except CleaveError as err:
            skipped.append((index, str(err)))
            continue
        if plans:
            ranked.append((plans[0].cost, index, plans[0]))
        else:
            skipped.append((index, "the scheduler returned no plan"))
    if not ranked:
        raise CleaveError(f"no candidate can be scheduled at {shapes}: "
                          + "; ".join(f"candidate {i}: {reason}" for i, reason in skipped))
    _, index, plan = min(ranked, key=lambda t: t[0])
    return plan, index, skipped


def emit(plan, directory: str, graph) -> list[str]:
    """Each kernel as its own module, the plan as JSON, the input graph as text, and a
    script that runs the plan and checks it against that graph."""
    import os

    os.makedirs(directory, exist_ok=True)
    written = []
    for k in plan.kernels:
        path = os.path.join(directory, f"{k.name}.py")
        with open(path, "w") as f:
            tma = (f"# TMA descriptors [argument, buffer, block]: {k.descriptors}; then TMA=True, or None "
                   "descriptors and TMA=False\n") if k.descriptors else ""
            persistent = (f"# persistent: launch min(grid, SMs x {k.programs_per_sm}) programs\n"
                          if k.programs_per_sm else "")
            arrivals = (f"# {k.arrivals[0]}: int32 zeros, {k.arrivals[1]} of them (the kernel leaves them zero)\n"
                        if k.arrivals else "")
            f.write(f"# grid: {k.grid}, num_warps={k.num_warps}, num_stages={k.num_stages}\n"
                    f"# launch arguments, in order: {', '.join(k.args)}\n" + tma + persistent + arrivals + k.source)
        written.append(path)
    with open(os.path.join(directory, "plan.json"), "w") as f:
        json.dump(plan.to_json(), f, indent=1)
    with open(os.path.join(directory, "graph.cir"), "w") as f:
        f.write(graph.text())
    with open(os.path.join(directory, "run.py"), "w") as f:
        f.write(_RUNNER)
    return written + [os.path.join(directory, name) for name in ("plan.json", "graph.cir", "run.py")]


_RUNNER = '''"""Run this plan on random inputs and compare with cleave's fp64 reference
interpreter of the input graph (graph.cir, as written, before any rewrite): relative
error of float outputs, mismatched elements of integer and bool ones.

    python run.py            (on CPU: TRITON_INTERPRET=1 python run.py)
"""
import json
import os

import torch

from cleave.interpreter import interpret
from cleave.ir import parse_graph
from cleave.runtime.launch import launch
from cleave.scheduler import Plan
from cleave.workloads import random_inputs

here = os.path.dirname(__file__)
plan = Plan.from_json(json.load(open(os.path.join(here, "plan.json"))))
graph = parse_graph(open(os.path.join(here, "graph.cir")).read())
device = "cuda" if torch.cuda.is_available() else "cpu"
inputs = random_inputs(graph, plan.env, seed=0, device=device)
outputs = launch(plan, inputs)
expected = interpret(graph, {k: v.cpu() for k, v in inputs.items()}, compute_dtype=torch.float64)
for out, ref in zip(outputs, expected):
    out = out.cpu()
    if ref.is_floating_point():
        err = ((out.double() - ref).norm() / ref.norm()).item()
        print(f"shape {list(out.shape)}  relative error {err:.2e}")
    else:
        wrong = int((out.shape != ref.shape) or (out != ref).sum())
        print(f"shape {list(out.shape)}  {wrong} of {ref.numel()} elements differ")
'''


def _with_rule_files(paths: list[str], quiet: bool) -> list:
    """The library plus the files' rules, those proven first (their verdicts on stderr)."""
    from ..verify import with_proven_files

    rules, verdicts = with_proven_files(paths)
    if not quiet:
        width = max(len(v.rule) for v in verdicts)
        for v in verdicts:
            print(f"[cleave rules] {v.line(width)}", file=sys.stderr)
    return rules


def _optimize(args) -> int:
    from ..search import search
    from .show import load_graph

    # The target, the options and the shapes are checked before the search, which takes seconds.
    graph = load_graph(args.target)
    if args.emit and args.no_schedule:
        raise CleaveError("--emit needs a plan (drop --no-schedule)")
    if not graph.outputs:  # before --shape, which would say its symbols are none
        raise CleaveError(f"graph {graph.name!r} has no outputs: nothing to optimize")
    _check_shape_names(args.shape, graph)
    shapes = None if args.no_schedule else _shapes(args, graph)
    rules = _with_rule_files(args.rules, args.quiet) if args.rules else None
    result = search(graph, top_k=args.top_k, rules=rules, iterations=args.iterations, enodes=args.enodes,
                    seconds=args.seconds, progress=not args.quiet)
    plan = index = None
    if shapes is not None:
        plan, index, skipped = best_plan(result, shapes, graph)
        if args.verbose:
            for i, reason in skipped:
                print(f"candidate {i} not scheduled: {reason}", file=sys.stderr)
    out = report(result, plan, index, shapes)
    if args.emit:
        try:
            written = emit(plan, args.emit, graph)
        except OSError as err:
            raise CleaveError(f"--emit {args.emit}: cannot write {err.filename}: {err.strerror}") from err
        for path in written:
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
        which = f"candidate {index}" if index < len(result.candidates) else "the graph as written"
        print(f"# plan at {shapes}: {which}, {len(plan.kernels)} kernel(s), split {plan.split}, "
              f"cost {plan.cost:.3g}")
        for k in plan.kernels:
            print(f"# kernel {k.name}: grid {k.grid}, num_warps={k.num_warps}, num_stages={k.num_stages}")
    return 0
