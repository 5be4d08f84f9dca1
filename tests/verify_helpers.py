"""Shared by the verifier's tests: a cold verdict cache per test, rules built
directly as IR graph pairs, and the exp laws' sides they are built from."""
import pytest

from cleave.ir import Graph, RuleInstance


@pytest.fixture
def fresh_verify_cache(tmp_path, monkeypatch):
    from cleave.verify import verdict

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    verdict.clear_memory()


def make_rule(name, build_lhs, build_rhs, conditions=()):
    lhs, rhs = Graph(f"{name}_lhs"), Graph(f"{name}_rhs")
    build_lhs(lhs)
    build_rhs(rhs)
    return RuleInstance(name, lhs, rhs, list(conditions))


def exp_of_sum(g):
    a, b = g.input("a", ("n",)), g.input("b", ("n",))
    g.output((a + b).exp())


def sum_of_exps(g):
    a, b = g.input("a", ("n",)), g.input("b", ("n",))
    g.output(a.exp() + b.exp())


def product_of_exps(g):
    a, b = g.input("a", ("n",)), g.input("b", ("n",))
    g.output(a.exp() * b.exp())
