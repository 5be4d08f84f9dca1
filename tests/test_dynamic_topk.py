"""topk keeps the whole reduced axis in one tile. Over an axis of dynamic extent that
tile was sized at the binding the operator was scheduled for, and a longer axis lost
its elements past it: a silent wrong answer. There topk is now a graph break: it runs
eagerly with a warning that names it and why, and what the function does around it
compiles (the whole function ran eagerly: a MoE router whose weights are an argument
under dynamic=True); over a static axis it still compiles. argmax and argmin (a
top-1 before) are a min over the indices that hit the extreme, two reductions that
tile in a loop: over a dynamic axis they compile, exact, NaN and ties as torch."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest
import torch

import cleave
from kernel_check import assert_one_exact_compile


def top2(x):
    return torch.topk(x, 2, dim=-1).values * 2.0


def top1(x):
    return torch.topk(x, 1, dim=0).values


def extremes(x):
    return torch.argmax(x, dim=0), torch.argmin(x, dim=0), x.max(0).indices


@pytest.mark.parametrize("fn, axis", [(top2, 1), (top1, 0)])
def test_topk_over_a_dynamic_axis_runs_eagerly_and_exactly(fn, axis):
    f = cleave.compile(fn, dynamic={"x": {axis: "n"}}, verbose=False)
    gen = torch.Generator().manual_seed(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (5, 40, 300):
            shape = [3, 3]
            shape[axis] = n
            x = torch.randn(*shape, generator=gen)
            assert torch.equal(f(x), fn(x)), n
    said = [str(w.message) for w in caught if "cleave" in str(w.message)]
    assert len(said) == 1 and "aten.topk.default" in said[0] and "over an axis of dynamic size" in said[0], said


def router(x, w):
    p, e = (x @ w).softmax(-1).topk(2, -1)
    return p.sum(-1) * 2, e


def test_around_a_topk_over_a_dynamic_axis_the_function_compiles():
    from cleave.runtime import backend

    torch._dynamo.reset()
    backend.reset()
    f = torch.compile(router, backend="cleave", dynamic=True)
    gen = torch.Generator().manual_seed(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (5, 9):
            x, w = torch.randn(n, 8, generator=gen), torch.randn(8, 4 + n, generator=gen)
            got, want = f(x, w), router(x, w)
            torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
            assert torch.equal(got[1], want[1])
    ctx = backend.context()
    assert ctx.operators and sum(op.stats["calls"] for op in ctx.operators.values()) >= 2


def test_topk_over_a_static_axis_with_dynamic_rows_compiles():
    f = cleave.compile(top2, dynamic={"x": {0: "n"}}, verbose=False)
    gen = torch.Generator().manual_seed(6)
    assert_one_exact_compile(f, top2, [(torch.randn(n, 37, generator=gen),) for n in (5, 17)])


def test_argmax_over_a_dynamic_axis_compiles_exactly():
    f = cleave.compile(extremes, dynamic={"x": {0: "n"}}, verbose=False)
    gen = torch.Generator().manual_seed(7)
    for n in (5, 300, 1):
        x = torch.randint(-3, 4, (n, 6), generator=gen).float()  # ties: the first index wins
        x[n // 2, 1] = float("nan")  # a NaN wins, the first one
        x[:, 2] = float("-inf")
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="cleave")  # an eager fallback warns
            for got, want in zip(f(x), extremes(x)):
                assert torch.equal(got, want), n
    assert f.stats["failed"] == 0 and f.stats["graph_breaks"] == 0, f.stats


def test_argmax_over_an_axis_empty_at_run_time_raises_eagers_error():
    """Eager rejects argmax over nothing; the compiled operator's graph requires index 0
    (a top-1's k <= n did before), so no plan serves n = 0 and eager's IndexError is raised,
    not an index past the axis."""
    f = cleave.compile(extremes, dynamic={"x": {0: "n"}}, verbose=False)
    f(torch.randn(5, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback says why it runs eagerly
        with pytest.raises(IndexError, match="non-zero size"):
            f(torch.randn(0, 6))


@pytest.mark.parametrize("x", [torch.tensor([[9, 0, 255, 3, 7]], dtype=torch.uint8),
                               torch.tensor([[5, -128, 3, 127, -1]], dtype=torch.int8),
                               torch.tensor([[5, -2**31, 3, 2**31 - 1, -1]], dtype=torch.int32),
                               torch.tensor([[5, -2**63, 3, 2**63 - 1, -1]])],
                         ids=["u8", "i8", "i32", "i64"])
def test_the_smallest_integers_include_the_types_extremes(x):
    """The smallest k were the largest of -x, which wraps: uint8's 0 and int8's -128 are
    their own negation, so they ranked as the largest and were left out."""
    def smallest(x):
        return torch.topk(x, 2, dim=1, largest=False)

    want = smallest(x)
    for f in (cleave.compile(smallest, verbose=False), torch.compile(smallest, backend="cleave")):
        got = f(x)
        assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices), (got, want)
