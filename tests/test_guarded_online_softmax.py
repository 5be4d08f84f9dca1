"""Online softmax under FlashInfer's empty-row guard (issue 14): a softmax whose row max
is written `where(m == -inf, 0, m)` (an empty request gives output 0, lse -inf) is
still separable in the running max, and the search's split of that max at count 1
(a max over one chunk) keeps it so: the ragged prefill's max, sum and P·V share one
loop over the keys, where they took two passes before."""
import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from cleave.ir import Graph
from cleave.search.extract import separable_facts
import ragged_prefill as R


def guarded_softmax() -> Graph:
    g = Graph("guarded_softmax")
    x = g.input("x", ("m", "n"), "f32")
    m = x.max(-1, keepdim=True)
    guard = g.add("where", g.add("eq", m, g.const(float("-inf"))), g.const(0.0), m)
    e = (x - guard).exp()
    g.output(e / e.sum(-1, keepdim=True), names=["p"])
    return g


def test_the_guarded_max_is_the_factor_of_exp():
    """exp(x - where(m == -inf, 0, m)) = exp(x)·exp(-m) for every finite m, and where m
    is -inf every term it rescales is exp(-inf) = 0: the fact names the max itself."""
    g = guarded_softmax()
    (fact,) = separable_facts(g, {"exp-sub-separate"})
    factor = next(n for n in g.live_nodes() if n.id == fact.factor)
    assert factor.op == "reduce" and factor.attrs["op"] == "max"


@pytest.mark.parametrize("with_fact", [True, False])
def test_ragged_prefill_runs_one_pass_over_the_keys_and_matches_fp64(with_fact):
    """The searched ragged prefill at split count 1: its max, sum and P·V accumulate in
    one loop over the keys (two without the fact), correct against the fp64
    interpreter on a layout with empty requests, into poisoned outputs."""
    cand = R.searched()
    if not with_fact:
        cand = dataclasses.replace(cand, facts=[])
    plan = R.schedule_at(cand)
    (kernel,) = [k for k in plan.kernels if R.kv_loops(k)]
    assert len(R.kv_loops(kernel)) == (1 if with_fact else 2), kernel.loops
    R.check(plan)
