"""What a cleave.compile capture is reused for: torch's global state and each tensor
argument's layout and requires_grad are part of its key (traced code may branch on
them; a capture served another state's result), without a capture per size along a
dynamic axis; a data check (`torch._assert_async`) runs; and the `dynamic` spec against
calls of another rank, or naming axes of different sizes with one symbol."""
from __future__ import annotations

import warnings

import pytest
import torch

import cleave


def _close(got, want):
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# -- torch's global state -------------------------------------------------------
def _grad_branch(a):
    return a * 2 if torch.is_grad_enabled() else a * 3


def _inference_branch(a):
    return a + 1 if torch.is_inference_mode_enabled() else a - 1


def _deterministic_branch(a):
    return a + 1 if torch.are_deterministic_algorithms_enabled() else a - 1


def test_grad_mode_is_part_of_the_key():
    f = cleave.compile(_grad_branch, verbose=False)
    x = torch.randn(5, 7)
    with torch.no_grad():
        _close(f(x), x * 3)
    _close(f(x), x * 2)
    with torch.no_grad():
        _close(f(x), x * 3)
    assert len(f._runners) == 2


def test_inference_mode_is_part_of_the_key():
    f = cleave.compile(_inference_branch, verbose=False)
    x = torch.randn(5, 7)
    _close(f(x), x - 1)
    with torch.inference_mode():
        _close(f(x), x + 1)


def test_deterministic_algorithms_are_part_of_the_key():
    f = cleave.compile(_deterministic_branch, verbose=False)
    x = torch.randn(5, 7)
    _close(f(x), x - 1)
    torch.use_deterministic_algorithms(True)
    try:
        _close(f(x), x + 1)
    finally:
        torch.use_deterministic_algorithms(False)


def _adds_ones(a):
    return a + torch.ones(a.shape[-1])  # in the default dtype


def test_default_dtype_is_part_of_the_key():
    f = cleave.compile(_adds_ones, verbose=False)
    x = torch.randn(5, 7)
    assert f(x).dtype == torch.float32
    torch.set_default_dtype(torch.float64)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # float64 runs eagerly, with a warning
            assert f(x).dtype == _adds_ones(x).dtype == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)


# -- tensor layout and requires_grad ----------------------------------------------
def _contiguous_branch(x):
    return x * 2 if x.is_contiguous() else x * 3


def _reads_layout(x):
    return x * x.stride(0) + x.storage_offset()


def _channels_last_branch(x):
    return x + 1 if x.is_contiguous(memory_format=torch.channels_last) else x - 1


def _requires_grad_branch(a):
    return a * 2 if a.requires_grad else a * 3


def test_contiguity_is_part_of_the_key():
    f = cleave.compile(_contiguous_branch, verbose=False)
    x, xt = torch.randn(5, 7), torch.randn(7, 5).t()
    _close(f(x), x * 2)
    _close(f(xt), xt * 3)


@pytest.mark.parametrize("other", [lambda: torch.randn(7, 5).t(), lambda: torch.randn(10, 7)[3:8]],
                         ids=["transposed", "offset"])
def test_strides_and_storage_offset_are_part_of_the_key(other):
    f = cleave.compile(_reads_layout, verbose=False)
    x, y = torch.randn(5, 7), other()
    _close(f(x), _reads_layout(x))
    _close(f(y), _reads_layout(y))


def test_channels_last_is_part_of_the_key():
    f = cleave.compile(_channels_last_branch, verbose=False)
    x = torch.randn(2, 3, 5, 7)
    xc = x.to(memory_format=torch.channels_last)
    _close(f(x), x - 1)
    _close(f(xc), xc + 1)


def test_requires_grad_is_part_of_the_key():
    f = cleave.compile(_requires_grad_branch, verbose=False)
    x = torch.randn(5, 7)
    with torch.no_grad():
        _close(f(x.clone().requires_grad_()), x * 2)
        _close(f(x), x * 3)


def _softmax(a):
    return a.softmax(-1) * 2 + 1


def test_two_layouts_in_turn_capture_twice():
    f = cleave.compile(_softmax, verbose=False)
    x, xt = torch.randn(5, 7), torch.randn(7, 5).t()
    for i in range(6):
        a = xt if i % 2 else x
        _close(f(a), _softmax(a))
    assert len(f._runners) == 2
    assert f.stats["operators"] == 1  # the same graph: no new search


def test_a_layout_serves_every_size_of_a_dynamic_axis():
    """A contiguous, a transposed, a stepped and an offset input: one capture each, for
    every n (their strides change with n)."""
    f = cleave.compile(_softmax, dynamic={"a": {0: "n"}}, verbose=False)
    layouts = [lambda n: torch.randn(n, 7), lambda n: torch.randn(7, n).t(),
               lambda n: torch.randn(n, 14)[:, ::2], lambda n: torch.randn(2 * n, 7)[n:]]
    for n in (3, 5, 8, 11):
        for make in layouts:
            a = make(n)
            _close(f(a), _softmax(a))
    assert len(f._runners) == len(layouts)
    assert f.stats["operators"] == 1


def test_a_dynamic_axis_outermost_in_memory_serves_every_size():
    f = cleave.compile(_softmax, dynamic={"a": {2: "n"}}, verbose=False)
    for n in (3, 5, 8):
        a = torch.randn(n, 2, 4).permute(1, 2, 0)  # [2, 4, n], n outermost in memory
        _close(f(a), _softmax(a))
    assert len(f._runners) == 1


# -- torch._assert_async ---------------------------------------------------------------
def _checked(x):
    torch._assert_async((x > -100).all(), "values below -100")
    return x * 3


@pytest.mark.parametrize("compiler", [lambda fn: cleave.compile(fn, verbose=False),
                                      lambda fn: torch.compile(fn, backend="cleave")],
                         ids=["cleave.compile", "torch.compile"])
def test_assert_async_runs(compiler):
    f = compiler(_checked)
    x = torch.randn(5, 7)
    with pytest.warns(UserWarning, match=r"aten\._assert_async\.msg .* runs eagerly .* \(graph break\)"):
        _close(f(x), x * 3)
    with pytest.raises(RuntimeError, match="values below -100"):
        f(torch.full((5, 7), -1000.0))


def _unrewritten(name: str, source: str):
    """The function `source` defines, compiled as written: pytest rewrites the assert
    statements of a test module."""
    namespace = {}
    exec(compile(source, "<unrewritten>", "exec"), namespace)
    return namespace[name]


# dynamo makes a Python assert on a tensor torch._assert_async
_asserts_positive = _unrewritten("asserts_positive", "def asserts_positive(x):\n"
                                                     "    y = x.softmax(-1)\n"
                                                     "    assert (y >= 0).all(), 'negative probabilities'\n"
                                                     "    return y * 2 + 1\n")


def test_python_assert_on_a_tensor_breaks_the_graph_there():
    f = cleave.compile(_asserts_positive, verbose=False)
    x = torch.randn(5, 7)
    _close(f(x), _asserts_positive(x))  # export fails on it: this call runs eagerly, the next through dynamo
    with pytest.warns(UserWarning, match=r"aten\._assert_async\.msg"):
        _close(f(x), _asserts_positive(x))
    assert f.stats["operators"] == 2 and f.stats["graph_breaks"] == 1  # compiled on both sides
    with pytest.raises(RuntimeError, match="negative probabilities"):
        f(torch.full((5, 7), float("nan")))


def _one_hot_rows(idx, w):
    return torch.nn.functional.one_hot(idx, 10).float() @ w


def test_one_hot_checks_its_classes():
    """torch's one_hot checks its classes with _assert_async: a class past num_classes
    raises as eager does (it gave a row of zeros)."""
    f = cleave.compile(_one_hot_rows, verbose=False)
    idx, w = torch.tensor([0, 3, 9, 4]), torch.randn(10, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the graph breaks
        for _ in range(2):
            _close(f(idx, w), _one_hot_rows(idx, w))
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
        f(torch.tensor([0, 3, 12, 4]), w)


# -- the dynamic spec ---------------------------------------------------------------
def test_a_rank_the_dynamic_spec_does_not_fit_compiles_statically():
    f = cleave.compile(_softmax, dynamic={"a": {0: "b", 2: "n"}}, verbose=False)
    x3 = torch.randn(2, 3, 5)
    _close(f(x3), _softmax(x3))
    with pytest.warns(UserWarning, match=r"argument 'a' has rank 2; dynamic axis 2 is out of range: _softmax is "
                                         r"compiled for each shape of 'a' at that rank"):
        x2 = torch.randn(3, 5)
        _close(f(x2), _softmax(x2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per rank
        x2 = torch.randn(4, 5)
        _close(f(x2), _softmax(x2))
    with pytest.warns(UserWarning, match=r"argument 'a' has rank 0; dynamic axis 0 is out of range"):
        x0 = torch.tensor(2.0)
        _close(f(x0), _softmax(x0))
    for n in (4, 6):  # rank 3 still serves every size
        x3 = torch.randn(3, 3, n)
        _close(f(x3), _softmax(x3))
    assert f.capture_error is None


def test_one_symbol_naming_axes_of_different_sizes_is_refused_at_first_call():
    f = cleave.compile(_softmax, dynamic={"a": {0: "n", 1: "n"}}, verbose=False)
    with pytest.raises(ValueError, match=r"dynamic symbol 'n' names argument 'a' axis 0 \(size 2\) and argument "
                                         r"'a' axis 1 \(size 3\); one symbol is one size"):
        f(torch.randn(2, 3, 5))


def test_one_symbol_naming_axes_of_different_sizes_after_it_fit_runs_eagerly():
    f = cleave.compile(_softmax, dynamic={"a": {0: "n", 1: "n"}}, verbose=False)
    x = torch.randn(4, 4)
    _close(f(x), _softmax(x))
    with pytest.warns(UserWarning, match=r"runs eagerly: .* n is 3 elsewhere, but 5 here"):
        x = torch.randn(3, 5)
        _close(f(x), _softmax(x))


def _tanh_product(x, w):
    return torch.tanh(x @ w)


def test_a_third_static_shape_says_which_axis_to_declare_dynamic():
    f = cleave.compile(_tanh_product, verbose=False)
    w = torch.randn(8, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (3, 4, 5, 6):
            f(torch.randn(rows, 8), w)
    hints = [w for w in caught if "serves every size" in str(w.message)]
    text = [str(w.message) for w in hints]
    assert len(hints) == 1 and "'x' along axis 0" in text[0] and "{'x': {0: 'x_0'}}" in text[0], text
    assert hints[0].filename == __file__  # the user's call


def test_a_capture_that_succeeds_clears_an_earlier_calls_capture_error():
    f = cleave.compile(_tanh_product, verbose=False)
    w = torch.randn(8, 4)
    with pytest.raises(RuntimeError):
        f(torch.randn(6, 5), w)  # eager's shape error
    assert f.capture_error is not None
    x = torch.randn(6, 8)
    _close(f(x, w), _tanh_product(x, w))
    assert f.capture_error is None


def _first_columns(x, n):
    return (x[:, :n] * 2).softmax(-1)


def test_an_int_argument_goes_through_dynamo_from_the_first_call_and_says_so():
    """The capture takes tensors only: the first call ran eagerly without a word, and the
    reason lay in capture_error alone."""
    f = cleave.compile(_first_columns, verbose=False)
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="argument 'n' is a int: whole-function capture takes tensors"):
        _close(f(x, 3), _first_columns(x, 3))
    assert f.stats["operators"] == 1, f.stats  # the first call compiled
    for n in (4, 5):
        _close(f(x, n), _first_columns(x, n))


def _scaled_by_keyword(x, **options):
    return (x * options["scale"]).softmax(-1)


def test_a_keyword_argument_goes_through_dynamo_and_says_so():
    """A keyword left after binding (**kwargs, keyword-only) sent the function through
    dynamo without the warning a positional number gets."""
    f = cleave.compile(_scaled_by_keyword, verbose=False)
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="keyword argument\\(s\\) 'scale': whole-function capture takes positional"):
        _close(f(x, scale=3.0), _scaled_by_keyword(x, scale=3.0))
    assert "keyword" in f.capture_error
    _close(f(x, scale=2.0), _scaled_by_keyword(x, scale=2.0))
