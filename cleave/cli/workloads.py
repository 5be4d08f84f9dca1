"""`cleave workloads` and `cleave show`."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("workloads", help="list the workload suite",
                       description="List the embedded workloads with their shape presets.",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  cleave workloads")
    p.set_defaults(func=_list)


def _list(args) -> int:
    from .. import workloads

    names = workloads.names()
    width = max(map(len, names), default=0)
    for name in names:
        w = workloads.get(name)
        presets = "; ".join(f"{p}: " + " ".join(f"{k}={v}" for k, v in env.items()) for p, env in w.presets.items())
        print(f"{name:{width}s} {w.description}\n{'':{width}s} presets  {presets}")
    return 0
