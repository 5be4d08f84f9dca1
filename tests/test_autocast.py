"""Programs compiled under the caller's autocast or default dtype: the capture takes
autocast's casts as ops of the graph, and cleave's own torch work (rule proofs, the
reference check, scheduling) runs under torch's defaults, whose verdicts are cached
for every later compile."""
import warnings

import pytest
import torch
import torch.nn as nn

import cleave
from cleave.rules import all_rules
from cleave.verify.check import check_rule


def _library_rule(name):
    return next(r for r in all_rules() if r.name == name)


@pytest.mark.parametrize("rule", ["sum-of-matmul", "split-k", "rowscale-after-matmul"])
def test_rules_prove_inside_an_autocast_block(rule):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        verdict = check_rule(_library_rule(rule), use_cache=False)
    assert verdict.verdict == "proven", verdict.explain()


def test_rules_prove_under_a_float64_default_dtype():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        verdict = check_rule(_library_rule("sum-of-matmul"), use_cache=False)
    finally:
        torch.set_default_dtype(before)
    assert verdict.verdict == "proven", verdict.explain()


@torch.no_grad()
def test_chained_linears_compile_under_autocast():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 9), nn.GELU(), nn.Linear(9, 5), nn.Softmax(-1))
    compiled = cleave.compile(model)
    for rows in (3, 7):
        x = torch.randn(rows, 8)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no eager fallback, no refused rule
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = compiled(x)
                expected = model(x)
        assert out.dtype == expected.dtype == torch.bfloat16
        assert (out.float() - expected.float()).abs().max() <= 1e-2
    assert compiled.capture_error is None
    assert compiled.stats["failed"] == 0 and compiled.stats["searches"] >= 1
    # the same function outside autocast is another operator, in f32
    x = torch.randn(4, 8)
    out = compiled(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
