"""The numeric gate beyond the provers' finite reals: special values (±inf, NaN, ±0,
subnormals) in the data an elementwise rule reads, both sides computed in f32, and
the per-rule time limit."""
from __future__ import annotations

import time

import pytest

from cleave.rules.dsl import parse_rules
from cleave.verify import UnprovenRuleWarning, check_rule
from verify_helpers import fresh_verify_cache  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("fresh_verify_cache")


def _rule(text: str):
    return parse_rules("family probe phase rewrite\n\n" + text, source="probe.rules")[0]


def test_a_rule_wrong_on_a_masked_fills_minus_inf_is_unsound():
    """where(p, x, 0) => mul(p, x) holds on finite reals; where masked_fill left x at -inf
    and p is false it is 0 * -inf = NaN where the program has 0."""
    v = check_rule(_rule("rule where-as-mul: where(p, x, const(0)) => mul(p, x)\n  why: a mask as a product\n"))
    assert v.verdict == "unsound", v.explain()
    assert "special inputs" in v.counterexample and "lhs=0 rhs=nan" in v.counterexample


def test_rules_that_hold_on_every_ieee_value_stay_proven():
    for text in ("rule mul-comm: mul(x, y) => mul(y, x)\n  why: commutes, NaN and inf included\n",
                 "rule neg-neg: neg(neg(x)) => x\n  why: negation is its own inverse\n"):
        v = check_rule(_rule(text))
        assert v.verdict == "proven", v.explain()


@pytest.mark.parametrize("text, style", [
    ("rule log-of-exp: log(exp(x)) => x\n  why: log inverts exp\n", "offset"),
    ("rule one-pass-var: div(rsum(square(sub(x, div(rsum(x, a), n))), a), n) => "
     "sub(div(rsum(square(x), a), n), square(div(rsum(x, a), n)))\n  if extent(n, x, a)\n"
     "  why: E[(x - mean)^2] = E[x^2] - mean^2\n", None),
], ids=["log-of-exp overflows", "one-pass variance cancels"])
def test_a_rule_exact_in_the_reals_but_not_in_f32_is_unsound(text, style):
    v = check_rule(_rule(text))
    assert v.verdict == "unsound" and "in f32" in v.counterexample, v.explain()
    if style:
        assert f"{style} inputs" in v.counterexample


def test_an_f32_line_exempts_a_rule_and_its_verdict_says_so():
    v = check_rule(_rule("rule log-of-exp: log(exp(x)) => x\n  why: log inverts exp\n"
                         "  f32: a probe of the exemption: exp overflows past 88\n"))
    assert v.verdict == "proven", v.explain()
    assert "exempt from the numeric gate's f32 leg: a probe of the exemption" in v.explain()


def test_a_rule_of_many_variables_stops_at_its_time_limit_with_a_warning(capsys):
    rule = _rule("rule assoc8: add(add(add(add(add(add(add(a, b), c), d), e), f), g), h) => "
                 "add(a, add(b, add(c, add(d, add(e, add(f, add(g, h)))))))\n  why: associativity\n")
    start = time.perf_counter()
    with pytest.warns(UnprovenRuleWarning, match=r"'assoc8': verification stopped at its time limit of 2 s"):
        v = check_rule(rule, seconds=2)
    assert time.perf_counter() - start < 20
    assert v.verdict == "unknown" and "time limit of 2 s" in v.explain()
    assert "rule assoc8: building its instances over" in capsys.readouterr().err
    with pytest.raises(ValueError, match="positive time limit"):
        check_rule(rule, seconds=0)
