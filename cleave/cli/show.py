"""`cleave show WORKLOAD`: print a workload's graph in the textual IR form, or draw it
(with the search's candidates, if asked) as graphviz DOT or SVG."""
from __future__ import annotations

import argparse

from .args import positive_int


def register(sub) -> None:
    p = sub.add_parser("show", help="print or draw a workload's graph",
                       description="Print the naive graph of a workload (or of a .cir file) in cleave's text form, "
                                   "or draw it as graphviz DOT or SVG. With --candidates N, the search's top N "
                                   "candidates come after it, their rewritten nodes marked (filled in the drawing).",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  cleave show gqa_decode\n  cleave show my_graph.cir\n"
                              "  cleave show layernorm --candidates 1 --format svg > layernorm.svg\n"
                              "  cleave show gqa_decode --format dot | dot -Tpng -o gqa_decode.png")
    p.add_argument("target", help="workload name, or a file holding a graph's text")
    p.add_argument("--format", choices=("text", "dot", "svg"), default="text",
                   help="text (default), graphviz DOT, or SVG (needs graphviz's `dot` program)")
    p.add_argument("--candidates", type=positive_int, default=0, metavar="N",
                   help="also search and show the top N candidates (takes seconds)")
    p.set_defaults(func=_show)


def load_graph(target: str):
    """A workload by name, or a graph parsed from a file path."""
    import os

    from .. import workloads
    from ..ir import CleaveError, parse_graph

    if os.path.isdir(target):
        raise CleaveError(f"{target}: a directory, not a graph file or a workload name")
    if os.path.exists(target):
        try:
            with open(target, encoding="utf-8-sig") as f:
                return parse_graph(f.read())
        except ValueError as err:  # not UTF-8 text, or not a graph's text form (ParseError)
            raise CleaveError(f"{target}: {err}") from err
    if "/" in target or target.endswith((".cir", ".txt")):  # meant as a file: "unknown workload" would mislead
        raise CleaveError(f"graph file {target} does not exist")
    return workloads.get(target).graph


def _candidates(graph, count: int) -> list:
    from ..search import search

    return search(graph, top_k=count, progress=False).candidates if count else []


def _show(args) -> int:
    from .. import workloads
    from ..draw import dot_program, rewritten, to_dot, to_svg

    graph = load_graph(args.target)
    program = dot_program() if args.format == "svg" else None  # a missing `dot` fails before the search
    candidates = _candidates(graph, args.candidates)
    if args.format != "text":
        dot = to_dot(graph, candidates)
        print(dot if program is None else to_svg(dot, program), end="")
        return 0
    print(graph.text(), end="")  # its constraints as `require` lines: `cleave show NAME > g.cir` reads back
    # the rest as comments, so that the printed graph reads back (edit, optimize)
    if args.target in workloads.names():
        for preset, env in workloads.get(args.target).presets.items():
            print(f"# preset {preset}: " + " ".join(f"{k}={v}" for k, v in env.items()))
    for i, c in enumerate(candidates):
        marked = " ".join(f"%{n}" for n in sorted(rewritten(graph, c.graph))) or "none"
        print(f"# candidate {i}: cost {c.cost}\n# derivation: {', '.join(c.derivation) or '(input graph)'}\n"
              f"# rewritten nodes: {marked}")
        print(c.graph.text(), end="")
    return 0
