"""Graph breaks (the runtime's partitioning layer) with the real frontend and the
search/scheduler TEST DOUBLES of test_runtime_cache.py: an op the frontend cannot
map runs eagerly, the rest is compiled, results match eager, one warning per op."""
from __future__ import annotations

import warnings

import pytest
import torch

import cleave

from test_runtime_cache import DoubleSearch, install_doubles


@pytest.fixture
def doubles(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path / "cache"))
    install_doubles(monkeypatch)
    DoubleSearch.calls = 0
    torch._dynamo.reset()


def sorted_softmax(x, w):
    y = torch.softmax((x @ w).float(), dim=-1)
    top, _ = torch.sort(y, dim=-1, descending=True)
    return (top * 2.0).sum(-1)


def test_graph_break_on_sort_is_correct_and_warns_once(doubles):
    compiled = cleave.compile(sorted_softmax, dynamic={"x": {0: "s"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in (3, 8, 13):
            x, w = torch.randn(s, 7), torch.randn(7, 5)
            torch.testing.assert_close(compiled(x, w), sorted_softmax(x, w))
    sort_warnings = [w for w in caught if "sort" in str(w.message)]
    assert len(sort_warnings) == 1, [str(w.message) for w in caught]
    stats = compiled.stats
    assert stats["graph_breaks"] >= 1 and stats["unsupported"] == ["aten.sort.default"]
    assert stats["operators"] >= 1 and stats["searches"] == stats["operators"]  # one search per operator
    assert stats["calls"] == 3


def test_operator_that_fails_to_build_warns_could_not_compile_and_runs_eagerly(doubles, monkeypatch):
    import cleave.runtime.operator as operator

    def broken_schedule(candidate, shapes, dynamic, top_k=4, target=None):
        raise ValueError("tiling exploded")
    monkeypatch.setattr(operator, "schedule", broken_schedule)

    def f(x, w):
        return torch.softmax(x @ w, dim=-1)
    compiled = cleave.compile(f, dynamic={"x": {0: "s"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in (3, 8):
            x, w = torch.randn(s, 7), torch.randn(7, 5)
            torch.testing.assert_close(compiled(x, w), f(x, w))
    messages = [str(w.message) for w in caught if "cleave" in str(w.message)]
    assert len(messages) == 1, messages
    assert "could not compile" in messages[0] and "tiling exploded" in messages[0]
    assert "running eagerly" in messages[0] and "not supported" not in messages[0]
    stats = compiled.stats
    assert stats["failed"] == 1 and stats["graph_breaks"] == 0 and stats["unsupported"] == []


def test_call_first_met_during_graph_capture_runs_eagerly_with_one_warning(doubles, monkeypatch):
    """Under a CUDA graph capture, shapes cleave has not built yet run eagerly (it
    cannot compile or time kernels there), with one warning that says so and without
    marking the operator failed; the next call outside the capture compiles it."""
    import cleave.runtime.operator as operator

    capturing = [True]
    monkeypatch.setattr(operator, "_capturing", lambda device: capturing[0])
    monkeypatch.setattr(operator, "device_name", lambda device: "a GPU")  # this machine has none

    def f(x, w):
        return torch.softmax(x @ w, dim=-1)
    with monkeypatch.context() as patched:  # compile refuses a device this machine lacks
        patched.setattr(torch.cuda, "is_available", lambda: True)
        compiled = cleave.compile(f, dynamic={"x": {0: "s"}}, device="cuda")
    x, w = torch.randn(5, 7), torch.randn(7, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            torch.testing.assert_close(compiled(x, w), f(x, w))
    messages = [str(m.message) for m in caught if "cleave" in str(m.message)]
    assert len(messages) == 1, messages
    assert "CUDA graph capture" in messages[0] and "ran eagerly" in messages[0]
    assert compiled.stats["failed"] == 0 and compiled.stats["tunings"] == 0
    capturing[0] = False
    torch.testing.assert_close(compiled(x, w), f(x, w))
    assert compiled.stats["tunings"] == 1 and compiled.stats["failed"] == 0


def test_repeated_call_through_dynamo_regions_goes_straight_to_the_kernels(doubles, monkeypatch):
    """Behind a graph break (dynamo regions), a call whose arguments match an earlier one
    exactly skips the region's signature and the operator lookups, on fresh values."""
    compiled = cleave.compile(sorted_softmax, dynamic={"x": {0: "s"}})
    w = torch.randn(7, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(torch.randn(8, 7), w)

    def refuse(*args, **kwargs):
        raise AssertionError("a call seen before was looked up again")
    monkeypatch.setattr(compiled.ctx, "run", refuse)
    x = torch.randn(8, 7)
    torch.testing.assert_close(compiled(x, w), sorted_softmax(x, w))
