"""Hand-written stand-ins for search output: rewritten graphs like those the search
derives, with the Separable facts it proves, so that scheduler tests run without a
search (test_scheduler checks each against its workload's naive graph). Each builder
returns a Candidate over a renumbered graph (fact ids = printed ids)."""
from __future__ import annotations

from cleave.ir import Candidate, Graph, Separable, rebuild
from cleave.workloads.attention import NEG_INF, _rope, scale

EXP = "exp(y_old - y_new)"


def _cand(g: Graph, pairs) -> Candidate:
    """Renumber, then translate (F node, factor node) pairs to printed ids."""
    order = list(g.inputs.values()) + [n for n in g.live_nodes() if n.op != "input"]
    ids = {n.id: k for k, n in enumerate(order)}
    facts = [Separable(ids[f.id], ids[y.id], rule, "rescale_exp") for f, y, rule in pairs]
    return Candidate(rebuild(g), facts, ["stand-in"])


def _online_softmax_av(scores, v):
    """Division moved after the V MatMul: (exp(S - m) @ v) / sum(exp(S - m))."""
    m = scores.max(-1, keepdim=True)
    e = (scores - m).exp()
    return (e.cast("bf16") @ v) / e.sum(-1, keepdim=True), e, m


def attention(name: str, causal: bool, grouped: bool, rope: bool = False) -> Candidate:
    g = Graph(name)
    if grouped:
        q = g.input("q", ("b", "hkv*g", "s", "d"), "bf16")
        k = g.input("k", ("b", "hkv", "s", "d"), "bf16")
        v = g.input("v", ("b", "hkv", "s", "d"), "bf16")
        qg, kg, vg = q.reshape("b", "hkv", "g", "s", "d"), k.unsqueeze(2), v.unsqueeze(2)
    else:
        qg = g.input("q", ("b", "h", "s", "d"), "bf16")
        kg = g.input("k", ("b", "h", "s", "d"), "bf16")
        vg = g.input("v", ("b", "h", "s", "d"), "bf16")
    if rope:
        cos, sin = g.input("cos", ("s", "d"), "f32"), g.input("sin", ("s", "d"), "f32")
        qg, kg = _rope(g, qg, cos, sin), _rope(g, kg, cos, sin)
    scores = (qg @ kg.T).cast("f32") * scale(g, "d")
    if causal:
        i, j = g.iota(("s", "s"), axis=0), g.iota(("s", "s"), axis=1)
        scores = g.add("where", j <= i, scores, g.const(NEG_INF))
    o, e, m = _online_softmax_av(scores, vg)
    o = o.cast("bf16")
    if grouped:
        o = o.reshape("b", "hkv*g", "s", "d")
    g.output(o, names=["o"])
    return _cand(g, [(e, m, EXP)])


def _split_softmax_av(g, scores, v, axis_scores, axis_v):
    """Per-chunk max, sum and partial output over a Split of the kv axis, then a combine
    over the chunk axis rescaled by exp(m_i - m) (FlashDecoding)."""
    sc = scores.split(axis_scores, "sp", pad=NEG_INF)  # [..., sp, C]
    vs = v.split(axis_v, "sp", pad=0.0)  # [..., sp, C, d]
    m_i = sc.max(-1, keepdim=True)
    e = (sc - m_i).exp()
    l_i = e.sum(-1, keepdim=True)
    # bring the chunk axis in front of the rows: [..., rows, sp, C] -> [..., sp, rows, C]
    r = e.rank
    perm = list(range(r - 3)) + [r - 2, r - 3, r - 1]
    o_i = e.cast("bf16").permute(*perm) @ vs  # [..., sp, rows, d]
    m_t, l_t = m_i.permute(*perm), l_i.permute(*perm)  # [..., sp, rows, 1]
    m = m_t.max(-3, keepdim=True)
    w = (m_t - m).exp()
    o = (o_i.cast("f32") * w).sum(-3) / (l_t * w).sum(-3)
    return o, [(e, m_i, EXP), (w, m, EXP)]


def gqa_decode(name: str = "gqa_decode") -> Candidate:
    g = Graph(name)
    q = g.input("q", ("b", "hkv*g", 1, "d"), "bf16")
    k = g.input("k", ("b", "hkv", "L", "d"), "bf16")
    v = g.input("v", ("b", "hkv", "L", "d"), "bf16")
    qg = q.reshape("b", "hkv", "g", "d")
    scores = (qg @ k.T).cast("f32") * scale(g, "d")  # [b, hkv, g, L]
    o, facts = _split_softmax_av(g, scores, v, 3, 2)  # [b, hkv, g, d]
    g.output(o.cast("bf16").reshape("b", "hkv*g", 1, "d"), names=["o"])
    return _cand(g, facts)


def mla_decode() -> Candidate:
    g = Graph("mla_decode")
    q_nope = g.input("q_nope", ("b", "h", "c"), "bf16")
    q_pe = g.input("q_pe", ("b", "h", "r"), "bf16")
    ckv = g.input("ckv", ("b", "L", "c"), "bf16")
    kpe = g.input("kpe", ("b", "L", "r"), "bf16")
    scores = (q_nope @ ckv.T).cast("f32") + (q_pe @ kpe.T).cast("f32")
    scores = scores * g.add("size", value="c+r", dtype="f32").rsqrt()  # [b, h, L]
    o, facts = _split_softmax_av(g, scores, ckv, 2, 1)
    g.output(o.cast("bf16"), names=["o"])
    return _cand(g, facts)


def rmsnorm_matmul() -> Candidate:
    """The row scale moved past the MatMul: (x @ w) * rsqrt(mean(x^2) + eps)."""
    g = Graph("rmsnorm_matmul")
    x = g.input("x", ("s", "k"), "bf16")
    w = g.input("w", ("k", "n"), "bf16")
    xf = x.cast("f32")
    rms = (xf.square().mean(-1, keepdim=True) + 1e-6).rsqrt()
    g.output(((x @ w).cast("f32") * rms).cast("bf16"), names=["y"])
    return _cand(g, [])


def layernorm() -> Candidate:
    """One pass: var = E[x^2] - E[x]^2 (sum and sum of squares share the row)."""
    g = Graph("layernorm")
    x = g.input("x", ("t", "n"), "bf16")
    xf = x.cast("f32")
    mean = xf.mean(-1, keepdim=True)
    var = xf.square().mean(-1, keepdim=True) - mean.square()
    g.output(((xf - mean) * (var + 1e-5).rsqrt()).cast("bf16"), names=["y"])
    return _cand(g, [])


def moe_routing(top: int = 8) -> Candidate:
    """Top-k on the logits, then softmax over the k winners only."""
    g = Graph("moe_routing")
    logits = g.input("logits", ("t", "e"), "f32")
    vals = g.add("topk", logits, k=top, axis=1, which="values")
    idx = g.add("topk", logits, k=top, axis=1, which="indices")
    m = vals.max(-1, keepdim=True)
    ex = (vals - m).exp()
    g.output(ex / ex.sum(-1, keepdim=True), idx, names=["weights", "experts"])
    return _cand(g, [])


def matmul_rowsum() -> Candidate:
    """Split of the summed columns so the rows x chunks grid fills the GPU."""
    g = Graph("matmul_rowsum")
    x = g.input("x", ("s", "k"), "bf16")
    w = g.input("w", ("k", "n"), "bf16")
    y = (x @ w).cast("f32").split(1, "sp", pad=0.0).sum(-1).sum(-1)
    g.output(y, names=["y"])
    return _cand(g, [])


def swiglu() -> Candidate:
    from cleave.workloads import get

    return _cand(get("swiglu").graph, [])


CANDIDATES = {
    "mha": lambda: attention("mha", False, False),
    "mha_causal": lambda: attention("mha_causal", True, False),
    "gqa": lambda: attention("gqa", False, True),
    "gqa_causal": lambda: attention("gqa_causal", True, True),
    "rope_attention_causal": lambda: attention("rope_attention_causal", True, False, rope=True),
    "gqa_decode": lambda: gqa_decode("gqa_decode"),
    "mqa_decode": lambda: gqa_decode("mqa_decode"),
    "mla_decode": mla_decode,
    "rmsnorm_matmul": rmsnorm_matmul,
    "swiglu": swiglu,
    "layernorm": layernorm,
    "moe_routing": moe_routing,
    "matmul_rowsum": matmul_rowsum,
}
