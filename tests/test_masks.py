"""Captured masks fold back into one compare (cleave/frontends/masks.py), so that
the scheduler sees a causal mask and skips the tiles above the diagonal."""
import torch

from cleave import capture, interpret
from cleave import workloads as W
from cleave.frontends.masks import simplify_masks
from cleave.ir import Graph


def _captured_style(n: int = 0) -> Graph:
    """`masked_fill(~ones(s, s, bool).tril(), -inf)` as capture spells it."""
    g = Graph("masked")
    x = g.input("x", ("r", "s", "s"), "f32")
    cols, rows = g.iota(("s", "s"), axis=1), g.iota(("s", "s"), axis=0)
    tril = g.add("where", g.add("le", cols, rows), g.add("broadcast", g.const(True, "bool"), shape=("s", "s")),
                 g.const(False, "bool"))
    masked = g.add("where", g.add("eq", tril, g.const(False, "bool")), g.const(float("-inf")), x)
    return g.output(masked.exp().sum(-1, keepdim=True), names=["y"])


def test_tril_and_masked_fill_fold_to_one_compare():
    g = _captured_style()
    out = simplify_masks(g)
    ops = [n.op for n in out.live_nodes()]
    assert "eq" not in ops and ops.count("where") == 1
    where = next(n for n in out.live_nodes() if n.op == "where")
    assert where.inputs[0].op == "le" and where.inputs[2].op == "const"  # where(j <= i, x, -inf)
    x = torch.randn(3, 7, 7, dtype=torch.float64)
    assert torch.equal(interpret(out, {"x": x})[0], interpret(g, {"x": x})[0])


def test_graph_without_the_pattern_is_returned_as_is():
    g = W.get("gqa_causal").graph
    assert simplify_masks(g) is g


def test_captured_causal_attention_has_the_plain_mask():
    w = W.get("gqa_causal")
    args = [torch.empty(s, dtype=torch.bfloat16, device="meta")
            for s in ([2, 32, 13, 16], [2, 8, 13, 16], [2, 8, 13, 16])]
    g = capture(w.reference, *args, dynamic=w.dynamic)
    (where,) = [n for n in g.live_nodes() if n.op == "where"]
    assert where.inputs[0].op == "le" and where.inputs[2].attrs["value"] == float("-inf")
    assert not [n for n in g.live_nodes() if n.dtype.value == "bool" and n.op in ("eq", "broadcast")]


def test_captured_causal_attention_skips_tiles_above_the_diagonal():
    """Search and schedule the captured graph, then run its one kernel against eager
    PyTorch in fp64 (not the captured graph) at two lengths of its dynamic s; and with V
    poisoned (NaN) from one tile length on: the rows before it stay exact only if the kv
    tiles above their diagonal are skipped, not loaded and masked (0 * NaN is NaN)."""
    from cleave.runtime.launch import launch
    from cleave.scheduler import schedule
    from cleave.search import search
    from cleave.workloads.attention import reference_attention
    from kernel_check import LOOPS, check_outputs

    w = W.get("gqa_causal")
    heads = (4, 2, 2)  # q, k, v
    args = [torch.empty([2, h, 134, 16], dtype=torch.bfloat16, device="meta") for h in heads]
    cand = search(capture(w.reference, *args, dynamic=w.dynamic), top_k=1, progress=False).best
    plan = schedule(cand, {"b": 2, "s": 134}, dynamic={"b", "s"}, target=LOOPS, top_k=1)[0]
    (kernel,) = plan.kernels
    assert "tl.minimum(s, " in kernel.source  # the kv loop stops at the program's diagonal
    block = max(plan.tiles.values())  # a multiple of every tile along s
    for s in (37, 2 * block + 34):
        gen = torch.Generator().manual_seed(s)
        q, k, v = (torch.randn(1, h, s, 16, generator=gen).bfloat16() for h in heads)
        want = reference_attention(q.double(), k.double(), v.double(), causal=True)
        check_outputs(launch(plan, {"q": q, "k": k, "v": v}), [want], f"causal attention at s={s}")
    poisoned = v.clone()
    poisoned[:, :, block:] = float("nan")
    got = launch(plan, {"q": q, "k": k, "v": poisoned})[0][:, :, :block]
    check_outputs([got], [want[:, :, :block]], f"rows before {block}, V poisoned from {block} on")
