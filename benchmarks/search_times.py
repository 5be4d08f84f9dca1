"""Search time and e-graph size per workload: `python -m benchmarks.search_times`."""
from __future__ import annotations

import sys
import warnings

import cleave.workloads as W
from cleave.search import search


def main(names=None) -> None:
    print("| workload | seconds | e-nodes | e-classes | iterations | candidates |")
    print("|---|---|---|---|---|---|")
    for name in names or W.names():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = search(W.get(name).graph, progress=False)
        s = r.stats
        print(f"| {name} | {s['seconds']:.2f} | {s['enodes']} | {s['eclasses']} | {s['iterations']} | "
              f"{len(r.candidates)} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
