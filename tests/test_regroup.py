"""regroup_repeated_operands: GQA/MQA written by repeating K/V heads becomes one matmul
per kv head (the DSL's grouped form), computing the same values in fp64; the search
then finds FlashDecoding on the captured decode graph."""
import importlib
import math

import pytest
import torch
import torch.nn.functional as F

import cleave
from cleave import workloads
from cleave.frontends.regroup import regroup_repeated_operands
from cleave.interpreter import interpret
from cleave.ir import Graph
from cleave.ir import dims as Dims

F64 = torch.float64
CAPTURE = importlib.import_module("cleave.frontends.capture")  # the module; the package exports the function
HKV, G, D, B = 2, 3, 16, 3


def _raw_capture(monkeypatch, fn, *inputs, dynamic):
    """The captured graph before the pass (capture applies it last)."""
    with monkeypatch.context() as m:
        m.setattr(CAPTURE, "regroup_repeated_operands", lambda g: g)
        return cleave.capture(fn, *inputs, dynamic=dynamic)


def _feeds_matmul_repeated(graph: Graph) -> bool:
    """A broadcast reaching a matmul operand through reshapes and permutes."""
    for n in graph.live_nodes():
        if n.op != "matmul":
            continue
        for x in n.inputs:
            while x.op in ("reshape", "permute"):
                x = x.inputs[0]
            if x.op == "broadcast":
                return True
    return False


def _assert_same_values(before: Graph, after: Graph, inputs: dict):
    got = interpret(after, inputs, compute_dtype=F64)
    want = interpret(before, inputs, compute_dtype=F64)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-9, atol=1e-9)


def _repeat_kv(x, n_rep):  # transformers' repeat_kv
    b, h, n, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, n, d).reshape(b, h * n_rep, n, d)


def _hf_attention(q, k, v, mask):
    """Sequence-major q, expand+reshape repeat, an additive padding mask."""
    q = q.transpose(1, 2)
    k, v = _repeat_kv(k, q.shape[1] // k.shape[1]), _repeat_kv(v, q.shape[1] // v.shape[1])
    scores = (q @ k.transpose(2, 3)).float() / math.sqrt(q.shape[-1]) + mask
    o = torch.softmax(scores, dim=-1).to(q.dtype) @ v
    return o.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def _sdpa(causal):
    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return attn


def _randn(*shape):
    return torch.randn(*shape).bfloat16()


def _decode(name, q_heads, kv_heads):
    w = workloads.get(name)
    shapes = ([B, q_heads, 1, D], [B, kv_heads, 37, D], [B, kv_heads, 37, D])
    return w.reference, [_randn(*s) for s in shapes], w.dynamic


CASES = {
    "gqa_decode": lambda: _decode("gqa_decode", HKV * G, HKV),
    "mqa_decode": lambda: _decode("mqa_decode", 5, 1),
    "gqa_prefill": lambda: (workloads.get("gqa").reference,
                            [_randn(B, HKV * G, 37, D)] + [_randn(B, HKV, 37, D) for _ in "kv"],
                            workloads.get("gqa").dynamic),
    "repeat_kv": lambda: (_hf_attention, [_randn(B, 5, HKV * G, D), _randn(B, HKV, 37, D), _randn(B, HKV, 37, D),
                                          torch.randn(B, 1, 1, 37)],
                          {"k": {2: "L"}, "v": {2: "L"}, "mask": {3: "L"}}),
    "sdpa_gqa": lambda: (_sdpa(False), [_randn(B, HKV * G, 7, D), _randn(B, HKV, 37, D), _randn(B, HKV, 37, D)],
                         {"k": {2: "L"}, "v": {2: "L"}}),
    "sdpa_gqa_causal": lambda: (_sdpa(True), [_randn(B, HKV * G, 37, D)] + [_randn(B, HKV, 37, D) for _ in "kv"],
                                {n: {2: "s"} for n in "qkv"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_captured_repeats_become_grouped_matmuls_with_equal_values(monkeypatch, case):
    fn, inputs, dynamic = CASES[case]()
    raw = _raw_capture(monkeypatch, fn, *inputs, dynamic=dynamic)
    assert _feeds_matmul_repeated(raw)
    grouped = regroup_repeated_operands(raw)
    assert not _feeds_matmul_repeated(grouped)
    assert not any(n.op == "broadcast" and n.rank == 5 for n in grouped.live_nodes())
    assert (grouped.name, list(grouped.inputs), grouped.output_names) == (raw.name, list(raw.inputs), raw.output_names)
    assert cleave.capture(fn, *inputs, dynamic=dynamic).key() == grouped.key()  # capture applies the pass
    fresh = {name: torch.randn(x.shape, dtype=x.dtype) for name, x in zip(raw.inputs, inputs)}
    _assert_same_values(raw, grouped, fresh)


def test_captured_decode_has_the_dsl_graphs_grouped_form():
    """q reshaped once, two matmuls against k and v themselves, one reshape back."""
    w = workloads.get("gqa_decode")
    args = [torch.empty(s, dtype=torch.bfloat16, device="meta") for s in ([2, 32, 1, 128], [2, 8, 135, 128],
                                                                           [2, 8, 135, 128])]
    g = cleave.capture(w.reference, *args, dynamic=w.dynamic)
    ops = [n.op for n in g.live_nodes()]
    assert ops.count("reshape") == 2 and "broadcast" not in ops
    q, k, v = g.inputs.values()
    qk, pv = [n for n in g.live_nodes() if n.op == "matmul"]
    assert qk.inputs[0].op == "reshape" and qk.inputs[0].inputs[0] is q and qk.inputs[0].shape[-2] == 4
    assert qk.inputs[1].op == "permute" and qk.inputs[1].inputs[0] is k and pv.inputs[1] is v
    assert g.outputs[0].op == "reshape" and g.outputs[0].inputs[0] is pv


def _repeat(x, heads, groups):
    """The IR capture makes of repeat_interleave(groups, dim=1)."""
    b, _, n, d = x.shape
    wide = x.reshape(b, heads, 1, n, d).broadcast_to((b, heads, groups, n, d))
    return wide.reshape(b, f"{heads}*{groups}", n, d)


def _decode_dsl(mask_rows=None, extra_output=False, reduce_heads=False):
    """Attention on repeated k and v with symbolic heads and groups, built in the DSL."""
    g = Graph("repeated")
    q = g.input("q", ("b", "hkv*g", "m", "d"), "f32")
    k = g.input("k", ("b", "hkv", "L", "d"), "f32")
    v = g.input("v", ("b", "hkv", "L", "d"), "f32")
    kr, vr = _repeat(k, "hkv", "g"), _repeat(v, "hkv", "g")
    scores = (q @ kr.T) * 0.25
    if mask_rows:
        scores = scores + g.input("mask", (mask_rows, "L"), "f32")
    if reduce_heads:  # a reduction over the heads is not row-local: the region stops there
        scores = scores - scores.max(1, keepdim=True)
    m = scores.max(-1, keepdim=True)
    e = (scores - m).exp()
    o = (e / e.sum(-1, keepdim=True)) @ vr
    return g.output(*((o, kr) if extra_output else (o,)), names=["o", "k_rep"] if extra_output else ["o"])


@pytest.mark.parametrize("variant", [{}, {"mask_rows": "m"}, {"mask_rows": 1}, {"extra_output": True},
                                     {"reduce_heads": True}])
def test_symbolic_groups_and_partial_matches_keep_the_values(variant):
    raw = _decode_dsl(**variant)
    grouped = regroup_repeated_operands(raw)
    assert not _feeds_matmul_repeated(grouped)
    env = {"b": 3, "hkv": 2, "g": 3, "m": 5, "L": 37, "d": 16}
    gen = torch.Generator().manual_seed(0)
    inputs = {name: torch.randn([Dims.evaluate(s, env) for s in n.shape], generator=gen, dtype=F64)
              for name, n in raw.inputs.items()}
    _assert_same_values(raw, grouped, inputs)
    reshapes = sum(n.op == "reshape" for n in grouped.live_nodes())
    if variant.get("extra_output"):  # the repeated k is still an output; its matmul no longer reads it
        assert any(n.op == "broadcast" for n in grouped.live_nodes())
    elif not variant.get("reduce_heads"):
        assert reshapes == 2 + (variant.get("mask_rows") == "m") * 2  # q in, o out (+ v and k get a unit axis)
    # rows that an operand varies along (the mask, the heads' max) stay apart from the groups
    split = variant.get("mask_rows") == "m" or variant.get("reduce_heads", False)
    assert all(n.rank == 4 + split for n in grouped.live_nodes() if n.op == "matmul")


def test_graphs_without_repeats_are_returned_unchanged():
    for name in ("mha_causal", "gqa", "gqa_decode", "mla_decode", "layernorm"):
        g = workloads.get(name).graph
        assert regroup_repeated_operands(g) is g


def test_search_finds_flash_decoding_on_the_captured_decode():
    from cleave.scheduler import schedule
    from cleave.search.api import search

    w = workloads.get("gqa_decode")
    args = [torch.empty(s, dtype=torch.bfloat16, device="meta") for s in ([2, 32, 1, 128], [2, 8, 135, 128],
                                                                           [2, 8, 135, 128])]
    g = cleave.capture(w.reference, *args, dynamic=w.dynamic, name="reference_decode")
    cands = search(g, top_k=4, progress=False).candidates
    plans = schedule(cands[0], shapes={"b": 64, "L": 4096}, top_k=4)
    split = next(p for p in plans if p.split.get("s_L", 1) >= 2)
    first = split.kernels[0]
    assert "tl.dot(" in first.source
    assert 16 in [v for k, v in split.tiles.items() if k.startswith(first.name + ".")]  # the 4 q heads, padded


def test_tiled_heads_are_not_mistaken_for_repeated_ones(monkeypatch):
    """k.repeat(1, g, 1, 1) pairs q head j*H+h with kv head h: not the grouped form."""
    def tiled(q, k):
        return torch.softmax(q @ k.repeat(1, G, 1, 1).transpose(-2, -1), dim=-1)

    q, k = torch.randn(B, HKV * G, 5, D), torch.randn(B, HKV, 37, D)
    raw = _raw_capture(monkeypatch, tiled, q, k, dynamic=None)
    assert regroup_repeated_operands(raw) is raw
