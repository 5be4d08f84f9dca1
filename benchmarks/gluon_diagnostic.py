"""What the hand-written Gluon diagnostics (`gluon_attention`, `gluon_gemm`) share: a
kernel compiled for sm_90 without a GPU and its resources, and each variant timed in a
process of its own with a time limit, so that a kernel that hangs (a barrier phase
wrong) or fails to compile costs only its own row."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tempfile


def sm90_usage(fn, signature: dict, constexprs: dict, warps: int) -> dict:
    """A Gluon kernel compiled for sm_90 here: shared memory (bytes), registers per
    thread, local memory (spills), and whether the PTX has wgmma and register
    reallocation (setmaxnreg: warp specialisation emitted)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    compiled = triton.compile(GluonASTSource(fn, signature, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = pathlib.Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        tool = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        usage = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
    ptx = compiled.asm["ptx"]
    return {"shared": compiled.metadata.shared, "regs": int(re.search(r"REG:(\d+)", usage).group(1)),
            "local": int(re.search(r"LOCAL:(\d+)", usage).group(1)), "wgmma": "wgmma.mma_async" in ptx,
            "setmaxnreg": "setmaxnreg" in ptx}


def run_each(module: str, variants, seconds: float, columns: int) -> None:
    """`python -m module --one VARIANT` for each variant, each within `seconds`; a
    variant that fails or hangs prints a row of `columns` cells saying so."""
    for variant in variants:
        try:
            subprocess.run([sys.executable, "-m", module, "--one", variant], timeout=seconds, check=True)
        except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
            print(f"| {variant} | failed: {type(exc).__name__} |" + " |" * (columns - 2), flush=True)
