"""Every rule's examples, run through the search's encoding and egglog: the rule must
fire on each `rewrites:` term and must not on each `keeps:` term."""
from __future__ import annotations

import pytest

import cleave.rules as R
from cleave.cli.main import main
from cleave.search.examples import failures, matches

LIBRARY = R.all_rules()

PULL = """family reduction

rule my-sum-pull-factor: rsum(mul(x, c), a) => mul(rsum(x, a), c)
  if flat(c, a)
  why: c leaves the sum when it does not vary along a
  rewrites: rsum(mul(x, c), -1) with x[m, n], c[m, 1]
  keeps: rsum(mul(x, c), -1) with x[m, n], c[1, n]
"""


@pytest.mark.parametrize("rule", LIBRARY, ids=[r.name for r in LIBRARY])
def test_library_rule_examples_hold(rule):
    kinds = {ex.kind for ex in rule.examples}
    assert kinds == {"rewrites", "keeps"}, f"{rule.source}: {rule.name} needs a rewrites: and a keeps: example"
    assert failures(rule) == []


def test_a_positive_example_fires_and_a_negative_one_does_not():
    (rule,) = R.parse_rules(PULL, source="pull.rules")
    positive, negative = rule.examples
    assert (positive.kind, negative.kind) == ("rewrites", "keeps")
    assert matches(rule, positive) == 1 and matches(rule, negative) == 0


def test_a_rule_without_its_condition_breaks_its_negative_pin():
    """Dropping `if flat(c, a)` makes the rule fire on a scale that varies along the sum."""
    (rule,) = R.parse_rules(PULL.replace("  if flat(c, a)\n", ""), source="pull.rules")
    assert failures(rule) == ["pull.rules:6: rule my-sum-pull-factor rewrites rsum(mul(x, c), -1), which it must keep"]


def test_an_example_the_pattern_never_matches_is_reported():
    (rule,) = R.parse_rules(PULL.replace("rewrites: rsum(mul(x, c), -1)", "rewrites: rsum(add(x, c), -1)"),
                            source="pull.rules")
    assert failures(rule) == ["pull.rules:6: rule my-sum-pull-factor does not rewrite rsum(add(x, c), -1)"]


def test_a_rule_needs_both_kinds_and_examples_must_build():
    text = PULL.replace("  keeps: rsum(mul(x, c), -1) with x[m, n], c[1, n]\n", "")
    (rule,) = R.parse_rules(text.replace("c[m, 1]", "c[k, 1]"), source="pull.rules")
    problems = failures(rule)
    assert problems[0] == "pull.rules:3: rule my-sum-pull-factor has no 'keeps:' example"
    assert problems[1].startswith("pull.rules:6: rewrites example of my-sum-pull-factor does not build: ")


@pytest.mark.parametrize("line, message", [
    ("rewrites: rsum(mul(x, c), -1) with x[m, n]", r"pull.rules:6: .*undeclared: c"),
    ("rewrites: rsum(mul(x, c), a) with x[m, n], c[m, 1]", r"pull.rules:6: an example's axes are integers"),
    ("rewrites: rsum(mul(x, c), -1) with x[m, n], c(m)", r"pull.rules:6: cannot read a declaration from 'c\(m\)'"),
    ("rewrites: rsum(mul(x, c), -1) with x[m, n+1], c[m, 1]", r"pull.rules:6: a dim is an integer or a symbol"),
])
def test_malformed_examples_name_the_file_and_line(line, message):
    text = PULL.replace("rewrites: rsum(mul(x, c), -1) with x[m, n], c[m, 1]", line)
    with pytest.raises(R.RuleError, match=message):
        R.parse_rules(text, source="pull.rules")


def test_cli_rules_test(tmp_path, capsys):
    good = tmp_path / "pull.rules"
    good.write_text(PULL)
    assert main(["rules", "test", str(good)]) == 0
    assert "my-sum-pull-factor         2  ok" in capsys.readouterr().out
    bad = tmp_path / "bad.rules"
    bad.write_text(PULL.replace("  if flat(c, a)\n", ""))
    assert main(["rules", "test", str(bad)]) == 1
    captured = capsys.readouterr()
    assert "0/1 rules pass their examples" in captured.out
    assert f"FAILED {bad}:6: rule my-sum-pull-factor rewrites" in captured.err
