"""TRITON_INTERPRET is read as Triton reads it (1, true, on, yes, y), in the runtime and
in the generated kernels. Only "1" counted before: under TRITON_INTERPRET=true Triton
interpreted the kernels while they took the GPU path, and a bf16 MatMul came back off
by 1e10 (the interpreter's bf16 dot), with no warning."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import cleave.rules as rules
from cleave.verify import require_sound, verdict

PROGRAM = textwrap.dedent("""
    import torch, cleave
    torch.manual_seed(0)
    x, w = torch.randn(32, 64, dtype=torch.bfloat16), torch.randn(64, 48, dtype=torch.bfloat16)
    got = cleave.compile(lambda a, b: a @ b, verbose=False)(x, w)
    want = (x.double() @ w.double()).to(torch.bfloat16)
    print((got.float() - want.float()).abs().max().item() / want.float().abs().max().item())
""")


@pytest.fixture
def cold_cache(tmp_path):
    """An operator cache with nothing in it, holding the library's verdicts: the child
    compiles cold without proving the library again (about 30 s a process)."""
    require_sound(rules.all_rules())  # proven here, or read from this run's cache dir
    if verdict.verdict_dir().is_dir():
        shutil.copytree(verdict.verdict_dir(), tmp_path / "verify")
    return tmp_path


def test_another_spelling_triton_accepts_interprets_exactly(cold_cache):
    env = {**os.environ, "TRITON_INTERPRET": "true", "CLEAVE_CACHE_DIR": str(cold_cache)}
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-2, done.stdout


def test_without_a_gpu_or_the_interpreter_the_warning_says_what_to_set(cold_cache):
    """CPU tensors with TRITON_INTERPRET unset: the fallback's warning quoted Triton's
    "0 active drivers ([]). There should only be one." """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CLEAVE_CACHE_DIR"] = str(cold_cache)
    program = textwrap.dedent("""
        import warnings, torch, cleave
        x = torch.randn(5, 7)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = cleave.compile(lambda a: (a * 2).exp(), verbose=False)(x)
        assert torch.equal(got, (x * 2).exp())
        print([str(w.message) for w in caught if "cleave" in str(w.message)])
    """)
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "set TRITON_INTERPRET=1" in done.stdout and "active drivers" not in done.stdout, done.stdout


def test_launch_without_a_gpu_or_the_interpreter_says_what_to_set(cold_cache):
    """The builder's path, schedule then launch, raised Triton's "0 active drivers"."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CLEAVE_CACHE_DIR"] = str(cold_cache)
    program = textwrap.dedent("""
        import torch, cleave
        from cleave.runtime.launch import launch
        g = cleave.Graph("g")
        g.output(g.input("a", ("n", "d")).exp().sum(-1), names=["o"])
        plan = cleave.schedule(g, {"n": 3, "d": 5})[0]
        launch(plan, {"a": torch.randn(3, 5)})
    """)
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=600)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and "set TRITON_INTERPRET=1" in last and "active drivers" not in last, last
