"""Rule text the parser must refuse with a message naming the rule, the variable or
axis and the line (never an egglog or IR traceback later), the CLI's checks of its
own arguments, and the docs snippet that reads a compiled operator's candidates."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cleave.workloads as W
from cleave.cli.main import main
from cleave.ir import Graph
from cleave.rules import RuleError, parse_rules
from cleave.rules.dsl import Axis, Term, Var
from cleave.rules.lower import Lowering
from cleave.search.examples import failures

ROOT = Path(__file__).parent.parent
HEADER = "family mine phase rewrite\n\n"
EXAMPLES = "  rewrites: rsum(exp(x), -1) with x[m, n]\n  keeps: rsum(x, -1) with x[m, n]\n"


def _parse_error(text: str) -> str:
    with pytest.raises(RuleError) as err:
        parse_rules(HEADER + text, source="mine.rules")
    return str(err.value)


# -- one kind per variable ------------------------------------------------------
@pytest.mark.parametrize("text, message", [
    ("rule w7: rsum(exp(a), a) => rsum(exp(a), a)\n  why: t\n",
     "mine.rules:3: rule w7: variable 'a' is used as a tensor in exp(a) and as an axis in rsum(exp(a), a)"),
    ("rule w4: topk_values(exp(k), k, -1) => exp(topk_values(k, k, -1))\n  why: t\n",
     "mine.rules:3: rule w4: variable 'k' is used as a tensor in exp(k) and as a top-k count in "
     "topk_values(exp(k), k, -1)"),
    ("rule w5: topk_values(x, a, a) => topk_values(x, a, a)\n  why: t\n",
     "mine.rules:3: rule w5: variable 'a' is used as a top-k count in topk_values(x, a, a) and as an axis in "
     "topk_values(x, a, a)"),
    ("rule w6: rsum(mul(x, c), a) => mul(rsum(x, a), c)\n  if flat(a, a)\n  why: t\n",
     "mine.rules:3: rule w6: variable 'a' is used as an axis in rsum(mul(x, c), a) and as a tensor in flat(a, a)"),
])
def test_a_variable_of_two_kinds_is_a_parse_error(text, message):
    assert message in _parse_error(text)


def test_a_variable_of_two_kinds_is_one_line_from_rules_test(tmp_path, capsys):
    """It reached egglog before: `rules test` and `optimize --rules` died in a traceback."""
    path = tmp_path / "mixed.rules"
    path.write_text(HEADER + "rule w7: rsum(exp(a), a) => rsum(exp(a), a)\n  why: t\n" + EXAMPLES)
    assert main(["rules", "test", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cleave rules: error: {path}:3: rule w7: variable 'a'") and err.count("\n") == 1


def test_a_count_variable_and_a_mask_keep_their_one_kind():
    parse_rules(HEADER + "rule tk: topk_values(exp(x), k, -1) => exp(topk_values(x, k, -1))\n  why: t\n"
                "rule wp: where(p, p, x) => where(p, p, x)\n  why: t\n")


# -- axes count from the right ----------------------------------------------------
@pytest.mark.parametrize("text, message", [
    ("rule ax0: rsum(exp(x), 0) => rsum(exp(x), 0)\n  why: t\n", "mine.rules:3: rsum axis 0: axes count from the right"),
    ("rule ax1: rsum(exp(x), 1) => rsum(exp(x), 1)\n  why: t\n", "mine.rules:3: rsum axis 1: axes count from the right"),
    ("rule fl: rsum(mul(x, c), -1) => mul(rsum(x, -1), c)\n  if flat(c, 0)\n  why: t\n",
     "mine.rules:4: flat axis 0: axes count from the right (-1 is the last axis)"),
    ("rule sq: squeeze(rsum(x, -1), 1) => squeeze(rsum(x, -1), 1)\n  why: t\n",
     "mine.rules:3: squeeze axis 1: axes count from the right (-1 is the last axis), so a literal axis is "
     "negative (0 only for squeeze and unsqueeze"),
    ("rule ex: rsum(exp(x), -1) => rsum(exp(x), -1)\n  why: t\n  rewrites: rsum(exp(x), 0) with x[m, n]\n",
     "mine.rules:5: rsum axis 0: axes count from the right"),
])
def test_a_non_negative_literal_axis_is_a_parse_error(text, message):
    assert message in _parse_error(text)


def test_squeeze_at_slot_zero_removes_the_last_axis():
    """The encoder writes a reduce without keepdim over the last axis as squeeze(..., 0)."""
    (rule,) = parse_rules(HEADER + "rule sq: squeeze(rsum(exp(x), -1), 0) => squeeze(rsum(exp(x), -1), 0)\n"
                                   "  why: t\n")
    g = Graph("g")
    out = Lowering(g, {"x": g.input("x", ("m", "n"), "f32")})(rule.lhs)
    assert out.op == "reduce" and out.attrs["keepdim"] == 0 and out.attrs["axis"] == 1


@pytest.mark.parametrize("term", [Term("rsum", (Var("x"), Axis(None, 0))),
                                  Term("squeeze", (Term("rsum", (Var("x"), Axis(None, -1))), Axis(None, 1)))])
def test_lowering_refuses_an_axis_past_the_last(term):
    """Axis 0 of a reduction (an offset variable can still reach it) was an IndexError."""
    g = Graph("g")
    with pytest.raises(RuleError, match=r"axis (0|1) does not exist on an operand of rank 2"):
        Lowering(g, {"x": g.input("x", ("m", "n"), "f32")})(term)


# -- integer ops, example errors ------------------------------------------------------
@pytest.mark.parametrize("text, op", [("rule r15: bit_xor(x, x) => sub(x, x)\n  why: t\n", "bit_xor"),
                                      ("rule r16: idiv(mul(x, y), y) => x\n  why: t\n", "idiv")])
def test_an_integer_op_is_refused_saying_why(text, op):
    assert f"mine.rules:3: {op} is an op of integers, and rules rewrite float values only" in _parse_error(text)


def test_an_example_that_does_not_build_names_its_line_and_op_once():
    (rule,) = parse_rules(HEADER + "rule e1: matmul(mul(x, c), w) => mul(matmul(x, w), c)\n  if flat(c, -1)\n"
                                   "  why: t\n  rewrites: matmul(mul(x, c), w) with x[m, k], c[m, 1], w[n, k]\n"
                                   "  keeps: matmul(mul(x, c), w) with x[m, k], c[1, k], w[k, n]\n",
                          source="mine.rules")
    (line,) = failures(rule)
    assert line.count("mine.rules:") == 1 and line.count("matmul:") == 1
    assert line.endswith("contracted dims k vs n")


# -- the CLI ------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "abc"])
def test_verify_refuses_a_timeout_that_is_not_a_positive_number(value, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["rules", "verify", f"--timeout={value}", "x.rules"])
    assert exit.value.code == 2
    assert f"--timeout: a timeout is a positive number of seconds (at least 0.001), not '{value}'" \
        in capsys.readouterr().err


def test_workloads_sizes_its_name_column_to_the_longest_name(capsys):
    assert main(["workloads"]) == 0
    lines = capsys.readouterr().out.splitlines()
    width = max(map(len, W.names()))
    for name, (described, presets) in zip(W.names(), zip(lines[::2], lines[1::2])):
        assert described.startswith(name.ljust(width) + " ") and presets.startswith(" " * width + " presets")


def test_python_dash_m_cleave_runs_the_cli():
    run = subprocess.run([sys.executable, "-m", "cleave", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.startswith("cleave ")


# -- docs/rules.md ---------------------------------------------------------------------
def test_the_docs_compile_snippet_prints_its_comment_cold_and_from_the_cache():
    """An operator loaded from the cache has no `.candidates` (they load lazily); the
    second run below is always served from the cache the first one wrote."""
    docs = (ROOT / "docs" / "rules.md").read_text()
    (snippet,) = [s for s in re.findall(r"^```python\n(.*?)^```", docs, re.MULTILINE | re.DOTALL)
                  if s.startswith("import ")]
    printed = re.search(r"^print\(.*\)\s+# (.*)$", snippet, re.MULTILINE).group(1)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.strip().splitlines()[-1] == printed


def test_an_unconfirmed_counterexample_names_the_ops_z3_did_not_know():
    """erf is odd, but z3 holds erf as an uninterpreted function: its model is no real
    function, fp64 does not confirm it, and the verdict said "exp/log values" whatever
    the rule's ops were."""
    from cleave.verify.check import check_rule

    (rule,) = parse_rules(HEADER + "rule erf-odd: erf(neg(x)) => neg(erf(x))\n  why: erf is odd\n", source="m.rules")
    verdict = check_rule(rule, use_cache=False)
    assert verdict.verdict == "unknown"
    assert "z3 holds erf as an unknown function with only the laws it was given" in " ".join(verdict.notes)


# -- axes and counts the parser read wrong or let through -------------------------
@pytest.mark.parametrize("body, message", [
    ("rsum(exp(x), -1.5) => rsum(exp(x), -1)", "cannot read an axis from '-1.5'"),  # was read as -1
    ("rsum(exp(x), a - 1.5) => rsum(exp(x), a-1)", "cannot read an axis from 'a - 1.5'"),
    ("rsum(exp(x), -'a') => rsum(exp(x), -1)", "cannot read an axis from \"-'a'\""),  # a bare ValueError
    ("topk_values(x, 0, -1) => topk_values(x, 1, -1)", "a top-k count is a variable or an int of at least 1"),
    # egglog failed with "Variable _a is ungrounded" after the rule was proven
    ("rsum(mul(x, const(2)), a-1) => mul(rsum(x, a-1), const(2))", "axis variable(s) a appear on the left only "
                                                                     "with an offset (a-1)"),
])
def test_an_axis_or_count_the_search_cannot_use_is_refused_at_its_line(body, message):
    assert message in _parse_error(f"rule r: {body}\n  why: t\n")
    assert _parse_error(f"rule r: {body}\n  why: t\n").startswith("mine.rules:3: ")
