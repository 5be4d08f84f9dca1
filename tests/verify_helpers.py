"""Shared by the verifier's tests: a cold verdict cache per test, rules built
directly as IR graph pairs, and the exp laws' sides they are built from."""
import pytest

from cleave.ir import Graph, RuleInstance


@pytest.fixture
def fresh_verify_cache(tmp_path, monkeypatch):
    from cleave.verify import verdict

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    verdict.clear_memory()


def make_rule(name, build_lhs, build_rhs, conditions=(), f32_exempt=""):
    lhs, rhs = Graph(f"{name}_lhs"), Graph(f"{name}_rhs")
    build_lhs(lhs)
    build_rhs(rhs)
    return RuleInstance(name, lhs, rhs, list(conditions), f32_exempt=f32_exempt)


# exp(a + b) => exp(a) * exp(b), the tests' rule exact in the reals: in f32 the factors
# overflow apart (exp(90) * exp(-85) is inf * 0), so it declares itself exempt from the f32 leg
EXP_ADD_F32 = "exp(a) and exp(b) overflow apart where exp(a + b) does not"


def exp_of_sum(g):
    a, b = g.input("a", ("n",)), g.input("b", ("n",))
    g.output((a + b).exp())


def sum_of_exps(g):
    a, b = g.input("a", ("n",)), g.input("b", ("n",))
    g.output(a.exp() + b.exp())


def product_of_exps(g):
    a, b = g.input("a", ("n",)), g.input("b", ("n",))
    g.output(a.exp() * b.exp())
