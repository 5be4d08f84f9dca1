"""A scalar beside a half tensor, signed zeros of relu and clamp, and a softmax-like
reduction over a dynamic axis that is empty at run time, against eager.

A Python float or 0-dim tensor beside an f16 tensor was rounded to f16 before the op
(x_f16 * 1e5 was inf); logsumexp over an axis of extent 0 ran eagerly, its only plans
being split plans whose chunks all are empty there."""
import os
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

import cleave
from cleave.runtime.operator import AS_WRITTEN, CompiledOperator


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()


def _halves(dtype, n=7, seed=0):
    """Odd values spread over a few binades, seeded."""
    return (torch.rand(n, generator=torch.Generator().manual_seed(seed)) * 6 - 3).to(dtype)


def _compiled_quietly(f, *args):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # a fallback to eager warns
        return f(*args)


def _scale(x, s):
    return x * s


def _scale_and_shift(x, s):
    return x * s + 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scalar_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("value", [2.0 ** 16, 1e5, 1.004, 1e-6])
def test_a_zero_dim_scalar_scales_a_half_tensor_at_its_full_value(dtype, scalar_dtype, value):
    """x_f16 * s computes in f32 and rounds once, as torch does: 2**16 and 1e5 were inf
    (s rounded to f16 first), 1.004 was 1 in bf16 and 1e-6 a subnormal in f16."""
    x, s = _halves(dtype), torch.tensor(value, dtype=scalar_dtype)
    for fn in (_scale, _scale_and_shift):
        got = _compiled_quietly(cleave.compile(fn, verbose=False), x, s)
        assert got.dtype == dtype and torch.equal(got, fn(x, s)), (fn.__name__, got, fn(x, s))


@pytest.mark.parametrize("dtype, value", [(torch.float16, 1e5), (torch.float16, 65536.0), (torch.bfloat16, 1.004)])
def test_a_python_float_argument_under_dynamic_true(dtype, value):
    """dynamo passes the float as a 0-dim f64 tensor, which AOTAutograd casts to f32."""
    x = _halves(dtype)
    got = _compiled_quietly(torch.compile(_scale, backend="cleave", dynamic=True), x, value)
    assert torch.equal(got, _scale(x, value))


def test_a_float_computed_from_a_dynamic_size():
    def by_size(x):
        return x * float(x.shape[0] * 20000)

    f = torch.compile(by_size, backend="cleave", dynamic=True)
    for n in (4, 5):
        x = _halves(torch.float16, n, seed=n)
        assert torch.equal(_compiled_quietly(f, x), by_size(x)), n


OTHER_OPS = {"pow": lambda x, s: x.abs() ** s, "fmod": torch.fmod, "remainder": torch.remainder,
             "lt": torch.lt, "divided": lambda x, s: s / x, "atan2": torch.atan2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(OTHER_OPS))
def test_other_ops_take_a_zero_dim_scalar_rounded_to_the_half_type(dtype, name):
    """Besides +, -, * and a division by it, torch (CPU and CUDA) takes the scalar
    rounded to the tensor's type; an f64 one through f32, as torch converts it."""
    fn, x = OTHER_OPS[name], _halves(dtype)
    for s in (torch.tensor(3.3), torch.tensor(2049.0, dtype=torch.float64)):
        got = _compiled_quietly(cleave.compile(fn, verbose=False), x, s)
        assert torch.equal(got, fn(x, s)), (s, got, fn(x, s))


@pytest.mark.parametrize("name, fn", [("pow", lambda x: x.abs() ** 2.3), ("fmod", lambda x: torch.fmod(x, 0.3)),
                                      ("remainder", lambda x: torch.remainder(x, 0.3)),
                                      ("power_of", lambda x: 2.3 ** x)])
def test_a_python_number_in_other_ops_is_rounded_to_the_half_type(name, fn):
    """x_f16 ** 2.3 raises to 2.30078, as torch does: the exponent was kept at 2.3."""
    x = _halves(torch.float16)
    assert torch.equal(_compiled_quietly(cleave.compile(fn, verbose=False), x), fn(x))


def test_an_added_zero_dim_scalar_takes_cudas_rule():
    """CUDA adds a scalar at its full value in f32 and the CPU rounds it to the half type
    first (1 + 2049 is 2050 there, 2048 here): the kernels compute CUDA's."""
    x, s = torch.tensor([1.0, 3.0, -0.5], dtype=torch.float16), torch.tensor(2049.0)
    got = _compiled_quietly(cleave.compile(lambda x, s: x + s, verbose=False), x, s)
    assert torch.equal(got, (x.float() + s).half())


@pytest.mark.parametrize("x_dtype, s_dtype", [(torch.int32, torch.float32), (torch.float32, torch.float64),
                                              (torch.float32, torch.float16)])
def test_integer_and_wide_tensors_keep_torchs_promotion(x_dtype, s_dtype):
    x = (torch.randn(7, generator=torch.Generator().manual_seed(1)) * 50).to(x_dtype)
    s = torch.tensor(0.1, dtype=s_dtype)
    for fn in (_scale, _scale_and_shift):
        got = _compiled_quietly(cleave.compile(fn, verbose=False), x, s)
        want = fn(x, s)
        assert got.dtype == want.dtype and torch.equal(got, want), (fn.__name__, got, want)


@pytest.mark.parametrize("name, fn", [("relu", torch.relu), ("clamp_min", lambda x: x.clamp(min=0.0)),
                                      ("relu6", F.relu6), ("hardtanh", lambda x: F.hardtanh(x, 0.0, 1.0))])
def test_relu_and_clamp_agree_with_eager_but_on_negative_zero(name, fn):
    """NaN stays NaN and every value and sign is eager's, but for -0.0, where eager itself
    differs: the CPU keeps -0.0, CUDA gives +0.0, and so does Triton's maximum here."""
    x = torch.tensor([-0.0, 0.0, -1.5, 0.5, 7.0, -7.0, float("nan"), float("inf"), float("-inf")])
    got, want = _compiled_quietly(cleave.compile(fn, verbose=False), x), fn(x)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    signed = ~(x == 0)
    assert torch.equal(torch.signbit(got[signed]), torch.signbit(want[signed]))
    assert not torch.signbit(got[0])


def _logsumexp(a):
    return torch.logsumexp(a, -1)


def test_logsumexp_over_a_dynamic_axis_empty_at_run_time_compiles():
    """No split plan serves n = 0 (every chunk empty: a rescale exp(0 - c) may be inf
    there), so the graph as written serves it: eager's -inf, nothing run eagerly."""
    f = cleave.compile(_logsumexp, dynamic={"a": {1: "n"}}, verbose=False)
    gen = torch.Generator().manual_seed(2)
    for n in (5, 0, 3, 0):
        x = torch.randn(3, n, generator=gen)
        torch.testing.assert_close(_compiled_quietly(f, x), _logsumexp(x), rtol=1e-6, atol=1e-6)
    assert f.stats["failed"] == 0 and f.stats["compiles"] == 2, f.stats


def _logsumexp_graph():
    g = cleave.Graph("logsumexp")
    x = g.input("x", (3, "n"), "f32")
    m = x.max(-1, keepdim=True)
    g.output((x - m).exp().sum(-1, keepdim=True).log() + m, names=["y"])
    return g


def test_a_binding_no_plan_serves_takes_the_graph_as_written_and_keeps_it():
    """Its plans are saved beside the operator's: another process loads them."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(3))
    op = CompiledOperator(_logsumexp_graph(), {"n"})
    op({"x": x})
    _, spec = op.select({"x": x[:, :0]})
    assert spec.static == {AS_WRITTEN: 1} and spec.candidate.derivation == []
    assert all(not p.split and not p.requires for p in spec.plans)
    (got,) = op({"x": x[:, :0]})
    assert torch.equal(got, torch.full((3, 1), float("-inf")))
    again = CompiledOperator(_logsumexp_graph(), {"n"})
    _, loaded = again.select({"x": x[:, :0]})
    assert loaded.from_cache and again.stats["compiles"] == 0 and again.stats["searches"] == 0
