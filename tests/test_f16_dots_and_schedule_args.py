"""Two defects of probe 27.

An f32 MatMul against an upcast fp16 operand (`p @ v.float()`, the P·V of a paged decode
with fp16 caches) split the f32 side into two bf16 halves and dotted them against the
fp16 tile: Triton refuses operands of two types, the first launch failed and the
operator ran eagerly. At "highest" it is now an f32 (ieee) dot, at "medium" both sides
are rounded to bf16 once, as torch does.

cleave.schedule took top_k 0 (an empty list), negative extents (plans), strings (a
TypeError deep in tiling) and unknown dynamic symbols (ignored): each is now a
ValueError naming the argument, as cleave.search and cleave.compile say it."""
from __future__ import annotations

import os
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

import cleave
from cleave import workloads as W
from kernel_check import check_outputs
from test_combine_in_kernel import split_k

# -- d02: an fp16 operand beside an f32 one ------------------------------------------


def upcast_product(a, v):
    return a.float() @ v.float()


# both sides of the contraction, and the rows, change between calls
DYNAMIC = {"a": {0: "m", 1: "n"}, "v": {0: "n"}}
SIZES = ((37, 45, 29), (20, 70, 29))


def _calls(a_dtype, seed):
    """upcast_product compiled once, then called at each of SIZES: [(inputs, output)]."""
    gen = torch.Generator().manual_seed(seed)
    f = cleave.compile(upcast_product, dynamic=DYNAMIC, verbose=False)
    calls = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m, n, d in SIZES:
            a = torch.rand(m, n, generator=gen).to(a_dtype)
            v = torch.randn(n, d, generator=gen).half()
            calls.append(((a, v), f(a, v)))
    eager = [str(w.message) for w in caught if "could not compile" in str(w.message)
             or "eagerly" in str(w.message)]
    assert eager == [] and f.stats["failed"] == 0, eager
    return calls


@pytest.mark.parametrize("a_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_an_f32_product_with_upcast_fp16_compiles_at_f32_accuracy(a_dtype):
    for (a, v), got in _calls(a_dtype, seed=1):
        check_outputs([got], [a.double() @ v.double()], "a.float() @ v.float()")


@pytest.mark.parametrize("a_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_medium_rounds_the_upcast_fp16_operand_to_bf16_too(a_dtype):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        calls = _calls(a_dtype, seed=2)
    finally:
        torch.set_float32_matmul_precision(before)
    for (a, v), got in calls:
        rounded = a.bfloat16().double() @ v.bfloat16().double()
        assert torch.allclose(got.double(), rounded, rtol=1e-5, atol=1e-5)


# -- d04: cleave.schedule's arguments ------------------------------------------------


MATMUL = {"s": 64, "k": 32, "n": 48}


@pytest.mark.parametrize("top_k", [0, -1, "3", 2.0, True, None])
def test_schedule_refuses_a_bad_top_k(top_k):
    with pytest.raises(ValueError, match=f"top_k must be a positive integer, got {top_k!r}"):
        cleave.schedule(W.get("matmul").graph, MATMUL, top_k=top_k)


@pytest.mark.parametrize("extent", [-4, "64", 64.0, False, None])
def test_schedule_refuses_a_bad_extent(extent):
    with pytest.raises(ValueError, match=rf"shapes\['k'\] must be an integer >= 0, got {extent!r}"):
        cleave.schedule(W.get("matmul").graph, {**MATMUL, "k": extent}, dynamic={"s"})


def test_schedule_refuses_shapes_that_are_not_a_dict():
    with pytest.raises(ValueError, match="shapes must be a dict"):
        cleave.schedule(W.get("matmul").graph, [64, 32, 48])


def test_schedule_names_an_unknown_dynamic_symbol_and_the_known_ones():
    known = r"which is not one of the graph's symbols or names in shapes \(k, n, s\)"
    with pytest.raises(ValueError, match=f"dynamic names 'zz', {known}"):
        cleave.schedule(W.get("matmul").graph, MATMUL, dynamic={"s", "zz"})


@pytest.mark.parametrize("dynamic", ["s", 3])
def test_schedule_refuses_dynamic_that_is_not_a_collection_of_names(dynamic):
    with pytest.raises(ValueError, match="dynamic must be a collection of symbol names"):
        cleave.schedule(W.get("matmul").graph, MATMUL, dynamic=dynamic)


@pytest.mark.parametrize("split, message", [
    ({"q": 2}, r"split names 'q', which is not one of the graph's split counts \(s\)"),
    ({"s": 0}, r"split\['s'\] must be a positive integer, got 0"),
    ({"s": "2"}, r"split\['s'\] must be a positive integer, got '2'"),
    ([("s", 2)], "split must be a dict"),
])
def test_schedule_refuses_a_bad_split(split, message):
    with pytest.raises(ValueError, match=message):
        cleave.schedule(split_k(), {"m": 64, "k": 64, "n": 32}, split=split)


def test_schedule_still_takes_numpy_integers_an_empty_dynamic_extent_and_a_bound_name():
    """A name bound in shapes may be dynamic though the graph has no such symbol: a
    FlashInfer binding's len_indptr is batch_size + 1 in the graph."""
    shapes = {"s": 0, "k": np.int64(32), "n": 48, "len_s": 1}
    plans = cleave.schedule(W.get("matmul").graph, shapes, dynamic=["s", "len_s"], top_k=np.int32(2))
    assert len(plans) >= 1
