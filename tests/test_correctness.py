"""Regressions of programs that cleave once ran silently wrong, or crashed on: aliased
arguments, in-place ops, narrowing casts, modules, varargs, eager's own errors,
progress output and a cache that cannot be written. Each runs the real pipeline
(capture -> search -> scheduler -> Triton under TRITON_INTERPRET=1) on tiny shapes
and compares with eager PyTorch."""
from __future__ import annotations

import logging
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cleave
from cleave.interpreter import interpret
from cleave.ir import Graph
from cleave.search import CandidateMismatch, check_candidate, search


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen(seed)).to(dtype)


def _close(got, want, tol=1e-5):
    assert got.shape == want.shape and got.dtype == want.dtype
    if not want.numel():
        return
    err = (got.double() - want.double()).abs().max().item() / max(want.double().abs().max().item(), 1e-30)
    assert err <= tol, f"max error {err:.2e} over max |reference| (tolerance {tol:.0e})"


# -- aliased arguments ----------------------------------------------------------
def scale_by_exp(a, b):
    return a * b.exp()


def test_aliased_first_call_keeps_parameters_distinct():
    f = cleave.compile(scale_by_exp)
    x = _randn(5, 7, seed=0)
    _close(f(x, x), scale_by_exp(x, x))
    a, b = _randn(5, 7, seed=1), _randn(5, 7, seed=2)
    _close(f(a, b), scale_by_exp(a, b))
    assert f.stats["failed"] == 0 and f.stats["graph_breaks"] == 0
    (op,) = f.operators
    assert set(op.graph.inputs) == {"a", "b"}


def attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def test_sdpa_called_with_one_tensor_first():
    f = cleave.compile(attention)
    q = _randn(1, 2, 5, 16, seed=3)
    _close(f(q, q, q), attention(q, q, q), 1e-4)
    q, k, v = (_randn(1, 2, 5, 16, seed=s) for s in (4, 5, 6))
    _close(f(q, k, v), attention(q, k, v), 1e-4)


def test_aliased_first_call_through_the_torch_compile_backend():
    torch._dynamo.reset()
    f = torch.compile(scale_by_exp, backend="cleave")
    x = _randn(4, 6, seed=7)
    _close(f(x, x), scale_by_exp(x, x))
    a, b = _randn(4, 6, seed=8), _randn(4, 6, seed=9)
    _close(f(a, b), scale_by_exp(a, b))


# -- in-place ops ---------------------------------------------------------------
def double_then_exp(x):
    x.mul_(2)
    return x.exp()


def accumulate(x, y):
    x.add_(y)
    return x.sum(-1)


def test_in_place_op_on_an_input_matches_eager_output_and_mutation():
    f = cleave.compile(double_then_exp)
    for seed in (10, 11):  # the second call takes the prepared (hot) path
        x = _randn(3, 5, seed=seed)
        mine, theirs = x.clone(), x.clone()
        _close(f(mine), double_then_exp(theirs))
        _close(mine, theirs)
    assert f.stats["failed"] == 0 and f.stats["graph_breaks"] == 0


def test_in_place_op_with_aliased_inputs_runs_eagerly():
    f = cleave.compile(accumulate)
    x, y = _randn(3, 5, seed=12), _randn(3, 5, seed=13)
    mine, theirs = x.clone(), x.clone()
    _close(f(mine, y), accumulate(theirs, y))
    _close(mine, theirs)
    with pytest.warns(UserWarning, match="changes an input in place and its inputs share memory"):
        got = f(mine, mine)
    _close(got, accumulate(theirs, theirs))
    _close(mine, theirs)


def zero_after_reading(x, y):
    z = x + 1
    x.zero_()  # runs through dynamo's graphs (torch.export does not take zero_ whole)
    return z * y


def test_an_argument_changed_in_place_through_dynamo_runs_eagerly_once_arguments_overlap():
    """Called with arguments apart first, then with y one row into x's storage: dynamo's
    graphs, traced apart, read y's old rows (5.5 off, no warning)."""
    f = cleave.compile(zero_after_reading)
    f(_randn(5, 7, seed=14), _randn(5, 7, seed=15))
    base = _randn(6, 7, seed=16)
    mine, theirs = base.clone(), base.clone()
    with pytest.warns(UserWarning, match="it changes an argument in place and its arguments share memory"):
        got = f(mine[:5], mine[1:])
    _close(got, zero_after_reading(theirs[:5], theirs[1:]))
    _close(mine, theirs)


def views_of_the_input(x):
    return x.t(), x[1], x * 2


def doubled_in_place(x):
    x.mul_(2)
    return x, x.exp()


@pytest.mark.parametrize("fn", [views_of_the_input, doubled_in_place])
def test_outputs_eager_gives_as_views_of_an_input_alias_it(fn):
    """A kernel's result is a new tensor; eager returns these outputs as views of the
    input (or the input itself after an in-place op), so writing to one writes the input.
    They were copies; such functions now run through dynamo's graphs, which regenerate
    the views, with the rest compiled."""
    f = cleave.compile(fn)
    for seed in (18, 19):  # the second call takes the path the first one chose
        x = _randn(4, 3, seed=seed)
        theirs = x.clone()
        got, want = f(x), fn(theirs)
        _close(x, theirs)
        for g, w in zip(got, want):
            _close(g, w)
        first = got[0]
        assert first.data_ptr() == x.data_ptr() and first.shape == want[0].shape
        first.add_(100)  # a write through the output reaches the input, as in eager
        want[0].add_(100)
        _close(x, theirs)
    assert f.stats["failed"] == 0 and f.stats["operators"] >= 1, f.stats
    assert "view" in f.capture_error
    with pytest.raises(cleave.CleaveError, match="are views of an input"):  # no artifact for it
        cleave.compile(fn).prepare(torch.empty(4, 3, device="meta"))


# -- narrowing casts ------------------------------------------------------------
def round_trip(x):
    return x.to(torch.bfloat16).float() * 3.0


def test_cast_round_trip_rounds_like_eager():
    f = cleave.compile(round_trip)
    x = _randn(5, 7, seed=14)
    assert torch.equal(f(x), round_trip(x))
    (op,) = f.operators
    assert any(n.op == "cast" and str(n.dtype) == "bf16" for n in op.specs[next(iter(op.specs))].candidate.graph.live_nodes())


def _round_trip_graph(keep_cast: bool) -> Graph:
    g = Graph("round_trip")
    x = g.input("x", ("n", 7), "f32")
    y = x.cast("bf16").cast("f32") if keep_cast else x
    g.output(y * 3.0, names=["out"])
    return g


def test_reference_interpreter_rounds_at_a_narrowing_cast_in_fp64():
    x = _randn(5, 7, seed=15).double()
    (got,) = interpret(_round_trip_graph(True), {"x": x}, compute_dtype=torch.float64)
    assert torch.equal(got, x.to(torch.bfloat16).double() * 3.0)
    assert not torch.equal(got, x * 3.0)


def test_candidate_check_rejects_a_deleted_narrowing_cast():
    with pytest.raises(CandidateMismatch):
        check_candidate(_round_trip_graph(True), _round_trip_graph(False))


def test_search_keeps_a_narrowing_cast():
    result = search(_round_trip_graph(True), top_k=3, progress=False)
    for cand in result.candidates:
        assert [str(n.dtype) for n in cand.graph.live_nodes() if n.op == "cast"][:1] == ["bf16"]


def root_and_log(y):
    return torch.rsqrt(y) * torch.log(y).sum(-1, keepdim=True)


def test_ops_defined_on_positive_values_compile():
    # the candidate check's normal inputs give NaN here on both graphs: NaN must match NaN
    f = cleave.compile(root_and_log, dynamic={"y": {1: "n"}})
    y = torch.rand(5, 3, generator=_gen(31)) + 0.5
    _close(f(y), root_and_log(y))
    assert f.stats["failed"] == 0


def widen_then_narrow(x):
    return torch.exp(x.float().to(torch.bfloat16))


def test_a_bf16_input_widened_then_narrowed_compiles():
    # the candidate check's inputs hold bf16 values where the graph's inputs are bf16
    f = cleave.compile(widen_then_narrow)
    x = _randn(3, 7, seed=32, dtype=torch.bfloat16)
    _close(f(x), widen_then_narrow(x), 1e-2)
    assert f.stats["failed"] == 0


# -- strided slices -------------------------------------------------------------
def every_other_column(x):
    return torch.tanh(torch.exp(x)[:, ::2]).sum(-1)


def strided_window(x):
    return (x[1::3, 2:7:2] * 2).exp()


@pytest.mark.parametrize("fn, sizes", [(every_other_column, (3, 5, 0, 3)), (strided_window, (10, 11, 12, 1))])
def test_strided_slices_compile(fn, sizes):
    f = cleave.compile(fn, dynamic={"x": {0: "n"}})
    for n in sizes:
        x = _randn(n, 9, seed=40 + n)
        _close(f(x), fn(x))
    assert f.stats["failed"] == 0 and f.stats["graph_breaks"] == 0 and f.stats["operators"] == 1


def test_a_strided_slice_has_pythons_length():
    g = Graph("strided")
    x = g.input("x", ("n", 9), "f32")
    g.output(x[1::3, 2:7:2], names=["out"])
    for n in (0, 1, 4, 10, 11, 12):
        t = _randn(n, 9, seed=n).double()
        (got,) = interpret(g, {"x": t})
        assert torch.equal(got, t[1::3, 2:7:2])


# -- modules, autograd ----------------------------------------------------------
def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.SiLU())


def test_module_reads_its_parameters_at_each_call():
    m = _mlp()
    f = cleave.compile(m)
    x = _randn(3, 5, seed=16)
    with torch.no_grad():
        _close(f(x), m(x))
        m[0].weight.mul_(2)  # an optimizer step between calls
        _close(f(x), m(x))
    assert f.stats["failed"] == 0 and f.stats["operators"] == 1


def test_parameters_that_require_grad_run_eagerly_with_a_backward():
    m = _mlp()
    f = cleave.compile(m)
    x = _randn(3, 5, seed=17)
    with pytest.warns(UserWarning, match="require grad"):
        y = f(x)
    assert y.grad_fn is not None
    y.sum().backward()
    want = m[0].weight.grad.clone()
    m.zero_grad()
    m(x).sum().backward()
    _close(want, m[0].weight.grad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        f(x)


# -- calling conventions --------------------------------------------------------
def product(*a):
    return a[0] * a[1] + a[2]


def test_varargs():
    f = cleave.compile(product, dynamic={"a_0": {0: "n"}, "a_1": {0: "n"}, "a_2": {0: "n"}})
    for n in (3, 5):
        args = [_randn(n, 4, seed=18 + i) for i in range(3)]
        _close(f(*args), product(*args))
    assert f.stats["failed"] == 0 and f.stats["searches"] <= 1


def scaled(x, y):
    return x * 2 + y


def test_keyword_arguments():
    f = cleave.compile(scaled)
    x, y = _randn(3, 4, seed=21), _randn(3, 4, seed=22)
    _close(f(x, y=y), scaled(x, y))
    _close(f(y=y, x=x), scaled(x, y))


# -- errors eager raises ----------------------------------------------------------
def project(x, w):
    return x @ w


def test_shape_error_is_eagers_one_message(capfd):
    f = cleave.compile(project)
    with pytest.raises(RuntimeError, match=r"3x5 and 4x4"):
        f(_randn(3, 5, seed=23), _randn(4, 4, seed=24))
    assert "fake_tensor" not in capfd.readouterr().err
    _close(f(_randn(3, 5, seed=25), _randn(5, 4, seed=26)), project(_randn(3, 5, seed=25), _randn(5, 4, seed=26)))


def test_mixed_dtype_matmul_is_rejected_like_eager():
    f = cleave.compile(project)
    with pytest.raises(RuntimeError, match="same dtype"):
        f(_randn(3, 5, seed=27), _randn(5, 4, seed=28, dtype=torch.bfloat16))


# -- progress output --------------------------------------------------------------
def softplus_ish(x):
    return (x.exp() + 1.0).log()


def test_verbose_false_is_silent_and_true_overrides_the_logger(capfd):
    x = _randn(4, 9, seed=29)
    cleave.compile(softplus_ish, verbose=False)(x)
    assert "[cleave" not in capfd.readouterr().err
    logger = logging.getLogger("cleave")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        cleave.compile(softplus_ish, dynamic={"x": {0: "n"}})(x)  # a new operator: it searches
        assert "[cleave" not in capfd.readouterr().err
        cleave.compile(softplus_ish, dynamic={"x": {1: "m"}}, verbose=True)(x)
        assert "[cleave search]" in capfd.readouterr().err
    finally:
        logger.setLevel(level)


def test_cold_rule_proofs_are_announced(tmp_path, monkeypatch, capfd):
    from cleave.rules import parse_rules
    from cleave.verify import sound_rules

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    (rule,) = parse_rules("family algebra\nrule announce-me: mul(x, y) => mul(y, x)\n  why: a test rule\n")
    sound_rules([rule])
    assert "proving 1 rewrite rule(s)" in capfd.readouterr().err
    sound_rules([rule])
    assert "proving" not in capfd.readouterr().err


# -- a cache that cannot be written -------------------------------------------------
def test_unwritable_cache_compiles_in_memory(monkeypatch):
    from cleave.runtime import artifact, operator

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(artifact, "write_json", refuse)
    monkeypatch.setattr(artifact, "save_spec", refuse)
    monkeypatch.setattr(operator, "_UNWRITTEN", set())  # said once per directory and process
    f = cleave.compile(lambda x: x.sigmoid() * x.sum(-1, keepdim=True))
    x = _randn(3, 6, seed=30)
    with pytest.warns(UserWarning, match="cannot write"):
        got = f(x)
    _close(got, x.sigmoid() * x.sum(-1, keepdim=True))
    assert f.stats["failed"] == 0
