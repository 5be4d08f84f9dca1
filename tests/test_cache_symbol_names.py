"""A dynamic axis named like one of sympy's own names (N, S, I, beta...) reloads from
the operator cache: a candidate's stored cost is read with its graph's dims, not
sympy's N function, S registry or imaginary unit (every process used to search and
compile again, warning of a damaged cache entry)."""
from __future__ import annotations

import shutil
import warnings

import pytest
import torch

import cleave
from cleave.ir import Candidate, Graph
from cleave.ir import dims as D
from cleave.runtime.operator import _candidate_from_json, _candidate_to_json
from cleave.search import extraction_cost as C
from cleave.storage import cache_dir


@pytest.mark.parametrize("name", ["N", "S", "I", "Q", "beta", "gamma", "E"])
def test_stored_cost_reads_a_dim_named_like_a_sympy_name(name):
    g = Graph("f")
    g.output(g.add("exp", g.input("x", (D.symbol(name), 8), "f32")), names=["out"])
    cand = Candidate(g, [], [], C.cost(g))
    back = _candidate_from_json(_candidate_to_json(cand))
    assert back.cost == cand.cost and back.cost.free_symbols == {D.symbol(name)}


def _softmax_twice(x):
    return torch.softmax(x, dim=-1) * 2


def test_dynamic_axis_named_N_loads_from_cache_in_a_fresh_compile(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    if (cache_dir() / "verify").is_dir():  # the rules' verdicts, not to prove them again
        shutil.copytree(cache_dir() / "verify", cache / "verify")
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(cache))
    x = torch.randn(5, 8)
    first = cleave.compile(_softmax_twice, dynamic={"x": {0: "N"}})
    torch.testing.assert_close(first(x), _softmax_twice(x))
    again = cleave.compile(_softmax_twice, dynamic={"x": {0: "N"}})  # as a new process would
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*damaged cache entry")
        torch.testing.assert_close(again(x), _softmax_twice(x))
    assert again.stats["from_cache"] == 1 and again.stats["searches"] == 0 and again.stats["compiles"] == 0
