"""A rule of the user's that fires but reaches no candidate is named in a warning: the
extraction leaves out an exp of an operand that is not a difference (it may overflow),
and a researcher's exp(x)·exp(y) => exp(x + y) vanished without a word."""
import warnings

import pytest

import cleave
from cleave.ir import Graph
from cleave.rules import load_file
from cleave.search.api import RuleNotUsed

RULE = """family probe phase rewrite

rule exp-mul-add: mul(exp(x), exp(y)) => exp(add(x, y))
  why: exp(a) exp(b) = exp(a + b)
  rewrites: mul(exp(x), exp(y)) with x[m, n], y[m, n]
  keeps: mul(exp(x), y) with x[m, n], y[m, n]
"""


def _graph():
    g = Graph("expmul")
    x, y = g.input("x", ("m", "n")), g.input("y", ("m", "n"))
    g.output(x.exp() * y.exp())
    return g


def test_a_fired_rule_no_candidate_uses_is_named(tmp_path):
    path = tmp_path / "mine.rules"
    path.write_text(RULE)
    with pytest.warns(RuleNotUsed, match="exp-mul-add fired"):
        result = cleave.search(_graph(), rules=load_file(path))
    assert result.stats["rules_fired"].get("exp-mul-add")


def test_the_library_alone_warns_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuleNotUsed)
        cleave.search(_graph())


def test_a_rule_a_graph_condition_leaves_out_is_named(tmp_path):
    """A rule of the user's gated by moderate_values() on a graph holding a constant near
    f32's range was dropped before the search without a word."""
    import torch

    path = tmp_path / "gated.rules"
    path.write_text("family probe phase rewrite\n\nrule fold-2-3: mul(mul(x, const(2)), const(3)) => mul(x, const(6))\n"
                    "  if moderate_values()\n  why: 2 * 3 = 6\n")
    graph = cleave.capture(lambda x: (x * 2) * 3 + (x > 1e30) * 3e38, torch.randn(3, 4))
    with pytest.warns(RuleNotUsed, match=r"rule\(s\) fold-2-3 \(moderate_values\(\)\) left out"):
        cleave.search(graph, rules=[path], progress=False)
