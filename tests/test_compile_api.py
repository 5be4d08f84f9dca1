"""The cleave.compile API at its edges: the structure of what a compiled function
returns, container arguments, autocast, globals and closures read by the function,
the `dynamic` spec, eager's own errors, explain, and use from inside torch.compile.
Tiny elementwise functions under TRITON_INTERPRET=1."""
from __future__ import annotations

import collections
import traceback
import warnings

import pytest
import torch

import cleave
from cleave.ir import CleaveError

X = torch.arange(6.0).reshape(2, 3)


# -- 1. outputs keep eager's structure ------------------------------------------
Pair = collections.namedtuple("Pair", "a b")


@pytest.mark.parametrize("fn", [
    lambda x: {"y": x + 1, "p": x * 0},
    lambda x: [x + 1, x * 0],
    lambda x: (x + 1,),
    lambda x: (x + 1, [x * 2, {"k": x - 1}]),
    lambda x: Pair(x + 1, x * 2),
    lambda x: (x + 1, x * 2),
    lambda x: x + 1,
], ids=["dict", "list", "1-tuple", "nested", "namedtuple", "tuple", "tensor"])
def test_outputs_keep_eager_structure(fn):
    compiled = cleave.compile(fn)
    for _ in range(2):  # the first call builds, the second runs the remembered launch
        got, want = compiled(X), fn(X)
        assert torch.utils._pytree.tree_structure(got) == torch.utils._pytree.tree_structure(want)
        for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
            torch.testing.assert_close(g, w)
    assert compiled.capture_error is None


def test_one_tuple_unpacks_with_eager_shape():
    (a,) = cleave.compile(lambda x: (x + 1,))(X[:1])
    assert a.shape == (1, 3)


# -- 2. container arguments ---------------------------------------------------------
@pytest.mark.parametrize("arg", [{"a": X}, [X]], ids=["dict", "list"])
def test_container_argument_runs_through_dynamo_with_a_warning(arg):
    fn = (lambda d: d["a"] * 2) if isinstance(arg, dict) else (lambda d: d[0] * 2)
    compiled = cleave.compile(fn)
    with pytest.warns(UserWarning, match=f"argument 'd' is a {type(arg).__name__}"):
        got = compiled(arg)
    torch.testing.assert_close(got, X * 2)
    torch.testing.assert_close(compiled(arg), X * 2)


# -- 3. autocast ---------------------------------------------------------------------
def _softmax_matmul(x, w):
    return (x @ w).softmax(-1)


@pytest.mark.parametrize("autocast_first", [True, False])
def test_autocast_state_selects_the_operator(autocast_first):
    x, w = torch.randn(4, 8), torch.randn(8, 5)
    compiled = cleave.compile(_softmax_matmul)
    order = [True, False, True] if autocast_first else [False, True, False]
    for on in order:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
            got, want = compiled(x, w), _softmax_matmul(x, w)
        assert got.dtype == want.dtype, on
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


# -- 4. globals and closures ----------------------------------------------------------
SCALE = 2.0
WEIGHT = torch.ones(3)


def _scaled(x):
    return x * WEIGHT * SCALE


def test_changed_globals_recapture():
    global SCALE, WEIGHT
    compiled = cleave.compile(_scaled)
    try:
        torch.testing.assert_close(compiled(X), _scaled(X))
        SCALE = 3.0  # a new value
        torch.testing.assert_close(compiled(X), _scaled(X))
        WEIGHT = torch.full((3,), 7.0)  # a new tensor
        torch.testing.assert_close(compiled(X), _scaled(X))
        WEIGHT.mul_(2)  # the same tensor, changed in place
        torch.testing.assert_close(compiled(X), _scaled(X))
        assert compiled.stats["recaptures"] == 3
        compiled(X)
        assert compiled.stats["recaptures"] == 3  # nothing changed: no recapture
    finally:
        SCALE, WEIGHT = 2.0, torch.ones(3)


def test_changed_closure_cell_recaptures():
    def make(scale):
        def fn(x):
            return x * scale
        return fn

    fn = make(2.0)
    compiled = cleave.compile(fn)
    torch.testing.assert_close(compiled(X), X * 2)
    fn.__closure__[0].cell_contents = 5.0
    torch.testing.assert_close(compiled(X), X * 5)


# -- 5. torch.compile's mode and options ----------------------------------------------
@pytest.mark.parametrize("kwargs, named", [({"mode": "reduce-overhead"}, "mode='reduce-overhead'"),
                                           ({"options": {"verbose": False}}, "option 'verbose'")])
def test_backend_takes_mode_and_options(kwargs, named):
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x.exp(), backend="cleave", **kwargs)
    with pytest.warns(UserWarning, match=f"{named} does not apply to the cleave backend"):
        got = compiled(torch.randn(3))
    assert got.shape == (3,)


@pytest.mark.parametrize("options", [3, "ab"])
def test_backend_options_that_are_no_dict_are_refused_naming_them(options):
    torch._dynamo.reset()
    with pytest.raises(Exception, match="options must be a dict, not"):
        torch.compile(lambda x: x.exp(), backend="cleave", options=options)(torch.randn(3))


@pytest.mark.parametrize("kwargs", [{"top_k": True}, {"candidates": True}, {"verbose": 1}])
def test_compile_refuses_a_bool_count_and_an_int_verbose(kwargs):
    """A bool is an int to isinstance: top_k=True passed, and the search refused it at the
    first call, which then ran eagerly for good."""
    with pytest.raises((ValueError, TypeError), match=next(iter(kwargs))):
        cleave.compile(lambda x: x.exp(), **kwargs)


# -- 6. the dynamic spec ----------------------------------------------------------------
def _mul_sum(x, y):
    return (x * y).sum(0)


@pytest.mark.parametrize("spec, error, match", [
    ({"X": {0: "n"}}, ValueError, "dynamic names argument 'X', but _mul_sum takes x, y"),
    ({"x": {0: 3}}, TypeError, "symbol 3 is not an identifier"),
    ({"x": {"0": "n"}}, TypeError, "axis '0' is not an int"),
    ({"x": [0]}, TypeError, "must be a dict"),
    ({"x": {0: "in"}}, ValueError, "'in' is a Python keyword"),
    ({"x": {0: "pid"}}, ValueError, "'pid' is a name the generated kernels use"),
    ({"x": {0: "tl"}}, ValueError, "'tl' is a name the generated kernels use"),
    ({"x": {0: "v3"}}, ValueError, "'v3' is a name the generated kernels use"),
    ({"x": {0: "s_n"}}, ValueError, "'s_n' is a name the generated kernels use"),
    ({"x": {0: "x"}}, ValueError, "'x' is also an argument's name"),
    ({"x": {0: "len"}}, ValueError, "'len' is a Python builtin"),
])
def test_bad_dynamic_spec_is_refused_at_compile(spec, error, match):
    with pytest.raises(error, match=match):
        cleave.compile(_mul_sum, dynamic=spec)


def test_dynamic_true_and_false_read_as_torch_compile_reads_them():
    """dynamic=True was a TypeError ("must be None, 'all' or a dict"), where torch.compile
    takes it: every axis dynamic, as "all"; False is static."""
    dynamic_everywhere = cleave.compile(_mul_sum, dynamic=True, verbose=False)
    static = cleave.compile(_mul_sum, dynamic=False, verbose=False)
    for rows in (3, 5, 6):
        x, y = torch.randn(rows, 4), torch.randn(rows, 4)
        torch.testing.assert_close(dynamic_everywhere(x, y), _mul_sum(x, y))
        torch.testing.assert_close(static(x, y), _mul_sum(x, y))
    assert dynamic_everywhere.dynamic == "all" and dynamic_everywhere.stats["searches"] == 1
    assert static.dynamic is None and static.stats["searches"] == 3


@pytest.mark.parametrize("thing", [42, "f", None])
def test_compile_of_what_cannot_be_called_is_refused_at_compile(thing):
    """It failed at the first call, inside torch.compile ("A callable function is
    expected"), after a warning calling the argument a tensor-less int."""
    with pytest.raises(TypeError, match="cleave.compile takes a function or an nn.Module, not"):
        cleave.compile(thing)


def test_a_builtins_arguments_are_named_by_position():
    """torch.bmm's parameters cannot be read: the capture names them x0, x1, and a spec
    naming `input` matched nothing (a search per shape, silently)."""
    with pytest.raises(ValueError, match="bmm's parameters cannot be read: name its arguments by position, x0, x1"):
        cleave.compile(torch.bmm, dynamic={"input": {0: "b"}})
    compiled = cleave.compile(torch.bmm, dynamic={"x0": {0: "b", 1: "n"}, "x1": {0: "b"}}, verbose=False)
    for b, n in ((3, 7), (2, 9)):
        x, y = torch.randn(b, n, 33), torch.randn(b, 33, 5)
        torch.testing.assert_close(compiled(x, y), torch.bmm(x, y))
    assert compiled.stats["searches"] + compiled.stats["from_cache"] == 1, compiled.stats


def test_an_op_the_capture_cannot_map_is_named_in_capture_error():
    """torch.mv has no mapping of its own (the backend's decompositions lower it): the
    function went through dynamo with capture_error None, and nothing said why."""
    compiled = cleave.compile(torch.mv, verbose=False)
    a, v = torch.randn(5, 7), torch.randn(7)
    torch.testing.assert_close(compiled(a, v), torch.mv(a, v))
    assert "aten.mv" in compiled.capture_error


@pytest.mark.parametrize("spec, match", [
    ({"x": {5: "n"}}, "argument 'x' has rank 2; dynamic axis 5 is out of range"),
    ({"x": {0: "n", -2: "m"}}, "dynamic axes name axis 0 twice"),
])
def test_dynamic_axis_out_of_range_is_refused_at_first_call(spec, match):
    compiled = cleave.compile(_mul_sum, dynamic=spec)
    with pytest.raises(ValueError, match=match):
        compiled(torch.ones(5, 3), torch.ones(5, 3))


def test_negative_dynamic_axis_serves_every_extent():
    compiled = cleave.compile(_mul_sum, dynamic={"x": {-2: "n"}, "y": {0: "n"}})
    for n in (5, 7):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        torch.testing.assert_close(compiled(x, y), _mul_sum(x, y))
    assert compiled.stats["operators"] == 1


# -- 7. eager's own errors ----------------------------------------------------------------
def _assert_eager_error_unchained(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match=r"size of tensor a \(5\) must match the size of tensor b \(4\)") as info:
            call()
    text = "".join(traceback.format_exception(info.value))
    assert "During handling of the above exception" not in text
    assert "BindingError" not in text and "TorchRuntimeError" not in text


def test_eager_error_on_the_dynamo_path():
    compiled = cleave.compile(_mul_sum)
    compiled(X, 2.0)  # a Python float: the function runs through dynamo from now on
    _assert_eager_error_unchained(lambda: compiled(torch.randn(5, 3), torch.randn(4, 3)))


def test_eager_error_on_the_capture_path_is_unchained():
    compiled = cleave.compile(_mul_sum, dynamic={"x": {0: "n"}, "y": {0: "n"}})
    compiled(torch.randn(5, 3), torch.randn(5, 3))
    _assert_eager_error_unchained(lambda: compiled(torch.randn(5, 3), torch.randn(4, 3)))


def test_eager_error_after_a_model_changed_dtype_is_unchained():
    """A model moved to bf16 after its first call, then called with f32: the capture is
    made again (its parameters changed dtype), and eager's dtype error comes without
    cleave's StateChanged before it."""
    model = torch.nn.Linear(16, 16).eval()
    compiled = cleave.compile(model)
    x = torch.randn(5, 16)
    with torch.no_grad():
        compiled(x)
        model.to(torch.bfloat16)
        with pytest.raises(RuntimeError, match="dtype") as info:
            compiled(x)
    text = "".join(traceback.format_exception(info.value))
    assert "During handling of the above exception" not in text and "StateChanged" not in text, text


# -- 8. explain ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_explain_refuses_another_backend(backend):
    fn = torch.compile(lambda x: torch.softmax(x, -1), backend=backend)
    with pytest.raises(CleaveError, match=f"compiled with torch.compile's '{backend}' backend, not cleave's"):
        cleave.explain(fn, X)


def test_explain_takes_the_cleave_backend_however_named():
    from cleave.runtime.backend import cleave_backend

    report = cleave.explain(torch.compile(lambda x: x * 3 + 1, backend=cleave_backend), X)
    assert len(report.operators) == 1


def test_explain_fidelity_numbers_outputs_and_compares_integers_exactly():
    def fn(x):
        return x.argmax(-1), x.exp(), (x * 2).sum()

    report = cleave.explain(cleave.compile(fn), torch.randn(5, 4))
    assert [f["output"] for f in report.fidelity] == [0, 1, 2]
    assert report.fidelity[0] == {"output": 0, "against": "eager fp32", "mismatches": 0, "numel": 5}
    lines = [line for line in str(report).splitlines() if "against eager" in line]
    assert lines[0] == "output 0 against eager fp32: 0 of 5 elements differ (exact)"
    assert lines[1].startswith("output 1 against eager fp32: max abs diff")


def test_explain_of_a_function_that_does_not_run_in_fp32_compares_with_eager_as_given():
    """x @ w.bfloat16() with x in fp32 is a dtype mismatch: explain raised it from its fp32
    reference. It compares against eager at the inputs' own dtypes then, and says so."""
    def fn(x, w):
        return x @ w.bfloat16()

    x, w = torch.randn(5, 8).bfloat16(), torch.randn(8, 3)
    report = cleave.explain(cleave.compile(fn), x, w)
    (f,) = report.fidelity
    assert f["against"] == "eager at the inputs' own dtypes (in fp32 it raises RuntimeError)"
    assert f["max_abs"] < 0.05 and "output 0 against eager at the inputs' own dtypes" in str(report)


# -- 9. inside torch.compile -----------------------------------------------------------------
def test_compiled_function_is_opaque_to_dynamo():
    inner = cleave.compile(lambda t: t.exp() + 1)

    def model(x):
        return inner(x * 2) - 1

    torch._dynamo.reset()
    outer = torch.compile(model, backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(outer(X), model(X))
    assert [str(w.message) for w in caught] == []
    assert inner.stats["failed"] == 0 and inner.stats["operators"] == 1


# -- what a capture bakes in changes after it ----------------------------------
def test_outputs_aliasing_each_other_or_an_input_through_split_are_views():
    """`return y, y` and `return z, z.t()` came back as separate tensors, and the pieces
    of `chunk`/`split`/`unbind` of an input as copies: a write to one did not reach the
    other or the input, as it does in eager."""
    def twice(x):
        y = x * 2
        return y, y.t()

    def pieces(buf):
        q, k, v = buf.chunk(3, dim=-1)
        return q, k, v

    a, b = cleave.compile(twice)(torch.randn(3, 4))
    a[0, 1] = 100.0
    assert b[1, 0] == 100.0 and b.stride() == (1, 4)
    buf = torch.randn(2, 9)
    q, k, v = cleave.compile(pieces)(buf)
    k.fill_(7.0)
    assert torch.all(buf[:, 3:6] == 7.0)


class _Proj(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.head = self.lin  # tied

    def forward(self, x):
        return self.lin(x) + self.head(x) * 2


def test_parameters_changed_after_the_capture_recapture():
    """The remembered launch of an argument shape never looked at the module's state:
    a Linear swapped for a wider one returned the old width, `bias = None` crashed deep
    in the launch, and untying a tied weight kept reading the first path (1.19 off)."""
    torch.manual_seed(0)
    m = _Proj()
    f = cleave.compile(m)
    x = torch.randn(5, 6)
    with torch.no_grad():
        f(x)
        for change in (lambda: setattr(m, "head", torch.nn.Linear(6, 6)),  # untie
                       lambda: setattr(m.lin, "bias", None),
                       lambda: (setattr(m, "lin", torch.nn.Linear(6, 9)), setattr(m, "head", m.lin))):
            change()
            torch.testing.assert_close(f(x), m(x))
    assert f.stats["recaptures"] == 3


def test_an_in_place_op_on_an_argument_that_is_a_buffer_runs_eagerly():
    """`x.add_(1); return x * self.buf` called with the buffer itself read the buffer's
    old value: the check for inputs sharing memory looked at the arguments only."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", torch.ones(5, 4))

        def forward(self, x):
            x.add_(1)
            return x * self.buf

    m, ref = M(), M()
    f = cleave.compile(m)
    with torch.no_grad():
        f(torch.randn(5, 4))
        with pytest.warns(UserWarning, match="share memory"):
            got = f(m.buf)
        torch.testing.assert_close(got, ref(ref.buf))


def test_hooks_and_attributes_of_the_compiled_object_are_guarded():
    """A forward hook removed after the capture was still applied, one added was not;
    a callable object's tensor attribute rebound after the capture was not seen."""
    m = torch.nn.Linear(3, 3)
    f = cleave.compile(m)
    x = torch.randn(2, 3)
    with torch.no_grad():
        handle = m.register_forward_hook(lambda mod, inp, out: out + 100)
        torch.testing.assert_close(f(x), m(x))
        handle.remove()
        torch.testing.assert_close(f(x), m(x))
        m.register_forward_hook(lambda mod, inp, out: out * 0)
        torch.testing.assert_close(f(x), m(x))

    class Scale:
        def __init__(self):
            self.w = torch.full((3,), 2.0)

        def __call__(self, x):
            return x * self.w

    obj = Scale()
    g = cleave.compile(obj)
    torch.testing.assert_close(g(x), obj(x))
    obj.w = torch.full((3,), -5.0)
    torch.testing.assert_close(g(x), obj(x))


def test_as_strided_of_an_input_laid_out_otherwise_runs_eagerly():
    """`x.as_strided(size, stride, 1)` reads x's storage: traced on a contiguous x, the
    launch was reused for a transposed, sliced or offset x of the same shape and
    returned the contiguous copy's elements."""
    def f(x):
        return x.as_strided((2, 3), (3, 1), 1) * 10

    g = cleave.compile(f)
    g(torch.randn(6, 6))
    base = torch.arange(100.0)
    for x in (base[:36].view(6, 6).t(), base[:72].view(6, 12)[:, ::2], base[10:46].view(6, 6)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert torch.equal(g(x), f(x))


def test_threads_calling_one_compiled_function_at_their_own_sizes():
    """Three threads calling one compiled function, each at its own length, failed
    under the interpreter ("x >= grid_dim[0]": Triton's interpreter keeps the launch's
    grid in module state). Interpreted launches take turns."""
    import threading

    def f(x):
        return torch.softmax(x * 2, -1)

    g = cleave.compile(f, dynamic={"x": {0: "n"}})
    g(torch.randn(9, 7))
    errors = []

    def work(n):
        x = torch.randn(n, 7)
        for _ in range(2):
            try:
                torch.testing.assert_close(g(x), f(x))
            except Exception as err:  # collected: an exception in a thread would pass silently
                errors.append(repr(err))

    threads = [threading.Thread(target=work, args=(n,)) for n in (2, 5, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("device, error, match", [
    ("quantum", ValueError, r"device 'quantum' is not a device torch knows"),
    (3, TypeError, r"device must be a torch.device or a string such as 'cuda', not 3"),
    ("meta", ValueError, r"device 'meta': cleave's kernels run on cpu \(Triton's interpreter\) or cuda")]
    + ([] if torch.cuda.is_available() else
       [("cuda", ValueError, r"device 'cuda': CUDA is not available on this machine")]))
def test_a_device_this_machine_lacks_is_refused_at_compile(device, error, match):
    # it was taken, and the first call failed inside torch ("Torch not compiled with CUDA enabled")
    with pytest.raises(error, match=match):
        cleave.compile(lambda x: x.exp(), device=device)


def test_a_misspelt_keyword_raises_pythons_error_and_changes_nothing():
    """c(x, z=x) raised eager's TypeError, and also warned that f runs through
    torch.compile's graphs from now on, as it then did."""
    def f(x, y):
        return (x * y).softmax(-1)

    c = cleave.compile(f)
    x = torch.randn(3, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning
        with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
            c(x, z=x)
    torch.testing.assert_close(c(x, y=x), f(x, x))
    assert c.capture_error is None and c.stats["compiles"] + c.stats["from_cache"] == 1


class _Scaler:
    def __init__(self):
        self.w = torch.randn(7, generator=torch.Generator().manual_seed(3))

    @cleave.compile
    def scale(self, x):
        """Scale by w."""
        return x * self.w


def test_a_decorated_method_binds_self_and_keeps_the_functions_name():
    """A CompiledFunction was no descriptor: `obj.scale(x)` called scale(x) without self."""
    obj, x = _Scaler(), torch.randn(5, 7)
    torch.testing.assert_close(obj.scale(x), x * obj.w)
    assert _Scaler.scale.__name__ == "scale" and _Scaler.scale.__doc__ == "Scale by w."
    assert _Scaler.scale.__wrapped__ is not None


def _doubled_later(x):
    yield x * 2


async def _doubled_when_awaited(x):
    return x * 2


@pytest.mark.parametrize("fn", [_doubled_later, _doubled_when_awaited], ids=["generator", "coroutine"])
def test_a_function_whose_body_runs_after_the_call_runs_eagerly_and_says_so(fn):
    """A coroutine function was called once more by the capture, and Python warned that
    the coroutine it made was never awaited."""
    import asyncio
    import gc

    compiled, x = cleave.compile(fn), torch.randn(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = asyncio.run(compiled(x)) if fn is _doubled_when_awaited else next(compiled(x))
        gc.collect()
    torch.testing.assert_close(out, x * 2)
    said = [str(w.message) for w in caught]
    assert not any("never awaited" in m for m in said), said
    assert any("runs eagerly" in m and "after the call" in m for m in said), said
