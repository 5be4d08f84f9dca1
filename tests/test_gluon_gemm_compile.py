"""`benchmarks.gluon_gemm` (the Gluon GEMM diagnostic of issues 12 and 13, timed on the
GPU only) compiles for sm_90 here with the Triton installed: every variant fits an
H200's shared memory and register file without spilling, issues wgmma, and reallocates
registers between its loader and consumer warpgroups. It compiles in a process of its
own: this one runs Triton's interpreter."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton.backends.nvidia")
pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

H200_SHARED = 232448  # bytes a program may opt into on sm_90


def test_every_gluon_gemm_variant_compiles_for_sm90_within_the_h200s_limits():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "benchmarks.gluon_gemm", "--compile"],
                         capture_output=True, text=True, env=env, check=True).stdout
    rows = {r[0]: r for r in ([c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
                              if line.startswith("| ")) if r[0] != "variant"}
    from benchmarks.gluon_gemm import VARIANTS

    assert set(rows) == set(VARIANTS), out
    for _, shared, regs, local, wgmma, setmaxnreg in rows.values():
        assert 0 < int(shared) <= H200_SHARED and 0 < int(regs) <= 255 and local == "0", rows
        assert wgmma == "True" and setmaxnreg == "True", rows
