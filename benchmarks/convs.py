"""Convolutions against cuDNN: whether cleave's compiled convolutions (a window take
contracted with the weight: frontends/aten_windows.py) keep up with what eager PyTorch
and torch.compile call, cuDNN. bf16, NCHW, inference; static shapes. A ResNet-50 3x3
and 1x1 convolution at 56 x 56, a depthwise 3x3 (MobileNet's), the 7x7 stem, and a
ResNet basic block (conv, batch norm, ReLU, conv, batch norm, residual, ReLU).

The search needs egglog and z3, which the GPU image lacks, so the work is split as in
benchmarks/layers.py:

    python -m benchmarks.convs build --plans .gpu_convs             # here: capture, search, schedule
    python -m benchmarks.convs run --plans .gpu_convs --out $OUT    # on the GPU
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import pathlib
import statistics
import sys
import time

import torch
from torch import nn

from benchmarks.layers import _bench, _graph_ms, _log, _plan_inputs, alternating, capture_module, write_rows


class BasicBlock(nn.Module):
    """ResNet's basic block at stride 1: relu(bn(conv(relu(bn(conv(x))))) + x)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


# name -> (module, input shape [N, C, H, W])
CASES = {
    "conv3x3_c64_56": (lambda: nn.Conv2d(64, 64, 3, padding=1, bias=False), (32, 64, 56, 56)),
    "conv1x1_c256_56": (lambda: nn.Conv2d(256, 64, 1, bias=False), (32, 256, 56, 56)),
    "depthwise3x3_c144_56": (lambda: nn.Conv2d(144, 144, 3, padding=1, groups=144, bias=False), (32, 144, 56, 56)),
    "stem7x7_s2": (lambda: nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), (32, 3, 224, 224)),
    "resnet_block_c64_56": (lambda: BasicBlock(64), (32, 64, 56, 56)),
}
ROUNDS = 3  # alternating timing rounds of cleave, eager and torch.compile per case


def make(name: str, device: str):
    """The case's module (seeded weights, batch-norm statistics made non-trivial) in bf16
    eval mode, and its input."""
    factory, shape = CASES[name]
    torch.manual_seed(0)
    module = factory()
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    module = module.to(device=device, dtype=torch.bfloat16).eval()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=torch.bfloat16)
    return module, (x,)


def build(out: pathlib.Path, names: list[str], top_plans: int) -> None:
    import cleave
    from cleave.frontends.aten_windows import COMPILE_CONVOLUTIONS

    os.environ[COMPILE_CONVOLUTIONS[0]] = COMPILE_CONVOLUTIONS[1]  # what is timed is cleave's convolution
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        start = time.perf_counter()
        module, args = make(name, "cpu")
        graph, sources = capture_module(module, args, name, dynamic=False)
        best = cleave.search(graph, progress=False).best
        plans = cleave.schedule(best, {}, top_k=top_plans)
        spec = {"case": name, "sources": sources, "derivation": best.derivation,
                "plans": [p.to_json() for p in plans], "compile_seconds": time.perf_counter() - start}
        (out / f"{name}.json").write_text(json.dumps(spec, indent=1))
        _log(f"{name}: {len(plans)} plans of {[len(p.kernels) for p in plans]} kernels, "
             f"{spec['compile_seconds']:.1f}s -> {out / name}.json")


def run_case(spec: dict) -> dict:
    from cleave.runtime.launch import launch
    from cleave.scheduler import Plan

    module, args = make(spec["case"], "cuda")
    with torch.no_grad():
        want = module.float()(*(a.float() for a in args))
        module = module.to(torch.bfloat16)
        row = {"case": spec["case"], "plans": []}
        plans = [Plan.from_json(p) for p in spec["plans"]]
        for index, plan in enumerate(plans):
            inputs = _plan_inputs(spec, plan, module, args)
            try:
                (got,) = launch(plan, inputs)
                err = ((got.double() - want.double()).norm() / want.double().norm()).item()
                ms = _bench(lambda: launch(plan, inputs))
            except Exception as exc:  # a plan that fails on the GPU is reported, not hidden
                row["plans"].append({"index": index, "error": f"{type(exc).__name__}: {exc}"[:300]})
                _log(f"  plan {index}: FAILED {exc}")
                continue
            row["plans"].append({"index": index, "ms": ms, "rel_err": err})
            _log(f"  plan {index}: {ms:.4f} ms, rel err {err:.1e}")
        good = [p for p in row["plans"] if p.get("rel_err", 1) <= 2e-2]
        best = min(good, key=lambda p: p["ms"], default=None)
        torch._dynamo.reset()
        compiled = torch.compile(module)
        compiled(*args)
        contenders = {"eager_ms": lambda: module(*args), "compile_ms": lambda: compiled(*args)}
        if best is not None:
            plan = plans[best["index"]]
            inputs = _plan_inputs(spec, plan, module, args)
            contenders["cleave_ms"] = lambda: launch(plan, inputs)
        row.update({k: statistics.median(v) for k, v in alternating(contenders, ROUNDS).items()})
        row["graph_ms"] = {k: _graph_ms(fn) for k, fn in contenders.items()}
        row["best_plan"] = best and best["index"]
    return row


def table(rows: list[dict]) -> str:
    lines = ["| case | eager (cuDNN) ms | torch.compile ms | cleave ms (its best plan) | × eager | × torch.compile "
             "| CUDA graphs: cleave / eager ms (×) | cleave rel. err |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r.get("cleave_ms")
        g = r["graph_ms"]
        graphs = f"{g['cleave_ms']:.4f} / {g['eager_ms']:.4f} ({g['eager_ms'] / g['cleave_ms']:.2f})" \
            if c and g.get("cleave_ms") and g.get("eager_ms") else "—"
        err = next((p["rel_err"] for p in r["plans"] if p["index"] == r["best_plan"]), None)
        lines.append(f"| {r['case']} | {r['eager_ms']:.4f} | {r['compile_ms']:.4f} | "
                     + (f"{c:.4f} (plan {r['best_plan']}) | {r['eager_ms'] / c:.2f} | {r['compile_ms'] / c:.2f}"
                        if c else "no plan within tolerance | — | —")
                     + f" | {graphs} | " + (f"{err:.1e}" if err is not None else "—") + " |")
    return "\n".join(lines)


def run(plans: pathlib.Path, out: pathlib.Path) -> None:
    import triton

    out.mkdir(parents=True, exist_ok=True)
    header = (f"## {datetime.date.today()} — convolutions, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"triton {triton.__version__}\n\nbf16 NCHW inference; cleave's fastest plan within 2e-2 relative L2 of "
              f"fp32 eager; each time the median of {ROUNDS} alternating do_bench rounds.\n\n")
    specs = [json.loads(f.read_text()) for f in sorted(plans.glob("*.json"))]
    write_rows(out / "convs", header, [(spec["case"], functools.partial(run_case, spec)) for spec in specs], table)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["build", "run"], help="build: here (egglog, z3); run: on the GPU")
    p.add_argument("--plans", default=".gpu_convs", help="where build writes the plans and run reads them")
    p.add_argument("--out", default=".", help="where run writes its table")
    p.add_argument("--only", nargs="*", default=list(CASES), help="build these cases")
    p.add_argument("--top-plans", type=int, default=4)
    args = p.parse_args(argv)
    if args.command == "build":
        build(pathlib.Path(args.plans), args.only, args.top_plans)
    else:
        run(pathlib.Path(args.plans), pathlib.Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
