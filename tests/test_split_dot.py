"""A MatMul of an f32 operand with one that holds bf16 values (`p @ v.float()`, the
FlashInfer programs' P·V) runs as two bf16 tensor-core dots: p = hi + lo, each bf16,
and each product with a bf16 value is exact in f32. It must stay f32-accurate: one bf16
dot of p alone would be off by about 2^-9 (4e-3), far over the f32 tolerance (1e-5)."""
from __future__ import annotations

import torch

import cleave
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
