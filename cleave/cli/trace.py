"""`cleave trace replay TRACE`: one compiled operator over every shape of a serving trace."""
from __future__ import annotations

import argparse
import sys

from .args import positive_float, positive_int

EPILOG = """examples:
  cleave trace replay traces/workloads/gqa_decode.jsonl --device cuda
  cleave trace replay traces/workloads/gqa.jsonl --device cuda --limit 50
  cleave trace replay traces/workloads/gqa_decode.jsonl --device cuda --plot gqa_decode.png
  TRITON_INTERPRET=1 cleave trace replay traces/workloads/gqa_decode.jsonl --device cpu \\
      --scale 0.02 --limit 4 --const h=4,hkv=2,d=16

  # search + schedule here (no GPU needed), replay on a GPU box without egglog/z3:
  cleave trace build traces/workloads/gqa_decode.jsonl --out gqa_decode.cleave
  cleave trace replay traces/workloads/gqa_decode.jsonl --device cuda --artifact gqa_decode.cleave
"""


def register(sub) -> None:
    p = sub.add_parser("trace", help="replay serving-shape traces (FlashInfer-Trace JSONL)",
                       description="Work with FlashInfer-Trace workload files (see traces/).",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    tsub = p.add_subparsers(dest="trace_command", metavar="ACTION")
    r = tsub.add_parser("replay", help="run one compiled operator over every shape of a trace, against SDPA",
                        description="Compile the trace's operator once, run it on every shape of the trace, "
                                    "check it against the definition's reference (SDPA) and time both. "
                                    "Reports per-shape and geometric-mean speedups and the recompile count.",
                        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    r.add_argument("trace", help="a workloads/NAME.jsonl file (its definition is ../definitions/NAME.json)")
    r.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    r.add_argument("--scale", type=positive_float, default=1.0, help="multiply every var axis (for tiny CPU runs)")
    r.add_argument("--limit", type=positive_int, default=None, help="replay only the first N shapes")
    r.add_argument("--const", default="", help="override const axes, e.g. h=4,hkv=2,d=16")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--artifact", help="load the operator from this directory (made by `cleave trace build`, "
                                      "possibly on another machine) instead of searching")
    r.add_argument("--plot", metavar="FILE.png", help="also draw each shape's speedup over SDPA into this image "
                                                      "(needs matplotlib)")
    r.set_defaults(func=_replay)
    b = tsub.add_parser("build", help="search and schedule a trace's operator into an artifact directory",
                        description="Run the search and the scheduler for every static binding the trace uses, "
                                    "launching nothing (no GPU needed), and write the operator into OUT. Carry OUT "
                                    "to the GPU and pass it to `trace replay --artifact OUT`: replay then needs "
                                    "torch and triton only.",
                        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    b.add_argument("trace", help="a workloads/NAME.jsonl file")
    b.add_argument("--out", required=True, help="artifact directory to write (created if missing)")
    b.add_argument("--scale", type=positive_float, default=1.0, help="as for replay: build for the scaled shapes")
    b.add_argument("--const", default="", help="as for replay: override const axes")
    b.add_argument("--top-k", type=positive_int, default=4,
                   help="plans kept (each a Triton compile at the replay's first call); a split over a "
                        "dynamic axis keeps this many per split count, at most 6")
    b.set_defaults(func=_build)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _parse_const(text: str) -> dict[str, int]:
    out = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--const: {item!r} is not NAME=POSITIVE_INT")
        out[name.strip()] = int(value)
    return out


def _const(args) -> dict[str, int]:
    """--const, parsed and checked against the program before anything runs."""
    const = _parse_const(args.const)
    if const:
        _check_const(args.trace, const)
    return const


def _check_const(trace: str, const: dict[str, int]) -> None:
    """A --const the workload's program cannot take (q heads not a multiple of kv heads)
    as one line naming the const axes, not a traceback from deep inside its reference.
    The program's graph binds the input shapes of the trace's first step: where that
    holds at the definition's const axes and not at these, the combination is wrong. A
    graph that fixes an overridden axis to the definition's value (the FlashInfer
    definitions' heads and head dim) cannot judge it.
    Anything else (an unknown axis, a trace cleave cannot read) is left to replay and
    build, which say so themselves."""
    from .. import workloads
    from ..ir import BindingError, CleaveError
    from ..runtime.traces import axis_values, load_trace

    try:
        definition, lines = load_trace(trace)
        tag = next(t for t in definition.get("tags", []) if t.startswith("cleave_workload:"))
        graph = workloads.get(tag.split(":", 1)[1]).graph
    except (CleaveError, KeyError, StopIteration, OSError, ValueError):
        return
    if set(graph.inputs) != set(definition["inputs"]) or not set(const) <= set(definition["axes"]):
        return

    def bind(values: dict[str, int]) -> None:
        graph.bind({name: tuple(values[a] for a in spec["shape"] or [])
                    for name, spec in definition["inputs"].items()})

    fixed = {a for name, spec in definition["inputs"].items()
             for a, d in zip(spec["shape"] or [], graph.inputs[name].shape) if a in const and d.is_number}
    if fixed:  # the program's graph holds these at the definition's values: replay captures it afresh
        return
    given = axis_values(definition, dict(lines[0]["workload"]["axes"]))
    try:
        bind(given)
    except (BindingError, KeyError):
        return  # not a question of the const axes
    try:
        bind({**given, **const})
    except BindingError as err:
        axes = definition["axes"]
        named = ", ".join(f"{a}={v}" + (f" ({axes[a]['description']})" if axes[a].get("description") else "")
                          for a, v in {**{a: s["value"] for a, s in axes.items() if s["type"] == "const"},
                                       **const}.items())
        raise CleaveError(f"--const: {definition['name']} cannot take the const axes {named}: {err}") from None


def _replay(args) -> int:
    from ..plot import require_matplotlib, save_speedup_plot
    from ..runtime.replay import replay

    if args.plot:
        require_matplotlib()

    def progress(i, n, shape):
        graph = "" if shape.graph_speedup is None else f"  graphs x{shape.graph_speedup:.2f}"
        print(f"[{i}/{n}] " + " ".join(f"{k}={v}" for k, v in shape.axes.items())
              + f"  cleave {shape.cleave_ms:.3f} ms  sdpa {shape.sdpa_ms:.3f} ms  x{shape.speedup:.2f}{graph}",
              file=sys.stderr, flush=True)

    print(f"compiling and replaying {args.trace} on {args.device} ...", file=sys.stderr, flush=True)
    result = replay(args.trace, device=args.device, scale=args.scale, limit=args.limit,
                    const=_const(args), seed=args.seed, progress=progress, artifact=args.artifact)
    print(f"{'shape':<24} {'cleave ms':>10} {'sdpa ms':>10} {'speedup':>8} {'graph cleave':>13} {'graph sdpa':>11} "
          f"{'speedup':>8}  plan")
    for s in result.shapes:
        axes = " ".join(f"{k}={v}" for k, v in s.axes.items())
        graph = f" {'-':>13} {'-':>11} {'-':>8}" if s.graph_speedup is None else \
            f" {s.cleave_graph_ms:>13.4f} {s.sdpa_graph_ms:>11.4f} {s.graph_speedup:>7.2f}x"
        print(f"{axes:<24} {s.cleave_ms:>10.4f} {s.sdpa_ms:>10.4f} {s.speedup:>7.2f}x{graph}  {s.plan}")
    st = result.stats
    graphs = "" if result.graph_geomean is None else f" (CUDA-graph replays: x{result.graph_geomean:.3f})"
    print(f"{result.definition} on {result.device}: {len(result.shapes)} shapes, geomean speedup over SDPA "
          f"x{result.geomean:.3f}{graphs}, recompiles after the first call: {result.recompiles} "
          f"(searches {st['searches']}, compiles {st['compiles']}, from_cache {st['from_cache']}, "
          f"plan tunings {st['tunings']}), triton JIT recompiles after the first call: "
          + ("n/a (interpreter)" if result.jit_recompiles is None else
             f"{result.jit_recompiles} (and {result.jit_tuning} launch variants compiled while tuning new buckets)"))
    if args.plot:
        save_speedup_plot(result, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _unwritable_dir(path: str) -> str | None:
    """Why a build could not make and fill directory `path` (None where it could),
    asked of its nearest existing directory: a --const the build then refuses leaves
    nothing behind."""
    from pathlib import Path

    from ..storage import unwritable

    target = Path(path)
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        return "it is a file" if existing == target else f"{existing} is a file"
    return unwritable(existing)


def _build(args) -> int:
    from ..ir import CleaveError
    from ..runtime.replay import build

    why = _unwritable_dir(args.out)  # before the search: a build writes there or is nothing
    if why is not None:
        raise CleaveError(f"--out {args.out}: cannot write the artifact there ({why})")
    print(f"searching and scheduling {args.trace} into {args.out} ...", file=sys.stderr, flush=True)
    summary = build(args.trace, args.out, scale=args.scale, const=_const(args), top_k=args.top_k)
    for entry in summary["entries"]:
        print(f"{summary['definition']}: operator {entry}")
    print(f"searches {summary['searches']}, schedules {summary['compiles']}, from_cache {summary['from_cache']}; "
          f"replay with: cleave trace replay {args.trace} --artifact {args.out}"
          + (f" --scale {args.scale}" if args.scale != 1.0 else "") + (f" --const {args.const}" if args.const else ""))
    return 0
