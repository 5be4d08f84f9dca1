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
  f32: exp(x + y) is finite where exp(x) exp(y) overflows
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



def _search_a_masked_bias(tmp_path, rule: str) -> list:
    """The warnings of a search, under `rule` (a cancellation proven where its flat y is
    finite: the verifier draws no infinity for a flat variable, a shift or a scale), of
    (x + bias) - bias where the program builds a row's bias = -inf: the rule's candidate
    is NaN there, and the check against the reference interpreter rejects it."""
    import torch

    path = tmp_path / "cancel.rules"
    path.write_text(f"family probe phase rewrite\n\nrule {rule}\n  if flat(y, -1) and within(y, x)\n"
                    "  why: (x + y) - y = x\n")

    def masked(x, m):
        bias = torch.where(m, 0.0, float("-inf"))
        return (x + bias) - bias

    graph = cleave.capture(masked, torch.randn(2, 4), torch.rand(2, 1) > 0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cleave.search(graph, rules=[path], progress=False)
    return caught


def test_a_rule_whose_candidate_was_rejected_is_not_said_to_cost_more(tmp_path):
    """RuleNotUsed said the rejected rule's results "cost more"."""
    caught = _search_a_masked_bias(tmp_path, "add-sub-one: sub(add(x, y), y) => mul(x, const(1))")
    said = [str(w.message) for w in caught if issubclass(w.category, RuleNotUsed)]
    assert any("add-sub-one" in m and "rejected their candidates" in m for m in said), said
    assert not any("add-sub-one" in m and "cost more" in m for m in said), said


def test_a_rejected_candidate_of_a_cancelling_rule_names_it(tmp_path):
    """`sub(add(x, y), y) => x`: its right side is a variable, so derivations never list
    it, and the rejection blamed "no rule (the input graph, decoded)"."""
    from cleave.search.api import CandidateRejected

    caught = _search_a_masked_bias(tmp_path, "add-sub-cancel: sub(add(x, y), y) => x")
    messages = [str(w.message) for w in caught if issubclass(w.category, CandidateRejected)]
    assert messages and all("add-sub-cancel" in m and "no rule" not in m for m in messages), messages


def test_a_rule_that_never_matches_is_named(tmp_path):
    """A user rule whose left side occurs nowhere in the graph (a double negation the
    program never takes) was silent: only the search's stats showed it never fired."""
    path = tmp_path / "never.rules"
    path.write_text("family probe phase rewrite\n\nrule probe-neg-neg: neg(neg(x)) => x\n  why: -(-a) = a\n")
    with pytest.warns(RuleNotUsed, match=r"rule\(s\) probe-neg-neg never matched"):
        result = cleave.search(_graph(), rules=load_file(path))
    assert not result.stats["rules_fired"].get("probe-neg-neg")
