"""Two programs that ran eagerly (probe 27): a masked attention scaled by a size's
`d ** -0.5` under dynamic=True, whose kernel took a float64 scalar's pow through a
32-bit bitcast, and a count of confident classes, `(softmax > t).any(-1)`, whose
loop nest put the count in the loop of the max it reads through the softmax's sum
(codegen recursed without end). Each now compiles and matches eager."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave
from cleave.ir import Candidate, Separable, ShapeError, parse_graph
from cleave.scheduler import schedule
from cleave.scheduler.codegen import INTERPRETED_LINE, Emitter, math_helpers
from cleave.scheduler.loops import Loop
from kernel_check import run_and_check


def _eager_fallbacks(run) -> list[str]:
    """The warnings of a compile that gave up (the program then ran eagerly)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if "could not compile" in str(w.message)
            or "running eagerly" in str(w.message)]


# -- d01: pow of a float64 scalar ---------------------------------------------------
def attn_probs(q, k, lengths):
    valid = torch.arange(k.shape[2])[None, :] < lengths[:, None]
    add = (~valid).float()[:, None, None, :] * -1e9
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + add
    return s.softmax(-1)


def test_attention_scaled_by_a_dynamic_size_compiles():
    """Under dynamic=True, `q.shape[-1] ** -0.5` is a 0-d f64 pow in the kernel: its
    sign test bitcast 64 bits to int32, and the kernel failed at its first launch."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 3, 8, generator=gen), torch.randn(2, 4, 3, 8, generator=gen)
    lengths = torch.tensor([3, 2])
    f = torch.compile(attn_probs, backend="cleave", dynamic=True)
    got = {}
    with torch.no_grad():
        assert _eager_fallbacks(lambda: got.setdefault("out", f(q, k, lengths))) == []
    torch.testing.assert_close(got["out"], attn_probs(q, k, lengths), rtol=1e-5, atol=1e-6)


def _helper_kernel(tmp_path, expr: str):
    """A kernel computing `expr` of loaded a and b with the codegen's MATH helpers."""
    body = f"    tl.store(out_ptr + i, {expr})"
    src = "\n".join(["import os", "import triton", "import triton.language as tl",
                     INTERPRETED_LINE, "", ""]
                    + math_helpers(body)
                    + ["@triton.jit", "def kernel(a_ptr, b_ptr, out_ptr, N: tl.constexpr):",
                       "    i = tl.arange(0, N)", "    a = tl.load(a_ptr + i)", "    b = tl.load(b_ptr + i)", body, ""])
    path = tmp_path / "helpers.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("probe27_helpers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.kernel


@pytest.mark.parametrize("expr, ref", [("pow_f32(a, b)", torch.pow),
                                       ("tl.where(negative(b), -tl.abs(a), tl.abs(a))", torch.copysign)])
def test_sign_helpers_take_float64_operands(tmp_path, expr, ref):
    """On f64 operands pow keeps C's signs (odd integer powers of a negative base or
    -0.0, NaN for a fractional one) and copysign reads b's sign bit, as torch's."""
    s = [0.0, -0.0, 1.0, -1.0, -2.0, 2.0, 0.5, -0.5, 3.0, -3.0, 1.5, float("inf"), float("-inf"), float("nan")]
    a, b = (t.flatten().double() for t in torch.meshgrid(torch.tensor(s), torch.tensor(s), indexing="ij"))
    n = 256
    pad = n - a.numel()
    a, b = torch.cat([a, torch.ones(pad, dtype=torch.float64)]), torch.cat([b, torch.ones(pad, dtype=torch.float64)])
    out = torch.empty(n, dtype=torch.float64)
    _helper_kernel(tmp_path, expr)[(1,)](a, b, out, N=n)
    want = ref(a, b)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=0, equal_nan=True)
    assert torch.equal(out.signbit() & ~out.isnan(), want.signbit() & ~want.isnan())


# -- d02: a reduction of a compare of a softmax -------------------------------------
def confident(logits):
    return (logits.softmax(-1) > 0.5).any(-1)


def count_confident(logits):
    return (logits.softmax(-1) > 0.5).sum(-1)


@pytest.mark.parametrize("prog, dynamic", [(confident, None), (count_confident, {"logits": {1: "c"}})])
def test_reduction_of_a_softmax_compare_compiles(prog, dynamic):
    """The count read the softmax's sum (a loop over the chunked class axis, another
    label), which reads the max: it shared the max's loop, and codegen asked for the
    max while emitting its loop. It now runs in a pass after both."""
    f = cleave.compile(prog, dynamic=dynamic)
    gen = torch.Generator().manual_seed(1)
    for c in (7, 5):
        x = torch.randn(4, c, generator=gen) * 3
        got = {}
        assert _eager_fallbacks(lambda: got.setdefault("out", f(x))) == []
        assert torch.equal(got["out"], prog(x))
    assert f.stats["failed"] == 0


def test_count_of_a_softmax_compare_is_not_rescaled_with_the_max():
    """A sum of `softmax > t` is no product of exp(x - m): it cannot join the max's
    loop and be rescaled as the running max moves. Every plan counts exactly."""
    g = parse_graph('''graph conf {
  %0 = input(name="x", shape=[r,c], dtype=f32) : f32[r,c]
  %1 = reduce(%0, op="max", axis=1, keepdim=1) : f32[r,1]
  %2 = sub(%0, %1) : f32[r,c]
  %3 = exp(%2) : f32[r,c]
  %4 = reduce(%3, op="sum", axis=1, keepdim=1) : f32[r,1]
  %5 = div(%3, %4) : f32[r,c]
  %6 = const(value=0.5, dtype=f32) : f32[]
  %7 = gt(%5, %6) : bool[r,c]
  %8 = cast(%7, dtype=i64) : i64[r,c]
  %9 = reduce(%8, op="sum", axis=1, keepdim=0) : i64[r]
  return out=%9
}''')
    cand = Candidate(g, facts=[Separable(3, 1, "exp(y_old - y_new)", "exp-sub-separate")])
    env = {"r": 4, "c": 300}
    for plan in schedule(cand, env, dynamic=("c",), top_k=4):
        run_and_check(g, plan, env, seed=0)


def test_a_loop_that_reads_its_own_result_is_a_shape_error():
    """Asked for while its body is emitted, a loop says so (another tiling is then
    tried) instead of recursing until Python's stack runs out."""
    loop = Loop(label=1, chain=(), accs=(), factors=frozenset(), rescale={}, scaled={})
    emitter = types.SimpleNamespace(emitting={loop})
    with pytest.raises(ShapeError, match="reads its own result"):
        Emitter.emit_loop(emitter, None, loop)


_SM90_SCRIPT = '''
import pathlib, sys, tempfile, importlib.util
import triton
from triton.backends.compiler import GPUTarget
from cleave.scheduler.codegen import MATH
helpers = "\\n".join("@triton.jit\\n" + "\\n".join(MATH[n]) + "\\n" for n in ("negative", "pow_f32", "atan2_f32"))
source = ("import triton\\nimport triton.language as tl\\n" + helpers +
          "@triton.jit\\ndef k(x_ptr, o_ptr):\\n    x = tl.load(x_ptr)\\n"
          "    tl.store(o_ptr, pow_f32(x, x) + atan2_f32(x, x) + tl.where(negative(x), 1.0, 0.0))\\n")
path = pathlib.Path(tempfile.mkdtemp()) / "helpers.py"
path.write_text(source)
spec = importlib.util.spec_from_file_location("helpers", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
for ty in ("fp32", "fp64"):
    triton.compile(triton.compiler.ASTSource(fn=module.k, signature={"x_ptr": "*" + ty, "o_ptr": "*" + ty},
                                             constexprs={}), target=GPUTarget("cuda", 90, 32))
print("compiled")
'''


def test_the_sign_helpers_compile_for_the_gpu_on_f32_and_f64():
    """Compiled (not interpreted), Triton builds the code after an early `return` in a
    constexpr branch too: `negative` written that way bitcast an f64 to int32 and failed
    on the H200 while the interpreter ran it. Compiled for sm_90 in a process of its own."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _SM90_SCRIPT], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "compiled" in out.stdout, out.stderr[-2000:]
