"""Rules and graphs that must be refused, each with an error naming what is wrong and
where: unsound rules at broadcast shapes, sides of different shapes, malformed rule
text, malformed graph text, and bad search budgets."""
from __future__ import annotations

import pytest

import cleave
import cleave.workloads as W
from cleave.cli.main import main
from cleave.ir import ParseError, ShapeError, parse_graph
from cleave.rules import RuleError, parse_rules
from cleave.verify import check_rule
from verify_helpers import fresh_verify_cache  # noqa: F401  (fixture)

HEADER = "family mine phase rewrite\n\n"


def _rule(text: str):
    (rule,) = parse_rules(HEADER + text, source="mine.rules")
    return rule


# -- defect 1: every shape assignment, broadcast operands included -------------
def test_a_rule_wrong_only_where_an_operand_broadcasts_is_unsound(fresh_verify_cache):
    rule = _rule("rule sum-add: rsum(add(x, y), a) => add(rsum(x, a), rsum(y, a))\n  why: wrong for a broadcast y\n")
    verdict = check_rule(rule)
    assert verdict.verdict == "unsound"
    assert "y[2, 1]" in verdict.counterexample  # y broadcast along the summed axis


# -- defect 2: the two sides must have the same shape ---------------------------
@pytest.mark.parametrize("text, shapes", [
    ("rule drop-sum: rsum(x, -1) => x\n  why: wrong\n", "lhs [M, 1] vs rhs [M, N]"),
    ("rule max-add: rmax(add(x, y), a) => add(rmax(x, a), y)\n  why: needs flat(y, a)\n", "lhs [M, 1] vs rhs [M, N]"),
])
def test_a_rule_whose_sides_differ_in_shape_is_unsound(fresh_verify_cache, text, shapes):
    verdict = check_rule(_rule(text))
    assert verdict.verdict == "unsound"
    assert f"the sides' shapes differ: {shapes}" in verdict.counterexample


def test_a_rhs_that_drops_a_wider_operand_needs_within(fresh_verify_cache):
    """c wider than x makes the lhs [M, N] and the rhs x[M, 1]: a sum over N, or an
    output, would take another extent. `within(c, x)` keeps the rule to the operands
    that do not widen the result."""
    text = "rule cancel: div(mul(x, c), c) => x\n  if {}nonzero(c)\n  why: c cancels\n"
    refused = check_rule(_rule(text.format("")))
    assert refused.verdict == "unsound" and "the sides' shapes differ" in refused.counterexample
    assert check_rule(_rule(text.format("within(c, x) and "))).verdict == "proven"


# -- defects 5 and 7: rule text the parser must refuse ---------------------------
@pytest.mark.parametrize("text, message", [
    ("rule times-one: x => mul(x, const(1))\n  why: t\n",
     "mine.rules:3: rule times-one: the left-hand side must be an op, not the bare variable 'x'"),
    ("rule twice: exp(x) => exp(x) => exp(x)\n  why: t\n",
     "mine.rules:3: rule twice needs one 'LHS => RHS', got 2 '=>'"),
    ("rule pull: rsum(mul(x, c), a) => mul(rsum(x, a), c)\n  if flat(c, b)\n  why: t\n",
     "mine.rules:3: rule pull: condition flat(c, b): axis variable(s) b do not appear in the lhs"),
    ("rule sep: exp(sub(x, c)) => mul(exp(x), exp(neg(c)))\n  if flat(zz, -1)\n  why: t\n",
     "mine.rules:3: rule sep: condition flat(zz, -1): variable(s) zz do not appear in the lhs"),
])
def test_malformed_rules_are_parse_errors_naming_file_line_and_rule(text, message):
    with pytest.raises(RuleError) as err:
        parse_rules(HEADER + text, source="mine.rules")
    assert message in str(err.value)


# -- defect 8: graph text checked as the builder checks ------------------------
INPUT = '  %0 = input(name="x", shape=[m,n], dtype=f32) : f32[m,n]\n'


@pytest.mark.parametrize("text, message", [
    ('graph g {\n  %0 = input(name="x", shape=[-3,4], dtype=f32) : f32[-3,4]\n  return o=%0\n}\n',
     "line 2: .* a dimension cannot be negative"),
    ("graph g {\n" + INPUT + "  %1 = exp(%0) : f32[m,n]\n}\n", "line 4: the graph ends without a 'return' line"),
    ("graph g {\n\n# a comment\n" + INPUT + "  %1 = reduce(%0, op=\"sum\", axis=5, keepdim=1) : f32[m,1]\n"
     "  return o=%1\n}\n", "line 5: reduce: axis 5 is out of range"),
])
def test_bad_graph_text_is_refused_naming_the_line(text, message):
    with pytest.raises((ParseError, ShapeError), match=message):
        parse_graph(text)


# -- defect 6: budgets and --shape names ----------------------------------------
@pytest.mark.parametrize("budget", [{"seconds": "10"}, {"seconds": float("nan")}, {"iterations": True},
                                    {"enodes": 2.5}, {"top_k": 0}])
def test_search_refuses_a_bad_budget_before_searching(budget):
    name = next(iter(budget))
    with pytest.raises(ValueError, match=f"search: {name} must be"):
        cleave.search(W.get("matmul").graph, **budget)


def test_optimize_refuses_a_shape_for_a_symbol_the_graph_lacks(capsys):
    assert main(["optimize", "matmul", "--shape", "zz=4", "--quiet"]) == 2
    assert "--shape zz: graph 'matmul' has no symbol 'zz'; its symbols: k, n, s" in capsys.readouterr().err
