"""`cleave show WORKLOAD`: print a workload's graph in the textual IR form."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("show", help="print a workload's graph",
                       description="Print the naive graph of a workload (or of a .cir file) in cleave's text form.",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  cleave show gqa_decode\n  cleave show my_graph.cir")
    p.add_argument("target", help="workload name, or a file holding a graph's text")
    p.set_defaults(func=_show)


def load_graph(target: str):
    """A workload by name, or a graph parsed from a file path."""
    import os

    from .. import workloads
    from ..ir import CleaveError, parse_graph

    if os.path.exists(target):
        try:
            with open(target) as f:
                return parse_graph(f.read())
        except ValueError as err:  # not UTF-8 text, or not a graph's text form (ParseError)
            raise CleaveError(f"{target}: {err}") from err
    if "/" in target or target.endswith((".cir", ".txt")):  # meant as a file: "unknown workload" would mislead
        raise CleaveError(f"graph file {target} does not exist")
    return workloads.get(target).graph


def _show(args) -> int:
    from .. import workloads

    graph = load_graph(args.target)
    print(graph.text(), end="")
    if graph.constraints:
        print("constraints:\n" + "\n".join(f"  {c}" for c in graph.constraints))
    if args.target in workloads.names():
        for preset, env in workloads.get(args.target).presets.items():
            print(f"preset {preset}: " + " ".join(f"{k}={v}" for k, v in env.items()))
    return 0
