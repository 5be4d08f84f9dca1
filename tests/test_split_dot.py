"""A MatMul of an f32 operand with one that holds bf16 values (`p @ v.float()`, the
FlashInfer programs' P·V) runs as two bf16 tensor-core dots: p = hi + lo, each bf16,
and each product with a bf16 value is exact in f32. It must stay f32-accurate: one bf16
dot of p alone would be off by about 2^-9 (4e-3), far over the f32 tolerance (1e-5).

torch.set_float32_matmul_precision("medium") relaxes this as it relaxes torch's own
MatMuls: f32 operands are rounded to bf16 once (one dot). "high" (TF32) keeps them exact
(runtime/operator.py says why)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import cleave
from cleave.scheduler import H200
from kernel_check import check_outputs, plan_sources


def softmax_times_upcast(s, v):
    return torch.softmax(s, dim=-1) @ v.float()


def product_of_f32(a, b):
    return torch.exp(a) @ b


def _compile(fn, *args):
    f = cleave.compile(fn, verbose=False)
    got = f(*args)
    assert f.stats["failed"] == 0 and f.stats["graph_breaks"] == 0
    return got, "\n".join(plan_sources(f))


def _assert_rounded_to_bf16_once(got, a, b):
    """exp(a) @ b with both operands rounded to bf16, as eager's "medium" rounds them. A
    kernel's f32 exp may differ from torch's in the last bit, which moves a value across a
    bf16 rounding boundary now and then and so a whole output row: medians, not every
    element, tell the rounded product (off by 0) from the unrounded one (off by ~1e-2)."""
    rounded = torch.exp(a.double()).to(torch.bfloat16).double() @ b.to(torch.bfloat16).double()
    unrounded = torch.exp(a.double()) @ b.double()
    assert (got.double() - rounded).abs().median() < 1e-5
    assert (got.double() - unrounded).abs().median() > 1e-3


def test_f32_times_upcast_bf16_is_two_bf16_dots_at_f32_accuracy():
    gen = torch.Generator().manual_seed(torch.seed() % 10_000)
    s = torch.randn(37, 45, generator=gen) * 3
    v = torch.randn(45, 29, generator=gen).to(torch.bfloat16)
    got, source = _compile(softmax_times_upcast, s, v)
    check_outputs([got], [torch.softmax(s.double(), dim=-1) @ v.double()], "softmax(s) @ v.float()")
    assert 'input_precision="ieee"' not in source
    assert source.count("to_bf16(") >= 2 and source.count("tl.dot(") >= 2


def test_a_product_of_two_f32_operands_stays_ieee():
    gen = torch.Generator().manual_seed(torch.seed() % 10_000)
    a, b = torch.randn(33, 41, generator=gen), torch.randn(41, 19, generator=gen)
    got, source = _compile(product_of_f32, a, b)
    check_outputs([got], [product_of_f32(a.double(), b.double())], "exp(a) @ b")
    assert 'input_precision="ieee"' in source


@pytest.fixture
def f32_matmul():
    """torch.set_float32_matmul_precision, restored after the test."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def test_high_keeps_a_product_of_two_f32_operands_exact(f32_matmul):
    f32_matmul("high")
    gen = torch.Generator().manual_seed(torch.seed() % 10_000)
    a, b = torch.randn(33, 41, generator=gen), torch.randn(41, 19, generator=gen)
    got, source = _compile(product_of_f32, a, b)
    check_outputs([got], [product_of_f32(a.double(), b.double())], "exp(a) @ b")
    assert 'input_precision="ieee"' in source


def test_medium_rounds_both_f32_operands_to_bf16_once(f32_matmul):
    f32_matmul("medium")
    gen = torch.Generator().manual_seed(torch.seed() % 10_000)
    a, b = torch.randn(33, 41, generator=gen), torch.randn(41, 19, generator=gen)
    got, source = _compile(product_of_f32, a, b)
    _assert_rounded_to_bf16_once(got, a, b)
    assert "input_precision" not in source


def test_medium_rounds_the_f32_operand_to_bf16_once(f32_matmul):
    f32_matmul("medium")
    gen = torch.Generator().manual_seed(torch.seed() % 10_000)
    s = torch.randn(37, 45, generator=gen) * 3
    v = torch.randn(45, 29, generator=gen).to(torch.bfloat16)
    got, source = _compile(softmax_times_upcast, s, v)
    exact = torch.softmax(s.double(), dim=-1) @ v.double()
    # one bf16 term: about 2^-9 off per product, where two terms are f32-accurate (1e-5)
    assert 1e-5 < (got.double() - exact).norm() / exact.norm() < 1e-2
    kernels = source.split("\n@triton.jit\ndef softmax_times_upcast")[1:]
    assert kernels and all(k.count("tl.dot(") == 1 for k in kernels) and "input_precision" not in source


def test_a_new_precision_between_calls_gets_its_own_operator(f32_matmul):
    gen = torch.Generator().manual_seed(torch.seed() % 10_000)
    a, b = torch.randn(33, 41, generator=gen), torch.randn(41, 19, generator=gen)
    f = cleave.compile(product_of_f32, verbose=False)
    f(a, b)
    f(a, b)  # the hot path, which reads the precision too
    f32_matmul("medium")
    _assert_rounded_to_bf16_once(f(a, b), a, b)
    assert sorted(op.f32_matmul for op in f.operators) == ["highest", "medium"]
    fields = {op.f32_matmul: op.fields for op in f.operators}
    assert "f32_matmul" not in fields["highest"] and fields["medium"]["f32_matmul"] == "medium"
    f32_matmul("highest")
    check_outputs([f(a, b)], [product_of_f32(a.double(), b.double())], "exp(a) @ b")


def test_the_per_backend_setting_does_not_break_a_call(f32_matmul):
    # torch.backends.cuda.matmul.fp32_precision makes torch.get_float32_matmul_precision raise
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    gen = torch.Generator().manual_seed(torch.seed() % 10_000)
    a, b = torch.randn(33, 41, generator=gen), torch.randn(41, 19, generator=gen)
    got, source = _compile(product_of_f32, a, b)
    check_outputs([got], [product_of_f32(a.double(), b.double())], "exp(a) @ b")
    assert 'input_precision="ieee"' in source


def test_a_target_names_only_torchs_precisions():
    with pytest.raises(ValueError, match="f32_matmul must be one of highest, medium"):
        dataclasses.replace(H200, f32_matmul="tf32")
