"""Calls that eager PyTorch rejects raise eager's error, never values. torch's meta
functions let several through that its kernels refuse (a bool subtraction under
dynamic shapes, softmax or gelu of integers, argmax of bools, softmax over a dim past
the rank, an int past a narrow type's range in clamp or masked_fill): cleave compiled
them and returned values computed in the integer type, over another axis, or with the
number wrapped into the type."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import cleave
from cleave.ir import Graph
from cleave.runtime.operator import CompiledOperator, CompileFailure

from backend_case import ctx  # noqa: F401 (a fixture)

INTS = torch.tensor([[1, 2, -3], [3, 4, 0]])
BYTES = torch.tensor([1, 50, 250], dtype=torch.uint8)


def _eager_error(fn, *args):
    with pytest.raises(Exception) as caught:
        fn(*args)
    return type(caught.value)


def _raises_as_eager(fn, *args):
    """cleave.compile and torch.compile(dynamic=True) both raise the error eager raises."""
    error = _eager_error(fn, *args)
    for compiled in (cleave.compile(fn), torch.compile(fn, backend="cleave", dynamic=True)):
        with pytest.raises(error):
            compiled(*args)


def test_a_bool_subtraction_under_dynamic_shapes_raises_eagers_error(ctx):
    f = torch.compile(lambda a, b: a - b, backend="cleave", dynamic=True)
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with two bool tensors"):
        f(torch.tensor([True, False, True]), torch.tensor([True, True, False]))


MASK = torch.tensor([True, False, True])


@pytest.mark.parametrize("fn", [lambda a: a - 0.5, lambda a: torch.rsub(a, 1), lambda a: 1 - a,
                                lambda a: a - MASK, lambda a: a.float() - MASK],
                         ids=["bool - number", "rsub", "number - bool", "bool - bool", "float - bool"])
def test_a_subtraction_with_a_bool_operand_raises_eagers_error(ctx, fn):
    """Static shapes too: the kernels computed mask - 0.5 as -0.5 and 0.5."""
    _raises_as_eager(fn, MASK.clone())


def test_an_error_the_interpreter_meets_first_is_raised_unchained():
    """topk of bools: the reference interpreter meets torch's error first; eager's error
    came back chained to cleave's CompileFailure ("During handling of ...")."""
    for compiled in (cleave.compile(lambda x: x.topk(3, -1).values),
                     torch.compile(lambda x: x.topk(3, -1).values, backend="cleave")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(RuntimeError, match="topk does not support bool") as caught:
                compiled(torch.rand(3, 7) > 0.5)
        assert caught.value.__context__ is None and caught.value.__cause__ is None


def test_an_operator_whose_graph_fails_in_the_interpreter_is_not_built():
    g = Graph("bool_sub")
    a, b = g.input("a", ("n",), "bool"), g.input("b", ("n",), "bool")
    g.output(g.add("sub", a, b), names=["out"])
    op = CompiledOperator(g, {"n"})
    with pytest.raises(CompileFailure, match="with two bool tensors is not supported"):
        op({"a": torch.tensor([True, False]), "b": torch.tensor([True, True])})


@pytest.mark.parametrize("fn", [lambda x: torch.softmax(x, -1), lambda x: torch.log_softmax(x, 0),
                                lambda x: torch.logcumsumexp(x, 1), F.gelu, F.silu,
                                lambda x: (x > 0).argmax(-1), lambda x: (x > 0).argmin(),
                                F.softplus, F.mish, F.hardswish, F.hardsigmoid],
                         ids=["softmax", "log_softmax", "logcumsumexp", "gelu", "silu", "argmax_bool", "argmin_bool",
                              "softplus", "mish", "hardswish", "hardsigmoid"])
def test_float_only_functions_of_integers_raise_eagers_error(ctx, fn):
    _raises_as_eager(fn, INTS)


@pytest.mark.parametrize("fn, args", [
    (torch.relu, (INTS > 0,)),
    (lambda x, y: torch.lerp(x, y, 0.5), (INTS, INTS + 1)),
    (lambda x: torch.cumsum(x, 1, dtype=torch.bool), (INTS,)),
    (lambda x, y: torch.addcdiv(x, y, y), (INTS > 0, INTS < 3))],
    ids=["relu_bool", "lerp_ints", "cumsum_into_bool", "addcdiv_bools"])
def test_dtypes_torch_refuses_raise_eagers_error(ctx, fn, args):
    """relu and cumsum have rules that computed them anyway; lerp and addcdiv decompose
    into float arithmetic that runs (the probe of torch's kernel took the tensors alone,
    and lerp needs its weight)."""
    _raises_as_eager(fn, *args)


def test_softmax_of_integers_cast_by_its_dtype_argument_still_compiles(ctx):
    fn = lambda x: torch.softmax(x, -1, dtype=torch.float32)  # noqa: E731
    torch.testing.assert_close(cleave.compile(fn)(INTS), fn(INTS))


@pytest.mark.parametrize("fn", [lambda x: (x > 0).any(1), lambda x: (x > 0).all(2, keepdim=True),
                                lambda x: torch.count_nonzero(x, dim=1), lambda x: torch.aminmax(x, dim=2).max],
                         ids=["any", "all", "count_nonzero", "aminmax"])
def test_integer_and_bool_reductions_along_a_later_axis_compile(ctx, fn):
    """The probe of torch's kernel for a refused dtype ran the op on one-element vectors
    with the call's own dim: dim 1 raised IndexError from the probe, and the whole
    function ran eagerly ("lowering it through AOTAutograd failed")."""
    x = torch.tensor([[[1, 0, -3], [0, 0, 2]], [[0, 0, 0], [5, 1, 0]]])
    compiled = cleave.compile(fn)
    torch.testing.assert_close(compiled(x), fn(x))
    assert compiled.stats["searches"] == 1


@pytest.mark.parametrize("x", [INTS, INTS.to(torch.uint8), INTS > 0], ids=["int64", "uint8", "bool"])
def test_logsumexp_of_integers_and_bools_computes_in_floats(ctx, x):
    fn = lambda x: torch.logsumexp(x, 1)  # noqa: E731
    want = fn(x)
    for compiled in (cleave.compile(fn), torch.compile(fn, backend="cleave", dynamic=True)):
        got = compiled(x)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("fn", [lambda a: a.clamp(max=300), lambda a: a.to(torch.int8).clamp(min=-129),
                                lambda a: a.masked_fill(a > 3, 300), lambda a: a.masked_fill(a > 3, -256),
                                lambda a: torch.full_like(a, 300), lambda a: torch.where(a > 3, a, 300),
                                lambda a: a.half().masked_fill(a > 3, -1e9),
                                lambda a: a.scatter(0, torch.tensor([1]), 300),
                                lambda a: a.index_fill(0, torch.tensor([1]), 300),
                                lambda a: a.half().index_fill(0, torch.tensor([1]), 1e5),
                                lambda a: a.masked_fill(a > 3, torch.tensor(300)),
                                lambda a: F.pad(a, (1, 1), value=300), lambda a: F.pad(a.half(), (1, 0), value=-1e5)],
                         ids=["clamp", "clamp_i8", "masked_fill", "masked_fill_neg", "full_like", "where",
                              "masked_fill_f16", "scatter", "index_fill", "index_fill_f16", "masked_fill_tensor",
                              "pad", "pad_f16"])
def test_a_number_past_the_tensors_range_raises_eagers_error(ctx, fn):
    _raises_as_eager(fn, BYTES)


def test_numbers_torch_wraps_or_converts_still_compile(ctx):
    """+ and == wrap an int into the type, masked_fill takes -1 as 255 in uint8 and
    truncates 2.5, clamp by a float promotes: as torch computes them. A tensor value of
    the tensor's own dtype and a number in range are compiled."""
    def fn(a):
        return (a + 300, a == 300, a.masked_fill(a > 3, -1), a.masked_fill(a > 3, 2.5), a.clamp(max=300.0),
                a.masked_fill(a > 3, torch.tensor(7, dtype=torch.uint8)), F.pad(a, (1, 1), value=9))

    for got, want in zip(cleave.compile(fn)(BYTES), fn(BYTES)):
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


@pytest.mark.parametrize("fn, dtype, fits, past", [
    (lambda a, n: a.masked_fill(a > 0, n), torch.int8, 100, 300),
    (lambda a, n: a.clamp(max=n), torch.uint8, 200, 300),
    (lambda a, n: torch.where(a > 0, a, n), torch.int32, 5, 2 ** 31),
    (lambda a, n: torch.full_like(a, n), torch.int16, -7, -40000),
    (lambda a, n: a.masked_fill(a > 0, n), torch.float16, 60000, 70000)],
    ids=["masked_fill_i8", "clamp_u8", "where_i32", "full_like_i16", "masked_fill_f16"])
def test_an_int_argument_past_the_tensors_range_raises_eagers_error(ctx, fn, dtype, fits, past):
    """An int argument that dynamo made symbolic is converted with torch's overflow check
    too: a fill of 300 into int8 wrapped to 44 under dynamic=True, where eager raises.
    Before and after such a call, ints in range compile and are exact."""
    a = torch.tensor([3, -2, 0, 1, 5]).to(dtype)
    error = _eager_error(fn, a, past)
    for compiled in (cleave.compile(fn), torch.compile(fn, backend="cleave", dynamic=True)):
        for n in (fits, fits - 1):
            assert torch.equal(compiled(a, n), fn(a, n))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(error, match="without overflow"):
                compiled(a, past)
        assert torch.equal(compiled(a, fits - 2), fn(a, fits - 2))


def _scaled_in_place(x):
    x *= 2.5
    return x + 1


@pytest.mark.parametrize("fn", [lambda x: x.mul_(2.5) + 1, lambda x: x.add_(torch.ones(3)) * 2,
                                lambda x: x.div_(2) - 1, _scaled_in_place],
                         ids=["mul_float", "add_float_tensor", "div_", "augmented"])
def test_an_in_place_write_its_tensor_cannot_hold_raises_eagers_error(ctx, fn):
    """An int64 tensor's mul_(2.5) raises eagerly; functionalized, it wrote the truncated
    product and returned values."""
    x = torch.arange(6).view(2, 3)
    error = _eager_error(fn, x.clone())
    with pytest.raises(error, match="can't be cast to the desired output type"):
        cleave.compile(fn)(x.clone())
    # dynamo's fake run refuses an int tensor's add_ of a float tensor itself, in its own error type
    with pytest.raises((error, torch._dynamo.exc.TorchRuntimeError),
                       match="can't be cast to the desired output type|Promotion of int"):
        torch.compile(fn, backend="cleave", dynamic=True)(x.clone())


def test_an_in_place_write_of_a_wider_float_still_compiles():
    def fn(x, y):
        x.add_(y)
        return x * 2

    x, y = torch.randn(2, 3, dtype=torch.float16), torch.randn(3)
    want_x, got_x = x.clone(), x.clone()
    want = fn(want_x, y)
    assert torch.equal(cleave.compile(fn)(got_x, y), want) and torch.equal(got_x, want_x)


def test_a_half_where_past_f16s_range_is_inf_and_compiles(ctx):
    """torch.where(m, x_f16, 1e6) makes its 1e6 with scalar_tensor, which converts a
    half's number through f32: inf, no error. It was a graph break saying torch raises."""
    def fn(a, m):
        return torch.where(m, a, 1e6)

    a, m = torch.randn(2, 3).half(), torch.tensor([[True, False, True], [False, True, False]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph break would warn
        got = torch.compile(fn, backend="cleave")(a, m)
    assert got.dtype == torch.float16 and torch.equal(got, fn(a, m))


@pytest.mark.parametrize("fn", [lambda x: x.softmax(5), lambda x: torch.softmax(x, 2), lambda x: x.log_softmax(-3)],
                         ids=["softmax_5", "softmax_2", "log_softmax_-3"])
def test_softmax_over_a_dim_past_the_rank_raises_index_error(ctx, fn):
    _raises_as_eager(fn, torch.randn(3, 4, generator=torch.Generator().manual_seed(0)))


def test_softmax_over_a_negative_dim_in_range_still_compiles(ctx):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(cleave.compile(lambda x: x.softmax(-2))(x), x.softmax(-2))


@pytest.mark.parametrize("fn", [lambda x: x.amax(-1), lambda x: x.amin(-1), lambda x: x.max(), lambda x: x.amax(),
                                lambda x: x.amax((0, 1)), lambda x: x.max(-1).values, lambda x: x.min(1).values * 2])
def test_a_max_over_a_dynamic_axis_empty_at_run_time_raises_eagers_error(ctx, fn):
    """Compiled where the axis held 5, a call where it holds 0 ran the kernels' -inf (or
    +inf); eager raises that a max over nothing has no value."""
    f = cleave.compile(fn, dynamic={"x": {1: "n"}})
    x = torch.randn(3, 5)
    assert torch.equal(f(x), fn(x))
    empty = torch.randn(3, 0)
    error = _eager_error(fn, empty)
    with pytest.warns(UserWarning, match="1 <= n"), pytest.raises(error):
        f(empty)
    assert torch.equal(f(x), fn(x))


def test_an_error_met_while_dynamo_traces_reads_as_eagers():
    """An in-place indexed write sends the function through dynamo's graphs; at an empty
    batch its trace meets eager's IndexError, which dynamo passed on with the user code
    and its logging advice appended (and 33 frames of its own)."""
    def bump_first_row(x):
        x[0, :] += 1
        return x.sum(1)

    compiled = cleave.compile(bump_first_row)
    x = torch.randn(5, 3)
    torch.testing.assert_close(compiled(x.clone()), bump_first_row(x.clone()))
    empty = torch.randn(0, 3)
    with pytest.raises(IndexError) as eager:
        bump_first_row(empty.clone())
    with pytest.raises(IndexError) as got:
        compiled(empty)
    assert str(got.value) == str(eager.value)


def _prefill_reading_lengths_by_request(read):
    def prefill(q, k, qo_indptr, kv_len):
        seg = (torch.arange(q.shape[0])[:, None] >= qo_indptr[None, 1:-1]).sum(1)  # query -> request, < b
        keep = torch.arange(k.shape[0])[None, :] < read(kv_len, seg)[:, None]
        return (q @ k.T).masked_fill(~keep, float("-inf")).softmax(-1) @ k
    return prefill


@pytest.mark.parametrize("read", [lambda t, i: t[i], lambda t, i: torch.gather(t, 0, i)], ids=["index", "gather"])
def test_an_index_in_range_only_at_consistent_sizes_compiles(read):
    """qo_indptr has b + 1 entries, kv_len b: the refusal's small binding drew the two
    lengths apart, a request id indexed past kv_len (an IndexError, or torch.gather's
    RuntimeError), and the program, which eager runs, was refused as one eager refuses
    and ran eagerly at every call."""
    fn = _prefill_reading_lengths_by_request(read)
    g = cleave.compile(fn, dynamic={"q": {0: "tq"}, "k": {0: "n"}, "qo_indptr": {0: "b1"}, "kv_len": {0: "b"}})
    q, k = torch.randn(8, 4), torch.randn(6, 4)
    qo, kv_len = torch.tensor([0, 3, 8]), torch.tensor([2, 6])
    torch.testing.assert_close(g(q, k, qo, kv_len), fn(q, k, qo, kv_len))
    assert g.stats["failed"] == 0 and g.stats["compiles"] == 1, g.stats
