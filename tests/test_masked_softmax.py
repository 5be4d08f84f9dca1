"""Softmax over scores that a mask set to -inf: whole chunks of a split, and whole
rows, can hold nothing but -inf (issue 14: a paged decode past its sequence length)."""
import pytest

from cleave.ir import Graph
from cleave.rules import all_rules, parse_rules
from cleave.search import check_candidate, search
from cleave.verify import check_rule
from verify_helpers import fresh_verify_cache  # noqa: F401  (fixture)

NINF = float("-inf")


def length_masked_decode() -> Graph:
    """One query row per head attends to keys [0, lens[b]) of its batch entry."""
    g = Graph("length_masked_decode")
    q = g.input("q", ("b", "h", "d"))
    k = g.input("k", ("b", "L", "d"))
    v = g.input("v", ("b", "L", "d"))
    lens = g.input("lens", ("b",), "i32")
    scores = q @ k.T                                                  # [b, h, L]
    keep = g.iota((1, 1, "L"), axis=2) < lens.reshape("b", 1, 1)
    masked = g.add("where", keep, scores, g.const(NINF))
    m = masked.max(-1, keepdim=True)
    e = (masked - m).exp()
    g.output((e / e.sum(-1, keepdim=True)) @ v, names=["o"])
    return g


@pytest.mark.parametrize("seed", [0, 1])
def test_split_softmax_candidates_agree_where_whole_chunks_are_masked(seed):
    g = length_masked_decode()
    found = search(g, top_k=4, progress=False)
    assert any(n.op == "split" for c in found.candidates for n in c.graph.live_nodes())
    for cand in found.candidates:  # lens in [0, 4) at L >= 5: masked chunks, and empty rows (NaN in both)
        for shapes in ({"b": 7, "h": 3, "d": 5, "L": 13}, {"b": 5, "h": 2, "d": 3, "L": 9}):
            check_candidate(g, cand.graph, shapes=shapes, seed=seed)


UNGUARDED = """
family rescale
rule split-softmax-sum-unguarded: rsum(exp(sub(x, c)), a) => squeeze(rsum(mul(rsum(exp(sub(split(x, a, -inf), rmax(split(x, a, -inf), a))), a), exp(sub(rmax(split(x, a, -inf), a), unsqueeze(c, a)))), a-1), a)
  if splittable(x, a) and flat(c, a) and nonempty(x, a)
  why: the library's rule before issue 14: each chunk shifted by its own max, -inf when a mask hid the whole chunk
"""


@pytest.mark.usefixtures("fresh_verify_cache")
def test_chunk_max_shift_is_refuted_where_a_mask_hides_a_whole_chunk():
    (rule,) = parse_rules(UNGUARDED)
    assert rule.instances()[0].masked == ("x",)
    v = check_rule(rule)
    assert v.verdict == "unsound", v.explain()
    assert "masked inputs" in v.counterexample and "-inf" in v.counterexample and "nan" in v.counterexample


@pytest.mark.usefixtures("fresh_verify_cache")
@pytest.mark.parametrize("name", ["split-softmax-sum", "split-softmax-matmul"])
def test_library_split_softmax_rules_hold_on_masked_scores(name):
    (rule,) = [r for r in all_rules() if r.name == name]
    assert "x" in rule.instances()[0].masked
    assert check_rule(rule).verdict == "proven"
