"""`cleave trace replay --plot FILE.png`: each shape's speedup over the trace's
reference (SDPA), in trace order, drawn with matplotlib (the `viz` extra)."""
from __future__ import annotations

from .ir import CleaveError

# Up to this many shapes, each x tick names its shape; past it the ticks would overlap.
NAMED_TICKS = 16


def require_matplotlib() -> None:
    """Fails, before a replay that can take minutes, where the plot could not be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CleaveError("--plot needs matplotlib: pip install matplotlib (or pip install 'cleave[viz]')") from None


def speedup_figure(result):
    """A matplotlib Figure of `result` (a runtime.replay.ReplayResult): the eager speedup
    of every shape, the CUDA-graph speedup where it was timed, their geometric means,
    and the reference at 1. Built without pyplot, so no display backend is involved."""
    from matplotlib.figure import Figure

    x = list(range(1, len(result.shapes) + 1))
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(x, [s.speedup for s in result.shapes], "o-", markersize=4, linewidth=0.8,
            label=f"eager launches (geomean x{result.geomean:.3g})")
    if result.graph_geomean is not None:
        ax.plot(x, [s.graph_speedup for s in result.shapes], "s-", markersize=4, linewidth=0.8,
                label=f"CUDA-graph replays (geomean x{result.graph_geomean:.3g})")
    ax.axhline(1.0, color="black", linewidth=1, label="SDPA (the reference)")
    ax.set_yscale("log")  # a ratio: x2 and x0.5 sit equally far from 1
    ax.set_ylabel("speedup over SDPA")
    if len(x) <= NAMED_TICKS:
        ax.set_xticks(x, [" ".join(f"{k}={v}" for k, v in s.axes.items()) for s in result.shapes],
                      rotation=45, ha="right", fontsize=8)
        ax.set_xlabel("shape")
    else:
        ax.set_xlabel("shape, in trace order")
    ax.set_title(f"cleave on {result.definition} ({result.device}), {len(x)} shapes")
    ax.grid(True, which="both", axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def save_speedup_plot(result, path: str) -> None:
    speedup_figure(result).savefig(path, dpi=120)
