"""`cleave optimize WORKLOAD`: the algebraic search's candidates (text, derivation,
cost, facts) and statistics. `report()` builds the JSON object; later stages add keys."""
from __future__ import annotations

import argparse
import json


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
    p.set_defaults(func=_optimize)


def report(result) -> dict:
    return {
        "candidates": [{"text": c.graph.text(), "derivation": c.derivation, "cost": str(c.cost),
                        "facts": [f.to_json() for f in c.facts]} for c in result.candidates],
        "stats": result.stats,
    }


def _optimize(args) -> int:
    from ..search import search
    from .show import load_graph

    graph = load_graph(args.target)
    result = search(graph, top_k=args.top_k, iterations=args.iterations, enodes=args.enodes,
                    seconds=args.seconds, progress=not args.quiet)
    out = report(result)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for i, c in enumerate(out["candidates"]):
        print(f"# candidate {i}: cost {c['cost']}\n# derivation: {', '.join(c['derivation']) or '(input graph)'}")
        for f in c["facts"]:
            print(f"# separable: %{f['node']} by %{f['factor']}, rescale {f['rescale']}")
        print(c["text"])
    print("stats: " + json.dumps(out["stats"]))
    return 0
