"""Extents of 0, static or dynamic (0 only at run time): every load stays in bounds, a
reduction over nothing yields its neutral element (sum 0, max -inf, min +inf, MatMul
0), and a kernel with nothing to compute is not launched. Checked against the fp64
interpreter under TRITON_INTERPRET=1 (an out-of-bounds load crashes the interpreter),
with NaN-poisoned outputs."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest
import torch
import torch.nn.functional as F

import cleave
from cleave.runtime.operator import CompiledOperator
from cleave.scheduler import schedule
from cleave.runtime.launch import prepare
from kernel_check import LOOPS, check_outputs, run_and_check


def reduce_exp(op):
    def build(n):
        g = cleave.Graph(f"{op}_exp")
        x = g.input("x", (3, n), "f32")
        g.output(getattr(x, op)(-1, keepdim=True).exp(), names=["y"])
        return g
    return build


def matmul_silu(n):  # n is the contracted extent
    g = cleave.Graph("matmul_silu")
    x, w = g.input("x", (3, n), "f32"), g.input("w", (n, 4), "f32")
    g.output((x @ w).silu(), names=["y"])
    return g


def logsumexp(n):  # a softmax-like chain whose output survives the empty axis: -inf
    g = cleave.Graph("logsumexp")
    x = g.input("x", (3, n), "f32")
    m = x.max(-1, keepdim=True)
    g.output((x - m).exp().sum(-1, keepdim=True).log() + m, names=["y"])
    return g


def softmax_matmul(n):  # attention-like: softmax over n, then a MatMul over n (its output is 0)
    g = cleave.Graph("softmax_matmul")
    x, v = g.input("x", (3, n), "f32"), g.input("v", (n, 5), "f32")
    e = (x - x.max(-1, keepdim=True)).exp()
    g.output((e / e.sum(-1, keepdim=True)) @ v, names=["y"])
    return g


def softmax(n):  # the output itself is empty
    g = cleave.Graph("softmax")
    x = g.input("x", (n, 5), "f32")
    e = (x - x.max(-1, keepdim=True)).exp()
    g.output(e / e.sum(-1, keepdim=True), names=["y"])
    return g


def rows_and_row_sums(n):  # one kernel, two outputs: empty rows beside non-empty sums (zeros)
    g = cleave.Graph("rows_and_row_sums")
    x = g.input("x", (3, n), "f32")
    g.output(x.exp(), x.sum(-1), names=["rows", "sums"])
    return g


GRAPHS = {"sum": reduce_exp("sum"), "max": reduce_exp("max"), "min": reduce_exp("min"),
          "matmul": matmul_silu, "logsumexp": logsumexp, "softmax_matmul": softmax_matmul,
          "softmax": softmax, "rows_and_row_sums": rows_and_row_sums}


@pytest.mark.parametrize("target", [None, LOOPS], ids=["h200", "loops"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_static_extent_zero(name, target):
    graph = GRAPHS[name](0)
    plan = schedule(graph, {}, top_k=1, **({"target": target} if target else {}))[0]
    run_and_check(graph, plan, {}, seed=1)


@pytest.mark.parametrize("target", [None, LOOPS], ids=["h200", "loops"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_dynamic_extent_zero_at_run_time(name, target):
    """One plan, scheduled at n=5, serves n=0 (and still n=5 and n=37)."""
    graph = GRAPHS[name]("n")
    plan = schedule(graph, {"n": 5}, dynamic={"n"}, top_k=1, **({"target": target} if target else {}))[0]
    for n in (0, 5, 37):
        run_and_check(graph, plan, {"n": n}, seed=n)


def test_empty_output_launches_nothing():
    """No kernel is launched with an empty grid (a GPU rejects it), static or dynamic."""
    graph = softmax("b")
    x = torch.randn(0, 5)
    for plan in (schedule(softmax(0), {}, top_k=1)[0], schedule(graph, {"b": 4}, dynamic={"b"}, top_k=1)[0]):
        assert prepare(plan, {"x": x}).launches == [False]
        run_and_check(graph, plan, {"b": 0}, seed=0)


def test_a_dynamic_zero_is_ranked_where_programs_run():
    """Plans over a dynamic symbol that is 0 at the first call are ranked at 1 (at 0 every
    kernel would cost nothing), and serve other values."""
    graph = softmax("b")
    plans = schedule(graph, {"b": 0}, dynamic={"b"}, top_k=2)
    assert plans and all(p.env["b"] == 1 for p in plans)
    run_and_check(graph, plans[0], {"b": 3}, seed=3)


def sum_exp(x):
    return x.sum(-1, keepdim=True).exp()


def silu_matmul(x, w):
    return F.silu(x @ w)


def flatten_matmul(x, w):
    """A layer's projection over (batch, tokens) rows: the reshapes carry the empty axis."""
    return torch.tanh(x.reshape(-1, x.shape[-1]) @ w).reshape(x.shape[0], x.shape[1], w.shape[1])


def append_to_cache(cache, new):
    """A KV cache's first append: the empty operand was loaded at index 0 of a buffer of
    no element (a segfault under the interpreter, an illegal address on the GPU)."""
    return torch.cat([cache, new], 1) * 2


@pytest.mark.parametrize("fn, shapes", [(sum_exp, [(3, 0)]), (silu_matmul, [(3, 0), (0, 4)]),
                                        (flatten_matmul, [(2, 0, 6), (6, 4)]),
                                        (append_to_cache, [(2, 0, 4), (2, 1, 4)])])
def test_compile_static_empty_axis(monkeypatch, tmp_path, fn, shapes):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    compiled = cleave.compile(fn)
    args = [torch.randn(s) for s in shapes]
    check_outputs([compiled(*args)], [fn(*(a.double() for a in args))], fn.__name__)
    assert compiled.stats["failed"] == 0, compiled.stats


def test_compile_first_call_with_batch_zero(monkeypatch, tmp_path):
    """An empty first batch is compiled (no ZeroDivisionError in ranking), and so is
    every later batch, by the same operator."""
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    f = cleave.compile(lambda x: torch.softmax(x, -1), dynamic={"x": {0: "b"}})
    for b in (0, 3, 0, 7):
        x = torch.randn(b, 5)
        check_outputs([f(x)], [torch.softmax(x.double(), -1)], f"b={b}")
    assert f.stats["failed"] == 0 and f.stats["compiles"] == 1 and f.stats["searches"] == 1, f.stats


def test_an_empty_call_compiles_where_the_code_branched_on_size_one(monkeypatch, tmp_path):
    """`if x.shape[0] == 1:` leaves the traced graph the constraint n != 1. A call at n = 0
    is ranked where programs run, and 1 was that place: its constraint failed there and
    the call ran eagerly ("could not compile ... fails for n=1"). It is ranked at the
    least extent the constraints allow."""
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))

    def f(x):
        if x.shape[0] == 1:
            return x.sum(0)
        return x.mean(0)

    compiled = cleave.compile(f, dynamic={"x": {0: "n"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 0, 5):
            x = torch.randn(n, 4)
            torch.testing.assert_close(compiled(x), f(x), equal_nan=True)
    said = [str(w.message) for w in caught if "cleave" in str(w.message)]
    assert not said, said
    assert compiled.stats["failed"] == 0, compiled.stats


def test_operator_at_an_empty_shape_compiles_and_times_nothing(monkeypatch, tmp_path):
    """On the GPU a shape whose kernels have no programs is neither timed nor counted as
    having compiled its plan: the first non-empty shape compiles it (outside a capture)."""
    import cleave.runtime.operator as operator

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(operator, "_capturing", lambda device: False)
    op = CompiledOperator(softmax("b"), {"b"}, top_k=4)
    op.device = torch.device("cuda")  # the path that warms and times plans; kernels still run on CPU
    x = torch.randn(0, 5)
    (got,) = op({"x": x})
    assert got.shape == (0, 5) and op.stats["tunings"] == 0
    assert not op._launched  # nothing was compiled at b=0


def _rms_matmul(x, w):
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) @ w


def _row_share_sum(x, w):
    return (x / x.sum(-1, keepdim=True)).sum(-1)


@pytest.mark.parametrize("fn", [_rms_matmul, _row_share_sum])
def test_a_rewritten_scale_over_an_axis_empty_at_run_time_is_eagers(fn):
    """At k = 0 a row's scale is 0/0 = NaN and eager multiplies it into an empty row (then
    summed or contracted: 0). rowscale-after-matmul and sum-pull-div move it out of the
    reduction, NaN came back; at an empty reduced axis the graph as written serves."""
    f = cleave.compile(fn, dynamic={"x": {1: "k"}, "w": {0: "k"}}, verbose=False)
    gen = torch.Generator().manual_seed(2)
    for k in (9, 0, 5, 0):
        x, w = torch.rand(3, k, generator=gen) + 0.5, torch.randn(k, 5, generator=gen)
        torch.testing.assert_close(f(x, w), fn(x, w), equal_nan=True, rtol=1e-5, atol=1e-5)
    assert f.stats["graph_breaks"] == 0 and f.stats["failed"] == 0, f.stats


def test_a_size_divided_by_that_is_zero_at_run_time_is_eagers():
    """`(y / x.shape[0]).sum(-1)`: sum-pull-div takes the size as non-zero, but x's axis
    is reduced by nothing, so at x.shape[0] = 0 the rewrite served sum(y) / 0 = inf
    where eager's sum of [0/0, 1/0] is NaN."""
    def share(x, y):
        return (y / x.shape[0]).sum(-1)

    f = cleave.compile(share, dynamic="all", verbose=False)
    y = torch.tensor([[0.0, 1.0], [1.0, 2.0]])
    for n in (3, 0, 4, 0):
        x = torch.randn(n, 3)
        torch.testing.assert_close(f(x, y), share(x, y), equal_nan=True)
    assert f.stats["graph_breaks"] == 0 and f.stats["failed"] == 0, f.stats


def test_cat_of_only_legacy_empty_vectors_and_cummax_of_no_rows():
    """torch skips a (0,) operand of cat; with every operand such, the rule indexed an
    empty list (IndexError), and cummax of an int64 tensor with no rows made the
    reference interpreter fill an empty max with -inf as an int (both ran eagerly)."""
    def cat_empty(z, w):
        return torch.cat([z, w]), z * 2

    def cummax_rows(x):
        return torch.cummax(x, 0)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z, w = torch.randn(0), torch.randn(0)
        for got, want in zip(cleave.compile(cat_empty, verbose=False)(z, w), cat_empty(z, w)):
            assert got.shape == want.shape and got.dtype == want.dtype
        x = torch.zeros(0, 6, dtype=torch.int64)
        for got, want in zip(torch.compile(cummax_rows, backend="cleave", dynamic=True)(x), cummax_rows(x)):
            assert got.shape == want.shape and got.dtype == want.dtype


def test_a_rewritten_candidates_plans_refuse_an_empty_reduction(tmp_path):
    """`rmax(sigmoid(x), a) => sigmoid(rmax(x, a))` holds except over an empty axis (a max
    over nothing is -inf, and sigmoid(-inf) = 0): its plan launched at n = 0 gave 0 where
    the graph gives -inf. The runtime serves such a call with the graph as written; a
    plan of a rewritten candidate now says so instead of answering."""
    from cleave.runtime.launch import launch

    rules = tmp_path / "e.rules"
    rules.write_text("family probe phase rewrite\n\nrule sigmoid-max: rmax(sigmoid(x), a) => sigmoid(rmax(x, a))\n"
                     "  why: a probe's rule, false over an empty axis only\n")
    g = cleave.Graph("sigmax")
    g.output(g.input("x", ("m", "n"), "f32").sigmoid().max(-1), names=["o"])
    found = cleave.search(g, top_k=3, rules=[str(rules)], progress=False).candidates
    rewritten = next(c for c in found if "sigmoid-max" in c.derivation)
    plan = cleave.schedule(rewritten, {"m": 2, "n": 3}, dynamic={"m", "n"})[0]
    x = torch.randn(2, 5)
    torch.testing.assert_close(launch(plan, {"x": x})[0], x.sigmoid().amax(-1))
    with pytest.raises(cleave.ir.BindingError, match=r"1 <= n \(from a rewritten candidate's reductions"):
        launch(plan, {"x": torch.randn(2, 0)})
    as_written = cleave.schedule(g, {"m": 2, "n": 3}, dynamic={"m", "n"})[0]
    assert torch.equal(launch(as_written, {"x": torch.randn(2, 0)})[0], torch.full((2,), -float("inf")))


@pytest.mark.parametrize("fn", [lambda x: torch.einsum("ij,kj->ik", x, x),
                                lambda x: (x.reshape(x.shape[0], 7, 1).transpose(1, 2) @ x.reshape(-1, 7, 1)).sum(0)])
def test_values_of_no_elements_through_reshapes_compile(fn):
    """einsum's bmm of a static (0, 7) x through the backend reshapes [0, 7, 1] into
    [1, 0, 7], which maps no tile labels: "no tiling fits", and the frame ran eagerly
    with the scheduler's internal error as its warning."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="cleave", dynamic=False)
    x = torch.randn(0, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = compiled(x)
    torch.testing.assert_close(got, fn(x))
