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

    for name in workloads.names():
        w = workloads.get(name)
        presets = "; ".join(f"{p}: " + " ".join(f"{k}={v}" for k, v in env.items()) for p, env in w.presets.items())
        print(f"{name:24s} {w.description}\n{'':24s} presets  {presets}")
    return 0
