"""Search budgets under explosive rules: the search returns near its time budget, its
e-graph stays near its e-node budget, one BudgetWarning says what stopped it, and the
candidates it keeps are still correct."""
import time
import warnings
from types import SimpleNamespace

import pytest

import cleave.workloads as W
from cleave.rules import all_rules, with_files
from cleave.search import BudgetWarning, check_candidate, search
from cleave.search import extraction_cost as C
from cleave.search import regions
from cleave.search.encode import encode
from cleave.search.extract import explore, find_class, read
from cleave.search.saturate import Budgets, saturate
from cleave.verify import sound_rules

# Each proven, each explosive together: a rule that grows every exp, and associativity
# and commutativity of mul (millions of matches within ten iterations on attention).
EXPLOSIVE = """family mine phase rewrite

rule grow: exp(x) => mul(exp(x), const(1))
  why: x * 1 = x, forever
  rewrites: exp(x) with x[m, n]
  keeps: log(x) with x[m, n]

rule assoc: mul(mul(x, y), z) => mul(x, mul(y, z))
  why: associativity
  f32: a product of two subnormals underflows to 0 (then NaN against an inf) where the other order keeps it
  rewrites: mul(mul(x, y), z) with x[m, n], y[m, n], z[m, n]
  keeps: mul(x, y) with x[m, n], y[m, n]

rule comm: mul(x, y) => mul(y, x)
  why: commutativity
  rewrites: mul(x, y) with x[m, n], y[m, n]
  keeps: add(x, y) with x[m, n], y[m, n]
"""


@pytest.fixture(scope="module")
def explosive_rules(tmp_path_factory):
    path = tmp_path_factory.mktemp("rules") / "explosive.rules"
    path.write_text(EXPLOSIVE)
    rules, _ = with_files([str(path)])
    return sound_rules(rules)  # proven once here: the timed searches below find them cached


def _budget_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, BudgetWarning)]


@pytest.mark.parametrize("enodes", [2000, 5000])  # 5000 ran past 600 s (a DFS per pair of regions)
def test_explosive_rules_return_near_the_time_budget_with_one_warning(explosive_rules, enodes):
    g = W.get("mha_causal").graph
    seconds = 1.0
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = search(g, top_k=1, rules=explosive_rules, seconds=seconds, enodes=enodes, progress=False)
    assert time.monotonic() - start < 4 * seconds + 10
    (message,) = _budget_warnings(caught)
    assert "budget" in message and "returning the best of" in message
    assert res.stats["enodes"] <= 2 * enodes
    check_candidate(g, res.best.graph)  # raises CandidateMismatch with both graphs


def test_one_iteration_cannot_blow_past_the_e_node_budget(explosive_rules):
    """Unguarded, the iteration after 1.1k e-nodes made 4.1k, and 16k made 62k (in 45 s)."""
    enc = encode(W.get("mha_causal").graph)
    sat = saturate(enc, explosive_rules, Budgets(iterations=30, enodes=2000, seconds=30), progress=False)
    assert sat.enodes <= 2000 * 1.2
    assert "e-node budget 2000 nearly reached: held back assoc" in sat.stopped
    assert "e-node budget 2000" in sat.stop_note


def test_an_extraction_out_of_time_keeps_the_input_graph_and_says_so():
    g = W.get("mha_causal").graph
    enc = encode(g)
    sat = saturate(enc, sound_rules(all_rules()), Budgets(), progress=False)
    classes = read(sat.egraph)
    roots = [find_class(classes, t) for t in enc.outputs]
    env = C.representative(g, enc.reducible | g.reduced_symbols())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found, stop = explore(enc, classes, roots, env, seconds=0)
    (message,) = _budget_warnings(caught)
    assert "time budget ended the extraction" in message and "the input graph among them" in message
    assert g.key() in {r.final().graph.key() for r in found}
    assert stop == "the time budget ended the extraction early"


def test_an_extraction_cut_by_the_time_budget_is_in_the_stats(monkeypatch):
    """stats["stopped"] (and `cleave optimize --json`'s) said None where the time budget
    ended the extraction, though a BudgetWarning said it had."""
    import cleave.search.api as api

    monkeypatch.setattr(api, "explore", lambda *a, **k: explore(*a, **{**k, "seconds": 0}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BudgetWarning)
        res = search(W.get("gqa_decode").graph, top_k=3, progress=False)
    assert "the time budget ended the extraction early" in res.stats["stopped"]


def test_a_budget_hit_in_saturation_alone_warns_once():
    g = W.get("moe_routing").graph
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = search(g, iterations=1, progress=False)
    (message,) = _budget_warnings(caught)
    assert "iteration budget 1 reached" in message and res.stats["stopped"]
    check_candidate(g, res.best.graph)


def test_reaching_follows_cycles():
    def cls(*kids):  # one e-node reading `kids`
        return [SimpleNamespace(args=[("class", k) for k in kids])]

    # a -> b <-> c -> d ; e alone
    classes = {"a": cls("b"), "b": cls("c"), "c": cls("b", "d"), "d": cls(), "e": cls()}
    assert regions.reaching(classes, ["a", "b", "d", "e"]) == {"a": {"b", "d"}, "b": {"d"}, "d": set(), "e": set()}


def test_each_phase_has_the_iteration_budget(tmp_path):
    """A rule that never saturates in the rewrite phase spent the whole iteration budget
    there: split and cleanup never ran, and gqa_decode lost FlashDecoding's split."""
    rules = tmp_path / "grow.rules"
    rules.write_text("family probe phase rewrite\n\nrule add-zero-grow: exp(x) => exp(add(x, const(0)))\n"
                     "  why: x + 0 is x, and the rule never saturates\n")
    g = W.get("gqa_decode").graph
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = search(g, top_k=1, progress=False, rules=[str(rules)], iterations=4)
    (message,) = _budget_warnings(caught)
    assert "iteration budget 4 reached in phase rewrite before it saturated" in message
    assert "split-softmax-matmul" in res.best.derivation
