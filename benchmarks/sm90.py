"""Compile plan files' kernels for the H200 (sm_90) here, without a GPU, and report what
the cost model can only estimate: the shared memory Triton allocates, the registers a
thread takes, bytes spilled to local memory, and how many buffers each loop tile gets.
Triton compiles for a target it is given (`GPUTarget("cuda", 90, 32)`) with the ptxas
its wheel ships; with the device's Triton version installed here (3.6.0: `pip install
triton==3.6.0` in a venv of its own), the numbers are the H200's.

    python -m benchmarks.sm90 --plans DIR [--only NAME ...] [--variants | --launch 4,2 4,3]

`--variants` also compiles each kernel at the launch configurations the runtime's tuning
tries (`cleave.runtime.mix.launch_variants`). Session 25 found this way that Triton
pipelines a tile gathered through indices loaded in its loop with one buffer at 1-4
stages (kernel_stats.Stats.gathered)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

TYPES = {"bf16": "bf16", "f16": "fp16", "f32": "fp32", "f64": "fp64", "i8": "i8", "u8": "u8", "i16": "i16",
         "i32": "i32", "i64": "i64", "bool": "i1"}


def _signature(plan: dict, kernel: dict, fn) -> tuple[dict, dict]:
    """Triton's signature and constexprs for one kernel, as the launcher binds them: buffers
    as pointers (16-byte aligned, as the JIT specialises them), descriptors as tensor
    descriptors (a Gluon kernel's with their shared-memory layout; a `tl` twin's it does
    not read as None), symbols at the plan's binding, the TMA switch on."""
    dtypes = {b["name"]: b["dtype"] for key in ("inputs", "outputs", "intermediates") for b in plan[key]}
    if kernel.get("arrivals"):
        dtypes[kernel["arrivals"][0]] = "i32"
    descriptors = {d[0]: (dtypes[d[1]], d[2]) for d in kernel.get("descriptors", [])}
    unread = {d[0] for d in (kernel.get("fallback") or {}).get("descriptors", [])} - set(descriptors)
    signature, constants = {}, {}
    for name, param in zip(kernel["args"], fn.params):
        if name in descriptors:
            dtype, block = descriptors[name]
            signature[param.name] = f"tensordesc<{TYPES[dtype]}[{', '.join(str(b) for b in block)}]" + \
                (f",{_gluon_layout(dtype, block)!r}>" if kernel.get("dialect") == "gluon" else ">")
        elif name in unread:
            signature[param.name], constants[param.name] = "constexpr", None
        elif name in dtypes:
            signature[param.name] = "*" + TYPES[dtypes[name]]
        elif param.is_constexpr:
            signature[param.name], constants[param.name] = "constexpr", plan["env"][name]
        else:
            signature[param.name] = "i32"
    for param in fn.params[len(kernel["args"]):]:  # the launcher's switches: TMA on where descriptors exist
        signature[param.name], constants[param.name] = "constexpr", bool(descriptors)
    return signature, constants


def _gluon_layout(dtype: str, block: list):
    """The shared-memory layout the launcher gives a Gluon kernel's descriptor (launch.gluon_descriptor)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(block, {"bf16": gl.bfloat16, "f16": gl.float16}[dtype])


def compile_sm90(plan: dict, kernel: dict, warps: int, stages: int) -> dict:
    """Shared memory (bytes), registers per thread, local memory (spills) and the loop
    tiles' shared-memory buffers of one kernel compiled for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget

    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / f"{kernel['name']}.py"
        path.write_text(kernel["source"])
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, kernel["name"])
        signature, constants = _signature(plan, kernel, fn)
        aligned = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if signature[p.name][0] == "*"}
        if kernel.get("dialect") == "gluon":
            from triton.experimental.gluon._runtime import GluonASTSource

            source = GluonASTSource(fn, signature, constexprs=constants, attrs=aligned)
        else:
            source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=aligned)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": warps, "num_stages": stages})
        cubin = pathlib.Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        tool = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        usage = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    local = re.search(r"LOCAL:(\d+)", usage)
    buffers = sorted(set(re.findall(r"memdesc<((?:\d+x)+)\w+, #\w+, #smem, mutable>", compiled.asm["ttgir"])))
    return {"shared": compiled.metadata.shared, "regs": int(regs.group(1)) if regs else None,
            "local": int(local.group(1)) if local else None, "buffers": [b.rstrip("x") for b in buffers],
            "setmaxnreg": "setmaxnreg" in compiled.asm["ptx"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plans", required=True, help="folder of plan files from benchmarks.build")
    parser.add_argument("--only", nargs="*", help="workload names")
    parser.add_argument("--variants", action="store_true", help="also the runtime tuning's launch configurations")
    parser.add_argument("--launch", nargs="*", default=[], metavar="WARPS,STAGES",
                        help="compile at these launch configurations instead of each kernel's own")
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    print(f"triton {triton.__version__}, sm_90", file=sys.stderr)
    print("| plan file | plan | kernel | warps | stages | shared bytes | registers | local bytes | loop buffers | "
          "dialect (registers reallocated) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in sorted(pathlib.Path(args.plans).glob("*.json")):
        spec = json.loads(path.read_text())
        if args.only and spec["workload"] not in args.only:
            continue
        for index, plan in enumerate(spec["plans"]):
            for kernel in plan["kernels"]:
                configs = [tuple(int(x) for x in c.split(",")) for c in args.launch] or \
                    [(kernel["num_warps"], kernel["num_stages"])]
                if args.variants:
                    from cleave.runtime.mix import launch_variants
                    from cleave.scheduler.plan import Kernel

                    configs += launch_variants(Kernel.from_json(kernel))
                for warps, stages in configs:
                    try:
                        r = compile_sm90(plan, kernel, warps, stages)
                    except Exception as err:  # a kernel Triton rejects is itself the finding
                        print(f"| {path.stem} | {index} | {kernel['name']} | {warps} | {stages} | failed: "
                              f"{type(err).__name__}: {str(err).splitlines()[0][:120]} | | | | |")
                        continue
                    print(f"| {path.stem} | {index} | {kernel['name']} | {warps} | {stages} | {r['shared']} | "
                          f"{r['regs']} | {r['local']} | {', '.join(r['buffers'])} | "
                          f"{kernel.get('dialect', 'triton')}{' (setmaxnreg)' if r['setmaxnreg'] else ''} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
