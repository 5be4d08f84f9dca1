"""The verifier's instances bind a rule's variables more than one way: every axis
variable to -1 and -2 independently (all were bound alike, so a rule right only where
two of them name one axis was proven, and on a graph too large for the candidate check
cleave returned 198.8 where eager gave 70662), a top-k count to 3 and 2 (one right only
at k = 3 was proven), a dim to the count (a shift along the axis beside a top-k's output
builds only there: proven), and inf_to_zero's argument may hold infinities
(`inf_to_zero(x) => x` was proven, and a fully masked logsumexp row became NaN)."""
from __future__ import annotations

import pytest

from cleave.rules.dsl import parse_rules
from cleave.verify import check_rule

RULES = {r.name: r for r in parse_rules("""
family probe phase rewrite

rule sum-of-max-is-max: rsum(rmax(x, a), b) => rmax(rmax(x, a), b)
  why: wrong: right only where a and b are one axis

rule neg-max-sum: rsum(rmax(neg(x), a), b) => neg(rmin(rmin(x, a), b))
  why: wrong: right only where a and b are one axis

rule topk-any-is-3: topk_values(x, k, -1) => topk_values(x, 3, -1)
  why: wrong: right only at k = 3

rule min-of-topk-is-third: rmin(topk_values(x, k, -1), -1) => rmin(topk_values(x, 3, -1), -1)
  why: wrong: right only at k = 3

rule inf-to-zero-is-identity: inf_to_zero(x) => x
  why: wrong at infinite x

rule topk-shift-along-axis: topk_values(add(x, c), k, a) => add(topk_values(x, k, a), c)
  why: wrong: a shift commutes with the top-k only where it is constant along a; its right side builds with c along a only where the axis's extent is k

rule sums-commute: rsum(rsum(x, a), b) => rsum(rsum(x, b), a)
  why: sums over two axes in either order

rule maxes-commute: rmax(rmax(x, a), b) => rmax(rmax(x, b), a)
  why: maxima over two axes in either order
""", source="bindings.rules")}


@pytest.mark.parametrize("name", ["sum-of-max-is-max", "neg-max-sum", "topk-any-is-3", "min-of-topk-is-third",
                                  "inf-to-zero-is-identity", "topk-shift-along-axis"])
def test_a_rule_right_only_at_one_binding_is_refused(name):
    v = check_rule(RULES[name], use_cache=False)
    assert v.verdict == "unsound", v.explain()


@pytest.mark.parametrize("name", ["sums-commute", "maxes-commute"])
def test_a_rule_right_at_every_binding_is_proven(name):
    v = check_rule(RULES[name], use_cache=False)
    assert v.verdict == "proven", v.explain()


def test_a_rhs_log_outside_the_lhs_domain_is_refused():
    """z3 assumed both sides' log arguments positive: log((a+100)(b+100)) =>
    log(a+100) + log(b+100) was proven, and is NaN where both factors are negative.
    The right side's domain must now follow from the left side's; z3 is asked that
    first, without the function laws, so its model is real arithmetic fp64 confirms."""
    (rule,) = parse_rules("""
family probe phase rewrite

rule split-log: log(mul(add(a, const(100)), add(b, const(100)))) => add(log(add(a, const(100))), log(add(b, const(100))))
  why: wrong where both factors are negative
""", source="domain.rules")
    v = check_rule(rule, use_cache=False)
    assert v.verdict == "unsound" and "rhs=nan" in v.counterexample, v.explain()


def test_an_elementwise_rule_builds_one_instance_per_outcome(monkeypatch):
    """Six tensor variables: every assignment of six candidate shapes each (6^6, twice)
    was built before deduplication, seven minutes; assignments whose sides broadcast to
    shapes seen already are skipped now."""
    from cleave.rules import instances

    (rule,) = parse_rules("""
family probe phase rewrite

rule six: add(add(add(add(add(a, b), c), d), e), g) => add(a, add(b, add(c, add(d, add(e, g)))))
  why: associativity
""", source="six.rules")
    built = []
    original = instances._instance
    monkeypatch.setattr(instances, "_instance", lambda *args: built.append(1) or original(*args))
    assert instances.instantiate(rule)
    assert len(built) < 1000, len(built)  # 93312 before (6^6 at each of two axes)
