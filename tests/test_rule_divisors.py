"""A rule whose right side divides by a value its left side never divides by is
refused before any proof: the provers and the numeric gate assume divisors non-zero,
so `add(x, y) => mul(add(div(x, y), const(1)), y)` (NaN wherever y is 0) was proven.
So is the converse, a rule dropping a divisor of its left side that it does not declare
non-zero: `div(mul(x, y), y) => x` turned eager's NaN at y = 0 into x."""
from __future__ import annotations

import pytest

from cleave import rules
from cleave.rules.dsl import parse_rules
from cleave.verify import UnsoundRule, check_rule, require_sound
from cleave.verify.divisors import cancelled_divisor, new_divisor


def _rule(text: str, conditions: str = ""):
    cond = f"\n  if {conditions}" if conditions else ""
    return parse_rules(f"family probe phase rewrite\n\nrule probe: {text}{cond}\n  why: probe\n",
                       source="divisors.rules")[0]


def test_rule_with_a_new_divisor_is_refused_naming_it():
    rule = _rule("add(x, y) => mul(add(div(x, y), const(1)), y)")
    v = check_rule(rule, use_cache=False)
    assert v.verdict == "unsound" and v.method == "divisors"
    assert "rule 'probe'" in v.explain() and "divides by y" in v.explain()
    with pytest.raises(UnsoundRule, match=r"divisors\.rules:3: rule 'probe' is unsound: divisors: .*divides by y"):
        require_sound([rule], use_cache=False)


@pytest.mark.parametrize("text, conditions, new", [
    ("max(x, y) => mul(div(max(x, y), add(y, const(1))), add(y, const(1)))", "", "divides by add(y, const(1.0))"),
    ("max(x, y) => mul(div(max(x, y), const(0)), const(0))", "", "divides by const(0.0)"),
    ("max(x, y) => mul(max(x, y), mul(recip(y), y))", "", "takes recip of y"),
    ("max(x, y) => add(max(x, y), sub(log(abs(y)), log(abs(y))))", "", "takes log of abs(y)"),
    ("add(div(x, c), y) => add(div(mul(x, y), mul(c, y)), y)", "", "divides by mul(c, y)"),
    ("max(x, y) => sub(add(max(x, y), pow(y, const(-1))), pow(y, const(-1)))", "", "raises y to a power"),
])
def test_other_new_divisors_are_refused(text, conditions, new):
    assert new in (new_divisor(_rule(text, conditions)) or "")


@pytest.mark.parametrize("text, conditions", [
    ("div(div(x, c), div(y, c)) => div(x, y)", "within(c, x)"),  # y is a factor of a divisor y/c
    ("div(x, mul(c, y)) => div(div(x, c), y)", ""),  # both factors of the left's divisor
    ("mul(div(x, c), const(2)) => div(x, mul(c, const(0.5)))", ""),  # times a non-zero constant
    ("div(x, c) => div(neg(x), neg(c))", ""),  # up to sign
    ("exp(x) => div(const(1), exp(neg(x)))", ""),  # an exp is positive
    ("max(x, y) => mul(div(max(x, y), rsum(exp(y), -1)), rsum(exp(y), -1))", ""),  # a sum of exps (axes are non-empty)
    ("mul(rsum(x, a), n) => div(mul(rsum(x, a), mul(n, n)), n)", "extent(n, x, a)"),  # a count
    ("mul(div(x, x), y) => y", "within(x, y) and nonzero(x)"),  # x/x = 1 where x is non-zero
])
def test_divisors_that_are_the_left_sides_or_non_zero_are_accepted(text, conditions):
    assert new_divisor(_rule(text, conditions)) is None


def test_rule_cancelling_a_divisor_is_refused_naming_it():
    rule = _rule("div(mul(x, y), y) => x", "within(y, x)")
    v = check_rule(rule, use_cache=False)
    assert v.verdict == "unsound" and v.method == "divisors"
    assert "left side divides by y" in v.explain() and "nonzero" in v.explain()
    declared = check_rule(_rule("div(mul(x, y), y) => x", "within(y, x) and nonzero(y)"), use_cache=False)
    assert declared.verdict == "proven", declared.explain()


@pytest.mark.parametrize("text, conditions, dropped", [
    ("mul(div(x, x), y) => y", "within(x, y)", "divides by x"),
    ("mul(div(x, y), y) => x", "within(y, x)", "divides by y"),
    ("sub(add(x, recip(y)), recip(y)) => x", "within(y, x)", "takes recip of y"),
    ("div(div(x, c), div(y, c)) => div(x, y)", "within(c, x)", "divides by c"),
    ("mul(div(x, mul(c, y)), c) => div(x, y)", "within(c, x)", "divides by mul(c, y)"),
])
def test_other_cancelled_divisors_are_refused(text, conditions, dropped):
    assert dropped in (cancelled_divisor(_rule(text, conditions)) or "")


@pytest.mark.parametrize("text, conditions", [
    ("div(div(x, c), div(y, c)) => div(x, y)", "within(c, x) and nonzero(c)"),  # y/c is 0 where y is
    ("div(x, mul(c, y)) => div(div(x, c), y)", ""),  # both factors still divide
    ("mul(div(x, c), const(2)) => div(x, mul(c, const(0.5)))", ""),  # c still divides
    ("log(exp(x)) => x", ""),  # an exp is positive
    ("div(mul(x, n), n) => x", "extent(n, x, -1)"),  # a count
])
def test_divisors_kept_or_non_zero_are_not_cancelled(text, conditions):
    assert cancelled_divisor(_rule(text, conditions)) is None


def test_rule_dividing_by_a_count_is_proven():
    # the verifier used to crash (IndexError) on a scalar pick of x in extent(n, x, a)
    v = check_rule(_rule("mul(rsum(x, a), n) => div(mul(rsum(x, a), mul(n, n)), n)", "extent(n, x, a)"),
                   use_cache=False)
    assert v.verdict == "proven", v.explain()


def test_no_library_rule_divides_by_a_new_value_or_drops_one():
    assert [(r.name, why) for r in rules.all_rules() if (why := new_divisor(r) or cancelled_divisor(r))] == []


@pytest.mark.parametrize("text", ["sub(div(add(x, y), y), const(1)) => div(x, y)",
                                  "div(add(x, y), y) => add(div(x, y), const(1))"])
def test_a_rule_wrong_only_at_an_infinite_divisor_is_refused(text):
    """The gate drew a divisor non-zero and finite: `(x + y) / y - 1 => x / y` was proven
    and turned the NaN of a divisor exp(s) that overflowed into 0 (session 50's probe).
    A divisor now takes infinities and NaN in the special style, never 0."""
    v = check_rule(_rule(text), use_cache=False)
    assert v.verdict == "unsound" and "special inputs" in v.counterexample, v.explain()


def test_a_nonzero_divisor_is_drawn_finite():
    """The search's `nonzero(c)` is never 0 nor infinite: div-div-cancel holds under it."""
    v = check_rule(_rule("div(div(x, c), div(y, c)) => div(x, y)", "within(c, x) and nonzero(c)"), use_cache=False)
    assert v.verdict == "proven", v.explain()
