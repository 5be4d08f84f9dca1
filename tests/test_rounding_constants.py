"""A rule that holds only up to the rounding of its f32 constants (0.1 x + 0.9 x => x:
0.1f + 0.9f is not 1) stays unproven, and the verdict says so instead of blaming z3's
model for breaking a law of real arithmetic."""
from cleave.rules.dsl import parse_rules
from cleave.verify import check_rule


def test_rounded_constants_are_named_as_the_cause():
    rule = parse_rules("""family probe phase rewrite

rule tenth-plus-ninetenths: add(mul(x, const(0.1)), mul(x, const(0.9))) => x
  why: 0.1 + 0.9 = 1 in the reals
""", source="const.rules")[0]
    v = check_rule(rule, use_cache=False)
    assert v.verdict == "unknown"
    assert "rounding of its f32 constants" in v.explain() and "law of real arithmetic" not in v.explain()


def test_a_required_rule_left_unknown_raises_unproven_rule(tmp_path):
    from cleave.verify import UnprovenRule, UnsoundRule, with_proven_files

    path = tmp_path / "const.rules"
    path.write_text("""family probe phase rewrite

rule tenth-plus-ninetenths: add(mul(x, const(0.1)), mul(x, const(0.9))) => x
  why: 0.1 + 0.9 = 1 in the reals
""")
    try:
        with_proven_files([path], use_cache=False)
    except UnprovenRule as err:
        assert isinstance(err, UnsoundRule) and "not proven (unknown)" in str(err)
    else:
        raise AssertionError("an unknown rule of a file was accepted")
