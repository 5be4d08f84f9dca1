"""The gate before saturation (sound_rules) and the verdict cache it relies on."""
from __future__ import annotations

import warnings

import pytest
import sympy

from cleave.ir import symbol
from cleave.rules import all_rules
from cleave.verify import UnprovenRuleWarning, UnsoundRule, check_rule, sound_rules
from verify_helpers import EXP_ADD_F32, exp_of_sum, product_of_exps, sum_of_exps
from verify_helpers import fresh_verify_cache, make_rule as _rule  # noqa: F401  (fixture)


pytestmark = pytest.mark.usefixtures("fresh_verify_cache")


def exp_add():
    return _rule("exp-add", exp_of_sum, product_of_exps, f32_exempt=EXP_ADD_F32)


def exp_add_wrong():
    return _rule("exp-add-wrong", exp_of_sum, sum_of_exps)


def topk_exp():
    """Sound (exp is increasing, so it commutes with a sort), but z3 needs case splits
    over a sorting network: with a 1 ms timeout it cannot decide."""
    def lhs(g):
        x = g.input("x", ("N",))
        g.output(g.add("topk", x.exp(), k=3, axis=0, which="values"))

    def rhs(g):
        x = g.input("x", ("N",))
        g.output(g.add("topk", x, k=3, axis=0, which="values").exp())

    return _rule("topk-exp", lhs, rhs, [sympy.Le(3, symbol("N"))])


def _disk(tmp_path):
    return sorted((tmp_path / "verify").glob("*.json"))


def test_gate_leaves_out_an_unknown_rule_with_a_warning(tmp_path):
    good, hard = exp_add(), topk_exp()
    assert check_rule(good).verdict == "proven"  # now cached: the tiny timeout below is only the hard rule's
    with pytest.warns(UnprovenRuleWarning, match=r"'topk-exp' is not proven \(unknown\).*N=3.*(timeout|canceled)"):
        kept = sound_rules([good, hard], timeout_ms=1)
    assert kept == [good]


def test_unknown_is_cached_in_process_only(tmp_path):
    hard = topk_exp()
    first = check_rule(hard, timeout_ms=1)
    assert first.verdict == "unknown" and not first.cached
    assert _disk(tmp_path) == []  # never on disk: a later, longer run may prove it
    again = check_rule(hard, timeout_ms=1)
    assert again.cached and again.verdict == "unknown"
    longer = check_rule(hard)  # a longer timeout does not reuse the unknown
    assert not longer.cached and longer.verdict == "proven", longer.explain()
    assert len(_disk(tmp_path)) == 1


def test_gate_raises_on_an_unsound_rule_naming_it():
    with pytest.raises(UnsoundRule, match=r"exp-add-wrong.*unsound.*lhs=.*rhs="):
        sound_rules([exp_add(), exp_add_wrong()])


def test_gate_keeps_proven_rules_in_order_without_warning():
    rules = [exp_add(), topk_exp()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sound_rules(rules) == rules


def test_a_known_dsl_rule_is_not_instantiated_again(monkeypatch):
    """The definition-level key: the second check (here, in a fresh process's memory)
    reads the verdict from disk without building the rule's instances."""
    from cleave.verify import verdict

    rule = next(r for r in all_rules() if r.name == "div-mul-assoc")
    assert check_rule(rule).verdict == "proven"
    verdict.clear_memory()
    monkeypatch.setattr(type(rule), "instances", lambda self: pytest.fail("instances were rebuilt"))
    again = check_rule(rule)
    assert again.cached and again.verdict == "proven"
