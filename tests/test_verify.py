"""The rule verifier: wrong rules are rejected with a counterexample, correct ones proven."""
from __future__ import annotations

import pytest
import sympy

from cleave.ir import RuleInstance, symbol
from cleave.verify import UnsoundRule, check_rule, require_sound
from cleave.verify.bindings import choose, split_case
from verify_helpers import EXP_ADD_F32, exp_of_sum, product_of_exps, sum_of_exps
from verify_helpers import fresh_verify_cache, make_rule as rule  # noqa: F401  (fixture)

NINF = float("-inf")


pytestmark = pytest.mark.usefixtures("fresh_verify_cache")


def divides(s, n):
    return sympy.Eq(sympy.Mod(symbol(n), symbol(s)), 0)


# -- building blocks --------------------------------------------------------

def sum_exp_safe(g):
    """sum_N exp(x - max_N x) per row of x[r, N]."""
    x = g.input("x", ("r", "N"))
    g.output((x - x.max(1, keepdim=True)).exp().sum(1))


def split_sum_exp(rescale: bool):
    """Per-chunk max m_i and l_i = sum exp(x - m_i) (m_i guarded: an empty chunk's max
    is -inf), then the combine; with `rescale`, l = sum_i l_i * exp(m_i - max_i m_i)."""
    def build(g):
        x = g.input("x", ("r", "N"))
        xs = x.split(1, "s", pad=NINF)                      # [r, s, q]
        mi = xs.max(2, keepdim=True)                        # [r, s, 1]
        safe = g.add("where", mi > NINF, mi, g.const(0.0))
        li = (xs - safe).exp().sum(2)                       # [r, s]
        if rescale:
            m = mi.max(1, keepdim=True).reshape("r", 1, 1)
            li = li * (safe - m).exp().reshape("r", "s")
        g.output(li.sum(1))
    return build


# -- wrong rules are rejected ------------------------------------------------

def test_exp_of_sum_is_not_sum_of_exps():
    v = check_rule(rule("exp-add-wrong", exp_of_sum, sum_of_exps))
    assert v.verdict == "unsound"
    assert "lhs=" in v.counterexample and "a[" in v.counterexample and "n=" in v.counterexample


def test_split_softmax_combine_without_rescale_is_rejected():
    v = check_rule(rule("combine-no-rescale", sum_exp_safe, split_sum_exp(rescale=False)))
    assert v.verdict == "unsound"
    assert "s=" in v.counterexample and "x[" in v.counterexample


def _bcast_split_lhs(g):
    y = g.input("y", ())
    g.output(y.broadcast_to(("N",)).split(0, "s", pad=0.0).sum(1).sum(0))


def _bcast_split_rhs(g):
    y = g.input("y", ())
    g.output(y.broadcast_to(("s", "ceiling(N/s)")).sum(1).sum(0))


def test_split_through_broadcast_without_mask_is_rejected_unless_count_divides():
    bad = check_rule(rule("split-bcast-nomask", _bcast_split_lhs, _bcast_split_rhs))
    assert bad.verdict == "unsound"
    assert "s=" in bad.counterexample
    ok = check_rule(rule("split-bcast-divides", _bcast_split_lhs, _bcast_split_rhs, [divides("s", "N")]))
    assert ok.verdict == "proven", ok.explain()


def test_shape_mismatch_is_a_z3_counterexample():
    def lhs(g):
        x = g.input("x", ("N",))
        g.output(x.split(0, "s", pad=0.0).sum(0))       # [cdiv(N, s)]

    def rhs(g):
        x = g.input("x", ("N",))
        g.output(x.split(0, "s", pad=0.0).sum(1))       # [s]

    v = check_rule(rule("wrong-shape", lhs, rhs))
    assert v.verdict == "unsound" and v.counterexample.startswith("shapes:")
    assert "N=" in v.counterexample


def test_split_without_pad_needs_divisibility():
    def lhs(g):
        g.output(g.input("x", ("N",)).sum(0))

    def rhs(g):
        g.output(g.input("x", ("N",)).split(0, "s").sum(1).sum(0))

    v = check_rule(rule("split-no-pad", lhs, rhs))
    assert v.verdict == "unsound" and "rhs constraint" in v.counterexample
    assert check_rule(rule("split-no-pad-divides", lhs, rhs, [divides("s", "N")])).verdict == "proven"


def test_max_pad_must_be_minus_inf():
    def lhs(g):
        g.output(g.input("x", ("N",)).max(0))

    def rhs(g):
        g.output(g.input("x", ("N",)).split(0, "s", pad=0.0).max(1).max(0))

    v = check_rule(rule("split-max-pad0", lhs, rhs))
    assert v.verdict == "unsound"


def test_require_sound_names_the_rule_and_counterexample():
    good = rule("exp-add", exp_of_sum, product_of_exps, f32_exempt=EXP_ADD_F32)
    bad = rule("exp-add-wrong", exp_of_sum, sum_of_exps)
    with pytest.raises(UnsoundRule, match=r"exp-add-wrong.*unsound.*lhs=.*rhs="):
        require_sound([good, bad])
    assert [v.verdict for v in require_sound([good])] == ["proven"]


# -- correct rules are proven ------------------------------------------------

def test_exp_of_sum_is_product_of_exps():
    v = check_rule(rule("exp-add", exp_of_sum, product_of_exps, f32_exempt=EXP_ADD_F32))
    assert v.verdict == "proven" and "z3" in v.method, v.explain()


def test_split_sum():
    def lhs(g):
        g.output(g.input("x", ("b", "N")).sum(1))

    def rhs(g):
        g.output(g.input("x", ("b", "N")).split(1, "s", pad=0.0).sum(2).sum(1))

    v = check_rule(rule("split-sum", lhs, rhs))
    assert v.verdict == "proven", v.explain()


def test_split_max_with_minus_inf_pad():
    def lhs(g):
        g.output(g.input("x", ("N",)).max(0))

    def rhs(g):
        g.output(g.input("x", ("N",)).split(0, "s", pad=NINF).max(1).max(0))

    v = check_rule(rule("split-max", lhs, rhs))
    assert v.verdict == "proven", v.explain()


def test_rescaled_split_softmax_combine():
    v = check_rule(rule("combine-rescaled", sum_exp_safe, split_sum_exp(rescale=True)))
    assert v.verdict == "proven", v.explain()


def test_unguarded_empty_chunk_gives_nan():
    """Without the guard, an empty chunk computes exp(-inf - -inf) = NaN."""
    def unguarded(g):
        x = g.input("x", ("r", "N"))
        xs = x.split(1, "s", pad=NINF)
        mi = xs.max(2, keepdim=True)
        m = mi.max(1, keepdim=True).reshape("r", 1, 1)
        g.output(((xs - mi).exp().sum(2) * (mi - m).exp().reshape("r", "s")).sum(1))

    v = check_rule(rule("combine-unguarded", sum_exp_safe, unguarded))
    assert v.verdict == "unsound" and "nan" in v.counterexample


def test_exp_separates():
    def lhs(g):
        x = g.input("x", ("r", "N"))
        g.output((x - x.max(1, keepdim=True)).exp())

    def rhs(g):
        x = g.input("x", ("r", "N"))
        g.output(x.exp() * (-x.max(1, keepdim=True)).exp())

    v = check_rule(rule("exp-separate", lhs, rhs, f32_exempt="exp(x) overflows where exp(x - max) does not"))
    assert v.verdict == "proven" and v.method == "z3", v.explain()


def test_matmul_row_scaling_commutes():
    """RMSNorm->MatMul: scaling rows before or after the MatMul."""
    def lhs(g):
        x, w = g.input("x", ("m", "k")), g.input("w", ("k", "n"))
        r = (x.square().sum(1, keepdim=True) + 1e-6).rsqrt()
        g.output((x * r) @ w)

    def rhs(g):
        x, w = g.input("x", ("m", "k")), g.input("w", ("k", "n"))
        r = (x.square().sum(1, keepdim=True) + 1e-6).rsqrt()
        g.output((x @ w) * r)

    v = check_rule(rule("rownorm-matmul", lhs, rhs))
    assert v.verdict == "proven", v.explain()


# -- bindings and cache ------------------------------------------------------

def test_split_cases_and_bindings_cover_them():
    assert [split_case(n, s) for n, s in [(6, 3), (5, 2), (6, 4), (3, 3), (2, 5)]] == \
        ["exact", "ragged", "empty-chunk", "count=N", "count>N"]
    inst = rule("split-sum", lambda g: g.output(g.input("x", ("N",)).sum(0)),
                lambda g: g.output(g.input("x", ("N",)).split(0, "s", pad=0.0).sum(1).sum(0)))
    prover, numeric = choose(inst)
    wanted = {"exact", "ragged", "empty-chunk", "count=N", "count>N"}
    assert {b.cases[0] for b in prover} == wanted
    assert {b.cases[0] for b in numeric} == wanted
    only_exact = RuleInstance("d", inst.lhs, inst.rhs, [divides("s", "N")])
    assert {b.cases[0] for b in choose(only_exact)[1]} <= {"exact", "count=N"}


def test_verdicts_are_cached_on_disk(tmp_path):
    from cleave.verify import verdict

    inst = rule("exp-add", exp_of_sum, product_of_exps, f32_exempt=EXP_ADD_F32)
    first = check_rule(inst)
    assert not first.cached and list((tmp_path / "verify").glob("*.json"))
    verdict.clear_memory()
    again = check_rule(inst)
    assert again.cached and again.verdict == first.verdict == "proven"
