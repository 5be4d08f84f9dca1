"""Replay the paged serving traces on the GPU against the strongest baseline per step.

    python -m benchmarks.replay_paged TRACE.jsonl --artifact NAME.cleave [--limit N]

`cleave trace replay` compares with the definition's own reference (a Python loop over
requests). Here every step is also run as padded SDPA (each request's pages gathered
into a dense batch, `paged_baselines.padded_sdpa`: enable_gqa and GQA folded, on the
cuDNN and efficient backends, the ones that take a mask), its per-step metadata built
untimed, and cleave is compared with the fastest of these and the reference at that
step. A candidate that refuses the inputs or disagrees with the reference is dropped
for that step. flex_attention is left out here: compiled per shape, it would recompile
at every step (the presets in `benchmarks.run` time it).

Prints one line per step to stderr and a summary row (geomeans, the copy-ceiling
fraction of the decode steps, recompiles) to stdout.
"""
from __future__ import annotations

import argparse
import functools
import math
import sys

from .paged_baselines import _prepare_padded, copy_ceiling_fraction, decode_bytes, padded_sdpa
from .strongest import error


def _backends():
    from torch.nn.attention import SDPBackend

    return [("cuDNN", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def candidates(name: str, reference):
    """inputs -> [(label, run)]: the padded SDPA forms that run and agree with the
    reference at this step (to 2e-2 relative L2, as the presets hold them)."""
    from torch.nn.attention import sdpa_kernel

    def make(inputs: dict):
        want = reference(*inputs.values())
        want = want[0] if isinstance(want, (tuple, list)) else want
        out = []
        prepared = _prepare_padded(name, inputs, pregather=False)  # the step's layout, once for every form
        for folded, form in ((False, "padded SDPA (enable_gqa)"), (True, "padded SDPA (GQA folded)")):
            fn = padded_sdpa(name, folded)
            for label, backend in _backends():
                def run(fn=fn, prepared=prepared, backend=backend):
                    with sdpa_kernel([backend]):
                        return fn(**prepared)
                try:
                    got = run()
                except RuntimeError:  # the backend refuses these inputs
                    continue
                if error([got], [want]) <= 2e-2:
                    out.append((f"{form} {label}", run))
        return out
    return make


def main(argv=None) -> int:
    from cleave.runtime.replay import reference_fn, replay
    from cleave.runtime.traces import load_trace

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--artifact", required=True)
    p.add_argument("--limit", type=int)
    args = p.parse_args(argv)
    definition, _ = load_trace(args.trace)
    name = definition["name"]
    reference = reference_fn(definition)
    make = candidates(name, reference)
    fractions = []
    step = {}  # the bytes the current step must move (decode only)

    def baselines(inputs):
        step["bytes"] = decode_bytes(name, inputs)
        return [("reference", functools.partial(reference, *inputs.values()))] + make(inputs)

    def progress(i, n, shape):
        fraction = copy_ceiling_fraction(step.get("bytes"), shape.cleave_graph_ms)
        if fraction is not None:
            fractions.append(fraction)
        print(f"[{i}/{n}] {' '.join(f'{k}={v}' for k, v in shape.axes.items())}  cleave {shape.cleave_ms:.4f} "
              f"(graph {shape.cleave_graph_ms or float('nan'):.4f}) ms  {shape.baseline} {shape.sdpa_ms:.4f} "
              f"(graph {shape.sdpa_graph_ms or float('nan'):.4f}) ms  x{shape.speedup:.2f}  {shape.plan}"
              + (f"  copy ceiling {fraction:.0%}" if fraction is not None else ""), file=sys.stderr, flush=True)

    result = replay(args.trace, device="cuda", limit=args.limit, progress=progress, artifact=args.artifact,
                    baselines=baselines)
    winners = sorted({s.baseline for s in result.shapes})
    graph = result.graph_geomean
    ceiling = f"{max(fractions):.0%} max, {sorted(fractions)[len(fractions) // 2]:.0%} median" if fractions else "—"
    print(f"| {name} | {len(result.shapes)} | {result.geomean:.2f} | "
          f"{'—' if graph is None else f'{graph:.2f}'} | {', '.join(winners)} | {ceiling} | {result.recompiles} | "
          f"{result.jit_recompiles} (+{result.jit_tuning} tuning) |")
    return 0 if math.isfinite(result.geomean) else 1


if __name__ == "__main__":
    sys.exit(main())
