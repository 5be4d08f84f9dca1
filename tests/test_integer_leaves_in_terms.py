"""Integer and bool values are leaves of the search, whose terms are real: a rewrite can
still put one under a term's op (`sum-pull-factor` moves the sum of `(x_u8 * 0.5)` onto
x_u8), and the lowering promotes it to f32 there. Lowered in its own type, the sum
wrapped (`(img_u8 / 255.0).mean(1)` gave 0.098 for 0.700) and `div-div-cancel` turned
`(x / 2.0) / (y / 2.0)` of int64s into a flooring division."""
from __future__ import annotations

import warnings

import pytest
import torch

import cleave
from cleave.ir import Graph
from cleave.rules.dsl import Leaf, Term, Axis
from cleave.rules.lower import Lowering


def test_a_sum_lowered_over_an_integer_leaf_sums_in_f32():
    g = Graph("g")
    x = g.input("x", (3, 5), "u8")
    node = Lowering(g, leaf=lambda key, args: x)(Term("rsum", (Leaf(0, ()), Axis(None, -1))))
    assert node.op == "reduce" and node.dtype.name == "f32" and node.inputs[0].op == "cast"


@pytest.mark.parametrize("fn, x", [
    (lambda x: (x * 0.5).sum(1), torch.tensor([[100, 100, 100, 1, 1]], dtype=torch.int8)),
    (lambda x: (x * 0.5).sum(1), torch.tensor([[200, 200, 100, 1, 1]], dtype=torch.uint8)),
    (lambda x: (x / 4.0).sum(1), torch.tensor([[2**30, 2**30, 2**30]], dtype=torch.int32)),
    (lambda x: (x / 255.0).mean(1), torch.tensor([[255, 255, 255, 0, 128]], dtype=torch.uint8)),
    (lambda x: (x * 0.5).sum(), torch.full((3, 37), 100, dtype=torch.int16) * 9),
], ids=["int8 sum", "uint8 sum", "int32 sum", "uint8 mean", "int16 whole sum"])
def test_a_scaled_integer_sum_is_taken_in_f32(fn, x):
    want = fn(x)
    torch.testing.assert_close(cleave.compile(fn)(x), want, rtol=1e-6, atol=0)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend="cleave")(x), want, rtol=1e-6, atol=0)


def test_a_scaled_integer_sum_over_a_dynamic_row_is_taken_in_f32():
    """Checked at a small binding the wrapping candidate passed: the sums of [0, 4) draws
    fit an int8."""
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x * 0.5).sum(1), backend="cleave", dynamic=True)
    for n in (300, 41):
        x = torch.full((2, n), 100, dtype=torch.int8)
        torch.testing.assert_close(f(x), (x * 0.5).sum(1), rtol=1e-6, atol=0)


def test_a_ratio_of_halved_integers_divides_as_floats_without_a_warning():
    def f(x, y):
        return (x / 2.0) / (y / 2.0)
    x, y = torch.full((5, 7), 7), torch.full((5, 7), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no candidate left out for dividing integers
        assert torch.equal(cleave.compile(f)(x, y), f(x, y))
