"""Code dynamo leaves between its graphs runs eagerly: cleave.compile names it.

A function torch.export cannot take whole runs through dynamo's graphs after its first
call. What dynamo cuts out of them (an op whose output shape depends on the data, a
`print`) ran eagerly with nothing said; now each such break warns once, by its reason,
and the results stay eager's."""
import warnings

import pytest
import torch

import cleave


def boolean_mask(x):
    y = x * 3
    return y[y > 0].sum() + 1


def unique_values(x):
    return torch.unique(x) * 2


def prints(x):
    y = x.exp()
    print("between two graphs")
    return y * 2


def branches_on_a_value(x):
    y = x.exp()
    if y.sum() > 3:
        return y * 2
    return y - 1


def _calls(fn, xs):
    compiled = cleave.compile(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [compiled(x) for x in xs]
    return outs, [str(w.message) for w in caught if str(w.message).startswith("cleave:")]


@pytest.mark.parametrize("fn, names", [(boolean_mask, "aten.nonzero"), (unique_values, "aten._unique2"),
                                       (prints, "print"), (branches_on_a_value, "Data-dependent branching")])
def test_a_graph_break_is_named_once(fn, names, capsys):
    xs = [torch.randn(n, generator=torch.Generator().manual_seed(n)) for n in (37, 41, 37)]
    outs, said = _calls(fn, xs)
    for x, out in zip(xs, outs):
        torch.testing.assert_close(out, fn(x))
    breaks = [m for m in said if "torch.compile breaks its graph" in m]
    assert len(breaks) == 1, said
    assert breaks[0].startswith(f"cleave: part of {fn.__name__} runs eagerly") and names in breaks[0], breaks[0]


@pytest.mark.parametrize("fn, names", [(boolean_mask, "aten.nonzero"), (unique_values, "aten._unique2")])
def test_a_data_dependent_op_is_named_at_the_first_call(fn, names):
    """The first call ran eagerly with nothing said (the capture failed on the size the op
    makes, and dynamo served from the second call): a function called once never
    warned. A size only the data defines now sends it through dynamo's graphs at once."""
    x = torch.randn(29, generator=torch.Generator().manual_seed(29))
    outs, said = _calls(fn, [x])
    torch.testing.assert_close(outs[0], fn(x))
    assert any("torch.compile breaks its graph" in m and names in m for m in said), said


def test_no_warning_without_a_break():
    def plain(x):
        return torch.softmax(x * 2, dim=-1)

    xs = [torch.randn(3, n) for n in (33, 33)]
    outs, said = _calls(plain, xs)
    assert not said
    for x, out in zip(xs, outs):
        torch.testing.assert_close(out, plain(x))


def cache_write_at_tensor_position(cache, k, pos):
    cache[:, pos] = k
    return cache * 2


def test_a_tensor_valued_index_is_named_at_its_line():
    """The warning named aten._local_scalar_dense and AOTAutograd, not the user's line."""
    compiled = torch.compile(cache_write_at_tensor_position, backend="cleave")
    cache, k = torch.zeros(2, 8, 3), torch.randn(2, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(cache.clone(), k, torch.tensor(5))
    expected = cache_write_at_tensor_position(cache.clone(), k, torch.tensor(5))
    assert torch.equal(out, expected)
    said = " ".join(str(w.message) for w in caught if str(w.message).startswith("cleave:"))
    line = cache_write_at_tensor_position.__code__.co_firstlineno + 1
    assert f"indexes with a one-element tensor's value at {__file__}:{line}" in said, said
    assert "a Python int index compiles" in said


@pytest.mark.parametrize("path", ["cleave", "dynamo"])
def test_a_diagonal_over_a_dynamic_size_compiles(path):
    """einsum("ii") is an as_strided with stride n + 1: at a second shape (dynamic) the
    stride, an fx node's size, was refused as "not a size: s27 + 1"."""
    def trace(x):
        return torch.einsum("ii", x) + torch.diagonal(x * 2).sum()

    torch._dynamo.reset()
    compiled = cleave.compile(trace) if path == "cleave" else torch.compile(trace, backend="cleave")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (3, 5, 4):
            x = torch.randn(n, n)
            torch.testing.assert_close(compiled(x), trace(x))


def test_a_dynamic_axis_the_code_fixes_is_said_and_a_failed_trace_is_no_break():
    """An axis declared dynamic that the code contracts with a static weight went through
    dynamo's graphs without a word; a later call of a wrong shape then warned of a graph
    break (dynamo's failed fake-tensor trace) before eager's own error."""
    f = cleave.compile(lambda x, w: torch.relu(x @ w).sum(-1), dynamic={"x": {1: "k"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f(torch.randn(5, 7), torch.randn(7, 3))
    said = [str(w.message) for w in caught if "cleave" in str(w.message)]
    assert len(said) == 1 and "declared dynamic" in said[0] and "fixes to its size" in said[0], said
    assert caught[0].filename == __file__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            f(torch.randn(5, 9), torch.randn(7, 3))
    assert not [w for w in caught if "breaks its graph" in str(w.message)]
