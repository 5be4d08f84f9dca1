"""The forms the search must reach, by structure, plus snapshots and a tampered candidate.

The search runs with its soundness gate: only verified rules are loaded.
Regenerate snapshots with `CLEAVE_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_search_forms.py`.
"""
import os
from pathlib import Path

import pytest
import torch

import cleave.workloads as W
from cleave.interpreter import interpret
from cleave.ir.text import parse_graph
from cleave.search import CandidateMismatch, check_candidate, search
from cleave.search.validate import compared_values, inputs_for

SNAPSHOTS = Path(__file__).parent / "snapshots"


_cache = {}


def best(name, k=3):
    if name not in _cache:
        _cache[name] = search(W.get(name).graph, top_k=k, progress=False)
    return _cache[name].best


def _ops(g, kind, **attrs):
    return [n for n in g.live_nodes() if n.op == kind and all(n.attrs.get(k) == v for k, v in attrs.items())]


def _base(n):
    while n.op in ("cast", "reshape", "permute"):
        n = n.inputs[0]
    return n


def _upstream(n) -> set:
    seen, stack = set(), [n]
    while stack:
        x = stack.pop()
        if x.id not in seen:
            seen.add(x.id)
            stack.extend(x.inputs)
    return seen


@pytest.mark.parametrize("name,axis_extent", [("gqa_decode", "L"), ("mla_decode", "L")])
def test_split_kv_flash_decoding(name, axis_extent):
    g = W.get(name).graph
    c = best(name)
    cg = c.graph
    splits = [s for s in _ops(cg, "split") if str(s.inputs[0].shape[s.attrs["axis"]]) == axis_extent]
    assert splits and {str(s.attrs["count"]) for s in splits} == {f"s_{axis_extent}"}
    scores = [s for s in splits if s.attrs["pad"] == float("-inf")]
    assert scores, "the scores' max path is padded with -inf"
    # per-chunk max m_i over the chunk axis of the split scores
    chunk_max = [m for m in _ops(cg, "reduce", op="max") if _base(m.inputs[0]).op == "split"
                 and m.attrs["axis"] == m.rank - 1]
    assert chunk_max
    m_i = chunk_max[0]
    m = [x for x in _ops(cg, "reduce", op="max") if x.inputs[0] is m_i]
    assert m, "the combine takes the max over the chunk maxima"
    # the combine rescales by exp(m_i - m) (m_i read as 0 where the chunk is all -inf),
    # and nothing reduces over the whole of L
    rescale = [e for e in _ops(cg, "exp") if e.inputs[0].op == "sub"
               and e.inputs[0].inputs[0].op == "inf_to_zero" and e.inputs[0].inputs[0].inputs[0] is m_i
               and e.inputs[0].inputs[1] is m[0]]
    assert rescale
    assert not [r for r in _ops(cg, "reduce") if str(r.inputs[0].shape[r.attrs["axis"]]) == axis_extent]
    factors = {f.factor for f in c.facts}
    assert m_i.id in factors and m[0].id in factors, "separable facts for the chunk loop and the combine"
    env = {"b": 2, "hkv": 2, "g": 3, "d": 16, "h": 3, "c": 16, "r": 8, "L": 77, "s_L": 5}  # chunks 16,16,16,16,13
    env = {s.name: env[s.name] for s in cg.symbols()}
    ins = inputs_for(g, env, seed=5)
    want, got = compared_values(g, ins, env)[0], compared_values(cg, ins, env)[0]
    assert torch.allclose(want, got, rtol=1e-9, atol=1e-9)


def test_rmsnorm_row_scale_after_matmul():
    g = W.get("rmsnorm_matmul").graph
    c = best("rmsnorm_matmul")
    cg = c.graph
    (rsqrt,) = _ops(cg, "rsqrt")
    for mm in _ops(cg, "matmul"):
        assert rsqrt.id not in _upstream(mm), "the row scale must not feed the MatMul"
    out = _base(cg.outputs[0])
    assert out.op == "mul" and rsqrt.id in _upstream(out)
    assert any(_ops(cg, "matmul")[0].id in _upstream(x) for x in out.inputs)
    x = cg.inputs["x"]
    # both reductions over k read the same x (the same split of it, if split)
    readers = {n.id for n in cg.live_nodes() if x in n.inputs}
    assert len(readers) <= 2 and "rowscale-after-matmul" in c.derivation
    check_candidate(g, cg)


def test_rope_stays_a_prologue_and_div_follows_pv():
    g = W.get("rope_attention_causal").graph
    cg = best("rope_attention_causal").graph
    qk, pv = _ops(cg, "matmul")
    for operand in qk.inputs:
        ups = [cg.nodes[i] for i in _upstream(operand)]
        assert not [u for u in ups if u.op in ("matmul", "reduce")], "RoPE operands are elementwise only"
        assert {"cos", "sin"} <= {u.attrs.get("name") for u in ups if u.op == "input"}
    div = _base(cg.outputs[0])
    assert div.op == "div" and pv.id in _upstream(div.inputs[0])
    check_candidate(g, cg)


@pytest.mark.parametrize("name", ["mha_causal", "moe_routing"])
def test_snapshot_of_best_candidate(name):
    text = best(name).graph.text()
    path = SNAPSHOTS / f"search_{name}.txt"
    if os.environ.get("CLEAVE_UPDATE_SNAPSHOTS"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} best candidate changed; see the docstring to regenerate"


def test_tampered_candidate_raises_with_both_graphs():
    g = W.get("gqa_decode").graph
    text = best("gqa_decode").graph.text()
    # (the combine's max may be swapped for any shift: exp(m_i - m) cancels between o and l;
    # a chunk sum may not)
    assert 'op="sum", axis=4' in text
    tampered = parse_graph(text.replace('op="sum", axis=4', 'op="max", axis=4', 1))
    with pytest.raises(CandidateMismatch) as err:
        check_candidate(g, tampered)
    msg = str(err.value)
    assert "--- input graph ---" in msg and "--- candidate ---" in msg and 'op="max", axis=4' in msg
    assert g.text() in msg


def test_captured_causal_attention_ranks_the_fused_softmax_first():
    """Captured from PyTorch, self-attention's s is both the query rows (kept) and the
    keys (reduced): ranked with s short, the two-pass softmax looked cheaper than
    normalizing after the second matmul, and the runtime compiled it."""
    from cleave import capture

    w = W.get("gqa_causal")
    args = [torch.empty(s, dtype=torch.bfloat16, device="meta")
            for s in ([2, 32, 134, 128], [2, 8, 134, 128], [2, 8, 134, 128])]
    g = capture(w.reference, *args, dynamic=w.dynamic)
    assert "normalize-after-matmul" in search(g, top_k=2, progress=False).best.derivation
