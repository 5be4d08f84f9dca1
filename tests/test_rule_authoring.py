"""Rule authoring end to end: the family -> phase schedule the search reads, a new
family declaring its phase, `cleave optimize --rules`, `cleave.compile(rules=...)`,
and the worked example of docs/rules.md (a new family to a new fused kernel)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import cleave
import cleave.rules as R
import cleave.workloads as W
from cleave.cli.main import main
from cleave.ir import parse_graph
from cleave.search import search

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "docs" / "examples"
QUANT_RULES = EXAMPLES / "quantization.rules"
SCALED_MATMUL = EXAMPLES / "scaled_matmul.graph"

WRONG_RULES = EXAMPLES / "zero_point_wrong.rules"  # unsound on purpose


def _write(tmp_path, name, text) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- the schedule -------------------------------------------------------------
def test_every_library_family_is_scheduled_in_known_phases():
    assert {r.family for r in R.all_rules()} == set(R.FAMILY_PHASES)
    assert all(set(phases) <= set(R.PHASES) for phases in R.FAMILY_PHASES.values())


def test_saturation_reads_the_family_table(monkeypatch):
    """Unscheduling the normalization family keeps its row scale out of the search."""
    g = W.get("rmsnorm_matmul").graph
    assert "rowscale-after-matmul" in search(g, top_k=1, progress=False).stats["rules_fired"]
    monkeypatch.setitem(R.FAMILY_PHASES, "normalization", ())
    assert "rowscale-after-matmul" not in search(g, top_k=1, progress=False).stats["rules_fired"]


def test_an_unknown_family_is_an_error_naming_the_known_ones(tmp_path):
    text = QUANT_RULES.read_text().replace("family quantization phase rewrite", "family quantization")
    path = _write(tmp_path, "mine.rules", text)
    with pytest.raises(R.RuleError, match=r"mine.rules:5: rule colscale-after-matmul: unknown family 'quantization'; "
                                          r"known families: algebra, reduction, .*'family quantization phase rewrite'"):
        R.load_file(path)
    (rule,) = R.parse_rules(text)  # built without load_file: the search refuses it before any work
    with pytest.raises(R.RuleError, match="unknown family 'quantization'"):
        search(parse_graph(SCALED_MATMUL.read_text()), rules=[rule], progress=False)


@pytest.mark.parametrize("family_line, message", [
    ("family quantization phase fuse", r"unknown phase 'fuse'; phases, in order: rewrite, split, cleanup"),
    ("family split phase rewrite", r"family split runs in phase split .*only for a new family"),
])
def test_declared_phases_are_checked(tmp_path, family_line, message):
    text = QUANT_RULES.read_text().replace("family quantization phase rewrite", family_line)
    with pytest.raises(R.RuleError, match=message):
        R.load_file(_write(tmp_path, "mine.rules", text))


def test_a_new_family_runs_in_the_phase_it_declares(tmp_path):
    text = QUANT_RULES.read_text().replace("phase rewrite", "phase cleanup")
    rules = R.all_rules() + R.load_file(_write(tmp_path, "mine.rules", text))
    result = search(parse_graph(SCALED_MATMUL.read_text()), rules=rules, progress=False)
    assert result.stats["rules_fired"].get("colscale-after-matmul")
    assert any("colscale-after-matmul" in c.derivation for c in result.candidates)


def test_a_condition_on_the_rules_own_line_says_where_conditions_go(tmp_path):
    """It said Python's "expected 'else' after 'if' expression" alone."""
    text = "family probe phase rewrite\n\nrule inline: neg(neg(x)) => x if flat(x, -1)\n  why: t\n"
    with pytest.raises(R.RuleError, match=r"mine.rules:3: .*a rule's conditions go on a line of their own"):
        R.load_file(_write(tmp_path, "mine.rules", text))


def test_files_an_editor_wrote_with_a_byte_order_mark_read_as_their_text(tmp_path, capsys):
    """A rule file (or a graph file) starting with U+FEFF failed "got '\\ufefffamily ...'"."""
    text = QUANT_RULES.read_text()
    assert [r.name for r in R.load_file(_write(tmp_path, "bom.rules", "\ufeff" + text))] == \
        [r.name for r in R.load_file(_write(tmp_path, "plain.rules", text))]
    graph = tmp_path / "bom.graph"
    graph.write_text("\ufeff" + SCALED_MATMUL.read_text())
    assert main(["optimize", str(graph), "--no-schedule", "--quiet"]) == 0
    assert main(["optimize", str(tmp_path), "--quiet"]) == 2
    assert "a directory, not a graph file" in capsys.readouterr().err


# -- cleave optimize --rules --------------------------------------------------
def _optimize(*args) -> list[str]:
    return ["optimize", str(SCALED_MATMUL), "--shape", "s=16", "--shape", "k=64", "--shape", "n=64", "--quiet",
            *args]


def test_optimize_with_a_rule_file_uses_and_derives_it(capsys):
    assert main(_optimize("--json", "--no-schedule", "--rules", str(QUANT_RULES))) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["rules_fired"]["colscale-after-matmul"] >= 1
    assert ["colscale-after-matmul"] in [c["derivation"] for c in out["candidates"]]
    assert main(_optimize("--json", "--no-schedule")) == 0  # the library alone has no such rule
    assert "colscale-after-matmul" not in capsys.readouterr().out


def test_optimize_refuses_an_unsound_rule_with_its_counterexample(capsys):
    assert main(_optimize("--rules", str(QUANT_RULES), "--rules", str(WRONG_RULES))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cleave optimize: error: {WRONG_RULES}:5: rule 'zero-point-after-matmul' is unsound: ")
    assert "lhs=" in err and "rhs=" in err and "Traceback" not in err


def test_optimize_rule_files_must_not_redefine_a_rule(tmp_path, capsys):
    clash = _write(tmp_path, "clash.rules", "family algebra\n\nrule split-k: neg(neg(x)) => x\n  why: a clash\n")
    assert main(_optimize("--rules", clash)) == 2
    assert f"rule split-k is defined twice (" in capsys.readouterr().err


# -- cleave.compile(rules=...) ------------------------------------------------
def _scaled(x, w, scale):
    return x @ (w.float() * scale).bfloat16()


def test_compile_with_rules_uses_them_and_keys_the_cache_by_them():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 24, generator=g).bfloat16(), torch.randn(24, 40, generator=g).bfloat16()
    scale = torch.rand(1, 40, generator=g) + 0.5
    with_rules = cleave.compile(_scaled, dynamic={"x": {0: "s"}}, rules=[QUANT_RULES])
    plain = cleave.compile(_scaled, dynamic={"x": {0: "s"}})
    with torch.no_grad():
        y = with_rules(x, w, scale)
        plain(x, w, scale)
    exact = x.double() @ (w.double() * scale.double())
    torch.testing.assert_close(y.double(), exact, rtol=2e-2, atol=2e-2)
    (op,) = with_rules.operators
    (plain_op,) = plain.operators
    assert ["colscale-after-matmul"] in [c.derivation for c in op.candidates]
    assert op.fields["rules"] == R.digest(R.with_files([QUANT_RULES])[0])
    assert "rules" not in plain_op.fields and op.key != plain_op.key


def test_compile_refuses_an_unsound_rule_before_the_first_call():
    from cleave.verify import UnsoundRule

    with pytest.raises(UnsoundRule, match=rf"{WRONG_RULES}:5: rule 'zero-point-after-matmul' is unsound: .*lhs="):
        cleave.compile(_scaled, rules=WRONG_RULES)


# -- docs/rules.md's worked example ---------------------------------------------
DOC_SHAPES = ("--shape", "s=4096", "--shape", "k=4096", "--shape", "n=4096")


def _loop_and_epilogue(kernel: Path) -> tuple[str, str]:
    """The kernel's k loop and what follows it."""
    lines = kernel.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("for start"))
    indent = len(lines[start]) - len(lines[start].lstrip())  # deeper in a persistent tile loop
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" " * (indent + 4)))
    return "\n".join(lines[start:end]), "\n".join(lines[end:])


def test_the_worked_example_moves_the_scale_out_of_the_loop(tmp_path, capsys):
    """The kernels the docs show: without the rule, W is scaled once by a kernel of its
    own and round-trips through memory (cheaper than rescaling every W tile in each
    program's k loop); with it, one kernel scales its output tile after the loop."""
    before, after = tmp_path / "before", tmp_path / "after"
    target = ["optimize", str(SCALED_MATMUL), *DOC_SHAPES, "--quiet"]
    assert main([*target, "--emit", str(before)]) == 0
    assert main([*target, "--emit", str(after), "--rules", str(QUANT_RULES)]) == 0
    assert "# derivation: split-k, colscale-after-matmul" in capsys.readouterr().out
    scaling, gemm = (p.read_text() for p in sorted(before.glob("scaled_matmul_k*.py")))
    assert "tl.dot(" not in scaling and re.search(r" \* v\d+\[None, :\]", scaling)
    loop, _ = _loop_and_epilogue(before / "scaled_matmul_k1.py")
    assert "tl.dot" in loop and "scale_ptr" not in gemm  # the GEMM reads the scaled W
    assert not (after / "scaled_matmul_k1.py").exists()
    loop, epilogue = _loop_and_epilogue(after / "scaled_matmul_k0.py")
    scale = re.search(r"(v\d+) = tl.load\(scale_ptr", epilogue).group(1)
    assert "scale_ptr" not in loop and f" * {scale}[" in epilogue


def test_the_worked_example_kernel_computes_the_naive_graph():
    """The rewritten candidate, tiled so that K runs as a loop, against the naive graph in fp64."""
    from kernel_check import LOOPS, run_and_check

    naive = parse_graph(SCALED_MATMUL.read_text())
    result = search(naive, rules=R.with_files([QUANT_RULES])[0], progress=False)
    (cand,) = [c for c in result.candidates if c.derivation == ["colscale-after-matmul"]]
    env = {"s": 19, "k": 45, "n": 37}
    plan = cleave.schedule(cand, env, target=LOOPS, top_k=1)[0]
    run_and_check(cand.graph, plan, env, seed=5, reference=naive)


# -- session 33's probe: what the verifier cannot instantiate is not proven ----------------
def test_a_binding_no_instance_builds_at_leaves_the_rule_unknown(tmp_path, capsys):
    """Right only at a = -2: the verifier's shapes for a = -1 are rank 2, where the literal
    axis -3 does not build, and the rule was `proven` on the a = -2 instances alone (a
    search with it gave a [1, 4, 6] result for eager's [1, 4, 1])."""
    path = _write(tmp_path, "pull.rules", "family probe phase rewrite\n\n"
                  "rule pull-scale-2: rsum(rsum(mul(x, c), a), -3) => mul(rsum(rsum(x, a), -3), c)\n"
                  "  if flat(c, -2) and flat(c, -3)\n  why: right only where a is -2\n")
    assert main(["rules", "verify", "--no-cache", path]) == 1
    out = capsys.readouterr()
    assert "no small instance builds at a = -1" in out.out + out.err
    with pytest.raises(cleave.verify.verdict.UnprovenRule, match="pull-scale-2' is not proven .* at a = -1"):
        cleave.compile(lambda x, c: (x * c).sum(-1, keepdim=True).sum(0, keepdim=True), rules=[path])


def test_a_rule_that_builds_nowhere_is_named_with_why_and_the_others_still_checked(tmp_path, capsys):
    """An error in the second rule stopped `verify` there (exit 2): the first rule's
    counterexample and the summary were never printed, and the error gave no reason."""
    path = _write(tmp_path, "two.rules", "family probe phase rewrite\n\n"
                  "rule swapped-reductions: rmax(rsum(x, a), b) => rsum(rmax(x, b), a)\n  why: wrong\n\n"
                  "rule transposed-product: matmul(x, y) => swap(matmul(swap(y), swap(x)))\n  why: transpose\n")
    assert main(["rules", "verify", "--no-cache", path]) == 1
    out = capsys.readouterr()
    assert "0/2 rules proven" in out.out
    assert re.search(r"FAILED .*two.rules:3: rule 'swapped-reductions' is unsound: numeric", out.err)
    assert re.search(r"FAILED .*two.rules:6: rule transposed-product: no small instance builds on both sides .*"
                     r"its rhs fails: .*swap needs rank >= 3", out.err)


def test_an_extent_condition_holds_on_a_static_axis(tmp_path):
    """torch's mean divides by the float const 5.0, which the condition compared with the
    extent 5 as sympy numbers (Float(5.0) is no Integer(5)): it never held where the axis
    was static."""
    path = _write(tmp_path, "mean.rules", "family probe phase rewrite\n\n"
                  "rule sum-over-n: div(squeeze(rsum(x, -1), 0), n) => squeeze(rsum(div(x, n), -1), 0)\n"
                  "  if extent(n, x, -1)\n  why: a mean is the sum of x / n\n")
    graph = cleave.capture(lambda x: x.mean(-1), torch.randn(3, 5), dynamic={"x": {0: "b"}})
    result = search(graph, rules=[path], top_k=3, progress=False)
    assert result.stats["rules_fired"].get("sum-over-n")


def test_a_library_rule_names_its_line_in_its_module():
    """Lines counted from the start of the module's rule string: split-sum at split.py:4."""
    for rule in R.all_rules():
        path, line = rule.source.rsplit(":", 1)
        assert Path(path).read_text().splitlines()[int(line) - 1].lstrip().startswith(f"rule {rule.name}:"), rule.source
