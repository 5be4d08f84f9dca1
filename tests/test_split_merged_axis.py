"""A split over an axis that a reshape merged from a dynamic axis and others (rows of
`x.reshape(-1, d)`, a flattened contraction): a chunk's lanes past the merged extent
index the operand through the reshape's `// d % m`, which wraps them back onto real
elements. The load's own mask does not hold there, so the split's zero pad must: those
elements were summed twice (sum, mean, a split-K MatMul), silently."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest
import torch

import cleave
from cleave.ir import Graph
from cleave.scheduler import schedule

from backend_case import close
from backend_case import ctx  # noqa: F401 (a fixture)
from kernel_check import LOOPS, run_and_check

CASES = {
    "rows_sum": lambda x, y: x.reshape(-1, x.shape[-1]).sum(0),
    "flatten_mean": lambda x, y: x.flatten(0, 1).mean(0),
    "row_mean": lambda x, y: x.flatten(1).mean(-1),
    "split_k": lambda x, y: torch.tensordot(x, y, dims=([1, 2], [0, 1])),  # a MatMul
    "flat_dot": lambda x, y: x.reshape(x.shape[0], -1) @ y.reshape(-1),
    "rows_of_flat": lambda x, y: x.reshape(7, -1).sum(1),  # a split row's end runs into the next row
}
SIZES = ((3, 5, 7), (2, 9, 7), (4, 3, 7))  # not 1: dynamo specialises size 1


def _inputs(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen), torch.randn(shape[1:], generator=gen)


def _check(f, fn, shape, seed):
    x, y = _inputs(shape, seed)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # an eager fallback would pass
        got = f(x, y)
    close(got, fn(x.double(), y.double()).float())


@pytest.mark.parametrize("name", ["rows_sum", "flatten_mean", "split_k"])  # the others run unsplit here
def test_torch_compile_dynamic(ctx, name):
    fn = CASES[name]
    f = torch.compile(fn, backend="cleave", dynamic=True)
    for k, shape in enumerate(SIZES):
        _check(f, fn, shape, seed=k)
    st = ctx.stats()
    assert st["failed"] == 0 and st["graph_breaks"] == 0 and st["unsupported"] == [], st


@pytest.mark.parametrize("name", CASES)
def test_cleave_compile_dynamic_axis(name):
    fn = CASES[name]
    f = cleave.compile(fn, dynamic={"x": {1: "m"}, "y": {0: "m"}}, verbose=False)
    for k, m in enumerate((5, 11)):
        _check(f, fn, (3, m, 7), seed=10 + k)
    assert f.stats["graph_breaks"] == 0 and f.stats["compiles"] + f.stats["from_cache"] == 1, f.stats


def merged_split(matmul: bool) -> Graph:
    """x's rows and columns merged into one axis, split into chunks: summed, or the
    contraction of a MatMul with y's merged rows (split-K)."""
    g = Graph("merged_split_" + ("matmul" if matmul else "sum"))
    x = g.input("x", ("a", "m", "d"), "f32")
    flat = x.reshape(x.shape[0], x.shape[1] * x.shape[2])
    if matmul:
        y = g.input("y", ("m", "d", "n"), "f32").reshape(x.shape[1] * x.shape[2], "n")
        out = (flat.split(1, "s", pad=0.0).permute(1, 0, 2) @ y.split(0, "s", pad=0.0)).sum(0)
    else:
        out = flat.split(1, "s", pad=0.0).sum(-1).sum(-1)
    g.output(out, names=["out"])
    return g


@pytest.mark.parametrize("matmul", [False, True])
def test_static_extent_overhung_by_the_chunks(matmul):
    """m*d = 35 in 4 chunks of 9: the last chunk's lane 35 wraps to x[., 0, 0]."""
    g, env = merged_split(matmul), {"a": 3, "m": 5, "d": 7, "n": 3}
    (plan,) = schedule(g, env, target=LOOPS, top_k=1, split={"s": 4})
    run_and_check(g, plan, env, seed=4)
