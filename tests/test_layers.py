"""Whole transformer layers (benchmarks/models.py) through torch.compile(backend="cleave"):
GPT-2, Llama-3-8B and Qwen3-32B blocks at tiny widths under the interpreter, served at
three sequence lengths from one compile; the Llama block at its real widths scheduled
(not run) within its kernel budget; a small whole model's logits against eager fp32."""
from __future__ import annotations

import copy
import math
import pathlib
import sys
import warnings

import pytest
import torch

import cleave
from cleave.runtime import backend
from cleave.scheduler.exprs import evaluate

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from benchmarks.models import TinyModel, config, layer_inputs, make_layer, rope  # noqa: E402

# The Llama block is eight kernels at most: RMSNorm statistics, the q and the k/v
# projections, attention, the o-projection with its residual, gate and up together,
# and the down projection with its residual (the two norms' statistics may share).
KERNEL_BUDGET = 8


@pytest.fixture
def ctx():
    torch._dynamo.reset()
    return backend.reset()


def _rel_err(got, want) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def _kernels(ctx) -> list[int]:
    return [len(spec.plans[0].kernels) for op in ctx.operators.values() for spec in op.specs.values()]


@pytest.mark.parametrize("name, naive", [("gpt2", False), ("llama3-8b", False), ("qwen3-32b", False),
                                         ("llama3-8b", True)])
def test_tiny_layer_compiles_once_for_three_lengths(ctx, name, naive):
    layer = make_layer(name, naive, tiny=True, dtype=torch.float32)
    compiled = torch.compile(layer, backend="cleave", dynamic=True)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for seq in (5, 9, 14):  # odd lengths, none a tile multiple
            inputs = layer_inputs(name, 2, seq, tiny=True, dtype=torch.float32, seed=seq)
            got, want = compiled(*inputs), layer(*inputs)
            assert got.shape == want.shape
            assert _rel_err(got, want) < 1e-5, f"{name} at seq {seq}"
    stats = ctx.stats()
    assert stats["graph_breaks"] == 0 and stats["unsupported"] == [] and stats["failed"] == 0, stats
    assert stats["operators"] == stats["searches"] == stats["compiles"] == 1, stats  # no recompile
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == 1  # dynamo did not recompile
    assert all(n <= KERNEL_BUDGET for n in _kernels(ctx)), _kernels(ctx)


@pytest.mark.parametrize("naive", [False, True], ids=["sdpa", "naive"])
def test_real_width_llama_layer_schedules_within_its_kernel_budget(naive):
    """Llama-3-8B's widths (D 4096, 32/8 heads, FF 14336) with batch and sequence
    dynamic, captured as the layer benchmark captures it (the backend's lowering of CPU
    tensors; nothing runs), searched and scheduled. Its intermediates are activations in
    bf16 (eager's dtype), the normed rows stored once, and keys and values stored per kv
    head, not once per query head (repeat_kv)."""
    from benchmarks.layers import capture
    from cleave.search.validate import CandidateCheckSkipped

    graph, sources = capture("llama3-8b", naive)
    x = graph.inputs[next(p for p, s in sources.items() if s == ("arg", 0))]
    batch, seq = (str(d) for d in x.shape[:2])
    with warnings.catch_warnings():
        # 4096-wide weights are too large to interpret: the candidate rests on its proofs
        warnings.simplefilter("ignore", CandidateCheckSkipped)
        best = cleave.search(graph, top_k=2, progress=False).best
    # both forms reach the online softmax: the division after P@V, one pass over the keys
    assert "normalize-after-matmul" in best.derivation or not naive, best.derivation
    env = {batch: 2, seq: 2048}
    plans = cleave.schedule(best, env, dynamic={batch, seq}, top_k=2)
    assert plans and all(len(p.kernels) <= KERNEL_BUDGET for p in plans), [len(p.kernels) for p in plans]
    inter = plans[0].intermediates
    sizes = {b.name: math.prod(evaluate(d, env) for d in b.shape) for b in inter}
    # activations in bf16; only a kv-head tensor may keep f32 (taken before a cast to
    # bf16 that follows repeat_kv's expand: a quarter of the elements)
    assert all(b.dtype == "bf16" or sizes[b.name] <= 2 * 2048 * 1024 for b in inter), \
        [(b.name, b.dtype, sizes[b.name]) for b in inter]
    assert max(sizes.values()) <= 2 * 2048 * 14336, sizes  # nothing s x s
    assert sum(n == 2 * 2048 * 4096 for n in sizes.values()) >= 4, sizes  # normed rows, q, attention, o
    kv = [n for n in sizes.values() if n < 2 * 2048 * 4096]
    assert kv and all(n <= 2 * 2048 * 1024 for n in kv), sizes  # keys and values: 8 heads, not 32
    reads = {a for k in plans[0].kernels for a in k.args}
    assert any(n.rank == 2 and n.shape == (14336, 4096) for n in graph.inputs.values())
    assert {n for n, node in graph.inputs.items() if node.rank == 2} <= reads  # every weight is read


def test_tiny_model_logits_match_eager_fp32_and_explain_reports_passes(ctx, tmp_path, monkeypatch):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))  # a cold compile: every pass runs
    torch.manual_seed(0)
    cfg = config("llama3-8b", tiny=True)
    model = TinyModel(cfg, layers=1).requires_grad_(False).eval()
    compiled = torch.compile(model, backend="cleave", dynamic=True)
    tokens = torch.randint(0, 96, (2, 7))
    cos, sin = rope(7, cfg.head_dim)
    report = cleave.explain(compiled, tokens, cos, sin)
    assert report.operators and report.stats["failed"] == 0 and report.graph_breaks == 0, report.stats
    (logits,) = report.fidelity
    assert logits["max_abs"] < 1e-4 and 0 <= logits["kl"] < 1e-9, logits
    passes = {"decompose", "translate", "search", "schedule", "codegen"}
    assert passes <= set(report.pass_seconds), report.pass_seconds
    text = str(report)
    assert "compile time per pass: decompose" in text and "against eager fp32: max abs diff" in text


def test_a_stack_of_layers_is_cut_at_its_residual_stream_and_matches_eager_fp32(ctx, tmp_path, monkeypatch):
    """Three Llama layers and the LM head: uncut, each layer would be recomputed under
    the four tile maps the one above reads it with (4^3 copies of the lowest). The
    partitioner cuts the residual stream between the layers first, each layer then
    schedules as a single one does, and the logits match eager fp32 at two lengths."""
    from cleave.scheduler import partition as part

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    layers = 3
    torch.manual_seed(0)
    cfg = config("llama3-8b", tiny=True)
    model = TinyModel(cfg, layers=layers).requires_grad_(False).eval()
    found = []
    cut = part.segment_cuts

    def spy(graph, *args, **kwargs):
        found.append((graph, frozenset(cut(graph, *args, **kwargs))))
        return set(found[-1][1])

    monkeypatch.setattr(part, "segment_cuts", spy)
    compiled = torch.compile(model, backend="cleave", dynamic=True)
    reference = copy.deepcopy(model).double()
    with torch.no_grad():
        for seq in (7, 12):
            tokens = torch.randint(0, 96, (2, seq))
            got = compiled(tokens, *rope(seq, cfg.head_dim))
            want = reference(tokens, *(t.double() for t in rope(seq, cfg.head_dim)))
            assert _rel_err(got, want) < 1e-4, seq
    stats = ctx.stats()
    assert stats["graph_breaks"] == 0 and stats["failed"] == 0 and stats["compiles"] == 1, stats
    graph, cuts = found[0]
    # the hidden state after every layer and between attention and MLP, but the lowest
    # layer's middle one, which nothing below compounds under
    assert len(cuts) == 2 * layers - 1 and all(graph.nodes[i].op == "add" for i in cuts), cuts
    assert _kernels(ctx) and all(n <= layers * KERNEL_BUDGET + 2 for n in _kernels(ctx)), _kernels(ctx)


def test_a_kernel_past_its_instance_budget_is_cut_between_layers_or_named_in_the_error(monkeypatch):
    """MAX_INSTANCES bounds one kernel's walk: past it, the partitioner cuts every segment
    boundary (the lowest layer's too) and tries again; a graph with none says which
    graph and which budget, instead of walking on."""
    from cleave import workloads
    from cleave.ir import CleaveError
    from cleave.scheduler import partition as part

    graph = workloads.get("rmsnorm_matmul").graph  # no residual stream to cut
    monkeypatch.setattr(part, "MAX_INSTANCES", 3)
    with pytest.raises(CleaveError, match=r"rmsnorm_matmul derives more than 3 tile instances"):
        cleave.schedule(graph, {"s": 64, "k": 96, "n": 80}, top_k=1)


def test_projection_back_to_batch_and_sequence_tiles_its_rows_as_a_gemm():
    """x + (h.view(b*s, k) @ w).view(b, s, n), a layer's residual projection: the output
    kernel indexes rows as b*s + s', which tiles s' (a tl.dot over 16+ rows), not one
    row per program; and the flatten-then-unflatten index folds to b and s'."""
    def residual_projection(x, h, w):
        return x + (h.reshape(-1, h.shape[-1]) @ w).reshape(x.shape)

    f = cleave.compile(residual_projection, dynamic={"x": {0: "b", 1: "s"}, "h": {0: "b", 1: "s"}})
    gen = torch.Generator().manual_seed(3)
    for b, s in ((2, 37), (3, 20)):
        x, h, w = (torch.randn(*shape, generator=gen) for shape in ((b, s, 48), (b, s, 40), (40, 48)))
        out = torch.full_like(x, float("nan"))
        out.copy_(f(x, h, w))
        assert _rel_err(out, residual_projection(x.double(), h.double(), w.double())) < 1e-5
    (op,) = f.operators
    (kernel,) = [k for spec in op.specs.values() for k in spec.plans[0].kernels]
    assert "tl.dot" in kernel.source and "// s" not in kernel.source, kernel.source
