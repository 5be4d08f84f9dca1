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


def _calls(fn, xs):
    compiled = cleave.compile(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [compiled(x) for x in xs]
    return outs, [str(w.message) for w in caught if str(w.message).startswith("cleave:")]


@pytest.mark.parametrize("fn, names", [(boolean_mask, "aten.nonzero"), (unique_values, "aten._unique2"),
                                       (prints, "print")])
def test_a_graph_break_is_named_once(fn, names, capsys):
    xs = [torch.randn(n, generator=torch.Generator().manual_seed(n)) for n in (37, 41, 37)]
    outs, said = _calls(fn, xs)
    for x, out in zip(xs, outs):
        torch.testing.assert_close(out, fn(x))
    breaks = [m for m in said if "torch.compile breaks its graph" in m]
    assert len(breaks) == 1, said
    assert breaks[0].startswith(f"cleave: part of {fn.__name__} runs eagerly") and names in breaks[0], breaks[0]


def test_no_warning_without_a_break():
    def plain(x):
        return torch.softmax(x * 2, dim=-1)

    xs = [torch.randn(3, n) for n in (33, 33)]
    outs, said = _calls(plain, xs)
    assert not said
    for x, out in zip(xs, outs):
        torch.testing.assert_close(out, plain(x))
