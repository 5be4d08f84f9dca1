"""The candidate check and what happens when a candidate fails it.

- A MatMul fed by casts of f32 values to f16/bf16 and then row-summed: sum-of-matmul
  left X · (W 1) with one f16 and one f32 operand, the check counted X's cast as a
  rounding in the candidate but not in the input graph, and the whole function ran
  eagerly (CandidateMismatch). Where the MatMul rounds W itself (`w.half()` straight
  into it) the rewrite would sum W unrounded: it is left out there (`unrounded(w)`).
- A candidate that fails the check is left out with a warning naming its rules; the
  others, or the graph as written, still compile.
- A gather or take with constant indices along a dynamic axis (a channel shuffle):
  the check's small binding put the axis below the indices and the reference
  interpreter raised torch's index error; the binding now keeps them in range.
- The same for indices computed from sizes (`emb[logits.argmax(-1)]`, a greedy decode's
  next-token embedding; `y.gather(1, x.argmin(1, keepdim=True))`; `table[torch.arange(n) + 2]`):
  the binding put the vocab past the embedding's rows, the input graph could not be
  interpreted and every candidate was left out with a warning.
Each compile runs the real pipeline (Triton under TRITON_INTERPRET=1) at tiny shapes.
"""
from __future__ import annotations

import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

import cleave
import cleave.search.api as search_api
from cleave.interpreter import TORCH_DTYPES, interpret
from cleave.ir import Graph, parse_graph, rebuild
from cleave.runtime import backend
from cleave.search import CandidateMismatch, CandidateRejected, check_candidate, search
from cleave.search.validate import inputs_for, small_binding


@pytest.fixture(autouse=True)
def fresh_operators(tmp_path, monkeypatch):
    """An operator cache of its own (every function is searched, none loaded), holding
    the rule verdicts already proven (proving the library cold takes ~30 s)."""
    from cleave.storage import cache_dir

    if (cache_dir() / "verify").is_dir():
        shutil.copytree(cache_dir() / "verify", tmp_path / "verify")
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _close(got, want, tol):
    assert got.shape == want.shape and got.dtype == want.dtype
    err = (got.double() - want.double()).abs().max().item() / max(want.double().abs().max().item(), 1e-30)
    assert err <= tol, f"max error {err:.2e} over max |reference| (tolerance {tol:.0e})"


def _compiled(fn, *args, **options):
    """fn compiled by cleave.compile and called once; (result, compiled, cleave's warnings)."""
    f = cleave.compile(fn, verbose=False, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = f(*args)
    return got, f, [w for w in caught if issubclass(w.category, CandidateRejected) or "cleave" in str(w.message)]


def _derivation(f) -> list[str]:
    (op,) = f.operators
    (spec,) = op.specs.values()
    return spec.candidate.derivation


# -- mixed precision: a cast to f16 before a MatMul, then a row sum ------------------
def cast_then_rowsum(a, w):
    return (a.half() @ w.half().t()).sum(-1)


def cast_straight_into_matmul(a, w):
    return (a.half() @ w.half()).sum(-1)


def computed_w(a, w):
    return (a.half() @ (w * w).half()).sum(-1)


def autocast_linear_rowsum(a, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = F.linear(a, w)
    return y.sum(-1)


def test_a_cast_before_the_matmul_compiles_with_sum_of_matmul():
    a, w = _randn(5, 7, seed=0), _randn(3, 7, seed=1)
    got, f, caught = _compiled(cast_then_rowsum, a, w)
    _close(got, cast_then_rowsum(a, w), 2e-3)  # eager rounds each product to f16 before the sum
    assert f.stats["failed"] == 0 and not caught, [str(w.message) for w in caught]
    assert "sum-of-matmul" in _derivation(f)


def test_autocast_linear_then_rowsum_compiles():
    a, w = _randn(5, 7, seed=2), _randn(3, 7, seed=3)
    got, f, caught = _compiled(autocast_linear_rowsum, a, w)
    _close(got, autocast_linear_rowsum(a, w), 1e-2)
    assert f.stats["failed"] == 0 and not caught, [str(w.message) for w in caught]


def _with_every_rounding(graph: Graph, ins: dict, env: dict) -> list[torch.Tensor]:
    """The outputs with every narrowing cast rounding, MatMul operand precisions included."""
    values = interpret(graph, ins, torch.float64, env)
    return [v.to(TORCH_DTYPES[o.dtype]).double() for v, o in zip(values, graph.outputs)]


@pytest.mark.parametrize("fn, w_shape", [(cast_then_rowsum, (3, 7)), (cast_straight_into_matmul, (7, 3)),
                                         (computed_w, (7, 3))], ids=["transposed", "straight", "computed"])
def test_every_candidate_rounds_where_the_program_does(fn, w_shape):
    """A W that the MatMul itself rounds to f16 (`w.half()` feeding it) keeps the GEMM:
    moved into a row sum, W would be summed unrounded. Every candidate passes the check
    and, with every cast rounding, computes what the input graph computes."""
    g = cleave.capture(fn, _randn(5, 7, seed=4), _randn(*w_shape, seed=5))
    result = search(g, top_k=4, progress=False)
    rewritten = [c for c in result.candidates if "sum-of-matmul" in c.derivation]
    assert bool(rewritten) == (fn is cast_then_rowsum)  # W is a kept cast there (a transpose reads it)
    for cand in result.candidates:
        check_candidate(g, cand.graph)
        env = small_binding(g, cand.graph)
        ins = inputs_for(g, env, seed=6)
        for want, got in zip(_with_every_rounding(g, ins, env), _with_every_rounding(cand.graph, ins, env)):
            assert torch.equal(want, got), cand.derivation


def test_cast_straight_into_the_matmul_compiles():
    a, w = _randn(5, 7, seed=7), _randn(7, 3, seed=8)
    got, f, caught = _compiled(cast_straight_into_matmul, a, w)
    _close(got, cast_straight_into_matmul(a, w), 2e-3)
    assert f.stats["failed"] == 0 and not caught and "sum-of-matmul" not in _derivation(f)


# -- a candidate that fails the check ------------------------------------------------
def rowsum(x, w):
    return (x @ w).sum(-1)


def _failing_sum_of_matmul(monkeypatch):
    """The check, failing every candidate that took sum-of-matmul (its MatMul is X (W 1))."""
    real = search_api.Reference.check

    def check(self, cand, shapes=None):
        if any(n.op == "matmul" and n.shape[-1] == 1 for n in cand.live_nodes()):
            raise CandidateMismatch(f"candidate of {self.naive.name} differs (made to, by the test)")
        return real(self, cand, shapes)

    monkeypatch.setattr(search_api.Reference, "check", check)


def test_a_candidate_failing_the_check_leaves_the_others_compiling(monkeypatch):
    _failing_sum_of_matmul(monkeypatch)
    x, w = _randn(5, 7, seed=9), _randn(7, 3, seed=10)
    got, f, caught = _compiled(rowsum, x, w)
    _close(got, rowsum(x, w), 1e-5)
    assert f.stats["failed"] == 0 and f.stats["compiles"] == 1, f.stats
    assert "sum-of-matmul" not in _derivation(f)
    (warning,) = caught
    assert issubclass(warning.category, CandidateRejected) and "sum-of-matmul" in str(warning.message)


def test_the_graph_as_written_stands_in_when_every_candidate_fails(monkeypatch):
    def check(self, cand, shapes=None):
        raise CandidateMismatch("made to differ by the test")

    monkeypatch.setattr(search_api.Reference, "check", check)
    g = cleave.capture(rowsum, _randn(5, 7, seed=11), _randn(7, 3, seed=12))
    with pytest.warns(CandidateRejected, match="the graph as written stands in"):
        (only,) = search(g, top_k=3, progress=False).candidates
    assert only.derivation == [] and only.graph.key() == rebuild(g).key()


# -- constant indices along a dynamic axis -------------------------------------------
def channel_shuffle(x, groups=3):
    channels = 9
    perm = torch.arange(channels).view(groups, channels // groups).t().reshape(-1)
    return x[:, perm] * 2


def last_two_columns(x):
    return torch.gather(x, 1, (torch.arange(2) + 8).expand(x.shape[0], 2)) + 1


def column_nine(x):
    return torch.gather(x, 1, torch.tensor([[9]]).expand(x.shape[0], 1))


# column_nine's index is one scalar: its load's mask is widened to the tile, which the
# interpreter needs (scheduler/codegen.py `varies`; the kernel failed its first launch)
@pytest.mark.parametrize("fn, width", [(channel_shuffle, 9), (last_two_columns, 11), (column_nine, 10)])
def test_constant_indices_along_a_dynamic_axis_compile(fn, width):
    got, f, caught = _compiled(fn, _randn(3, width, seed=13), dynamic="all")
    assert f.stats["failed"] == 0 and not caught, [str(w.message) for w in caught]
    for rows, seed in ((3, 13), (5, 14)):
        x = _randn(rows, width, seed=seed)
        assert torch.equal(f(x), fn(x))


def test_a_channel_shuffle_under_torch_compile_dynamic_compiles():
    """The group count becomes a symbol g with 9 == g * floor(9 / g): the small binding
    takes the divisor of 9 nearest its value, and the column axis past the indices."""
    ctx = backend.reset()
    f = torch.compile(channel_shuffle, backend="cleave", dynamic=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        warnings.simplefilter("error", CandidateRejected)
        for rows, seed in ((3, 15), (5, 16)):
            x = _randn(rows, 9, seed=seed)
            assert torch.equal(f(x), channel_shuffle(x))
    st = ctx.stats()
    assert st["operators"] >= 1 and st["failed"] == 0, st


def test_the_small_binding_keeps_a_constant_index_in_range():
    g = cleave.capture(column_nine, _randn(3, 10, seed=17), dynamic="all")
    env = small_binding(g, g)
    assert env["x_1"] >= 10
    (cand,) = search(g, top_k=1, progress=False).candidates
    check_candidate(g, cand.graph)


def next_token_embedding(logits, emb):
    return emb[logits.argmax(-1)]


def gathered_at_argmin(x, y):
    return y.gather(1, x.argmin(1, keepdim=True))


def at_own_argmax(x):  # the indices' range reaches the axis they index: a bound that never holds
    return x.gather(1, x.argmax(1, keepdim=True)) * 2


def shifted_positions(x, table):
    return x + table[torch.arange(x.shape[0]) + 2]


@pytest.mark.parametrize("fn, shapes", [
    (next_token_embedding, [(3, 11), (11, 5)]),
    (gathered_at_argmin, [(3, 7), (3, 9)]),
    (shifted_positions, [(3, 5), (9, 5)]),
    (at_own_argmax, [(3, 7)]),
])
def test_indices_computed_from_sizes_stay_in_range_in_the_check(fn, shapes):
    args = [_randn(*s, seed=20 + i) for i, s in enumerate(shapes)]
    got, f, caught = _compiled(fn, *args, dynamic="all")
    assert not caught, [str(w.message) for w in caught]
    assert torch.equal(got, fn(*args))
    g = cleave.capture(fn, *args, dynamic="all")
    (cand,) = search(g, top_k=1, progress=False).candidates
    assert check_candidate(g, cand.graph) is not None


def last_eight_rows(q, kc, k):  # a sliding-window KV cache while it is shorter than the window
    kk = torch.cat([kc, k], 0)[-8:]
    return (q @ kk.t()).softmax(-1) @ kk


def test_the_small_binding_meets_a_bound_on_a_sum():
    """The capture's branch keeps s + t <= 8: values only scaled up never met it, and
    every candidate was left out (NoSmallBinding) with a warning at cleave's own line."""
    q, kc, k = _randn(2, 16, seed=4), _randn(3, 16, seed=5), _randn(1, 16, seed=6)
    g = cleave.capture(last_eight_rows, q, kc, k, dynamic={"kc": {0: "s"}, "k": {0: "t"}})
    env = small_binding(g, g)
    assert env["s"] + env["t"] <= 8
    with warnings.catch_warnings():
        warnings.simplefilter("error", CandidateRejected)
        f = cleave.compile(last_eight_rows, dynamic={"kc": {0: "s"}, "k": {0: "t"}})
        torch.testing.assert_close(f(q, kc, k), last_eight_rows(q, kc, k))


def test_a_bound_not_linear_in_its_sizes_is_left_to_the_scaling():
    """`s + floor(s / 2) <= 8` is no sum of sizes to lower: sympy's degree raised on it."""
    from cleave.ir import dims as D
    from cleave.ir.graph import Constraint
    from cleave.search.validate import _meet_linear

    env = {"s": 9, "t": 5}
    assert not _meet_linear(Constraint("le", D.dim("s + floor(s/2)"), D.dim(8), "probe"), env, {"s"})
    assert not _meet_linear(Constraint("le", D.dim("s*t"), D.dim(8), "probe"), env, {"s", "t"})
    assert _meet_linear(Constraint("le", D.dim("s + t"), D.dim(8), "probe"), env, {"s", "t"})
    assert env["s"] + env["t"] <= 8 and min(env.values()) >= 1


def test_an_index_bound_no_binding_meets_is_named():
    """A take of row 10**6 of a merged axis n*k: no small n, k reach it. The candidates
    are left out naming the op and the dim; the graph as written stands in."""
    g = Graph("far_row")
    x = g.input("x", ("n", "k"), "f32")
    rows = x.reshape(("n*k",))
    far = g.add("take", rows, g.const(10**6, "i64").reshape((1,)), axis=0)
    g.output(far * 2.0, names=["out"])
    named = r"take %\d+: constant indices 1000000\.\.1000000 along its operand's dim 0"
    with pytest.warns(CandidateRejected, match=named):
        (only,) = search(g, top_k=2, progress=False).candidates
    assert only.graph.key() == rebuild(g).key()


def far_element(x):
    return x.reshape(-1)[1000000:1000001] * 2.0


def test_a_candidate_left_out_under_the_runtime_is_said_at_the_callers_line():
    """It named cleave/runtime/operator.py, the runtime's call of the search."""
    x = _randn(1001, 1000, seed=7)
    with pytest.warns(CandidateRejected, match="NoSmallBinding") as said:
        out = cleave.compile(far_element, dynamic={"x": {0: "n", 1: "k"}})(x)
    assert torch.equal(out, far_element(x))
    assert {w.filename for w in said if w.category is CandidateRejected} == {__file__}


def rows_at_mask_positions(table, mask):
    return table[mask.long().cumsum(-1)] * 2


def test_indices_computed_from_integer_inputs_are_checked_where_the_program_runs():
    """Positions as a mask's cumsum index a table of 3 rows: random integers in the index
    range put them past it, the input graph failed in the reference interpreter and every
    candidate was left out (HF's RoPE with positions from the attention mask, under
    dynamic=True). The check draws integers as 0/1, then 0, until the program runs."""
    g = cleave.capture(rows_at_mask_positions, _randn(3, 3, seed=2), torch.zeros(2, 5, dtype=torch.int64),
                       dynamic={"mask": {1: "s"}})
    env = small_binding(g, g)
    with pytest.raises(IndexError):
        interpret(g, inputs_for(g, env, seed=0), torch.float64, env)
    assert check_candidate(g, g) == env
    with warnings.catch_warnings():
        warnings.simplefilter("error", CandidateRejected)
        search(g, top_k=2, progress=False)


def test_a_bf16_gpt2_keeps_its_rewrites():
    """The graph dynamo hands over for a one-layer bf16 GPT-2 (transformers' GPT2LMHeadModel
    at tiny widths): its LayerNorms and GELU are bf16 ops there, which the check rounded op
    by op, where every candidate computes those chains in f32 (the precision policy).
    The logits flipped by a bf16 ulp here and there, and every rewrite was rejected, the
    flash-attention form with them. A candidate equal to the input graph as decoded, which
    is that close to it, is kept."""
    from pathlib import Path

    from cleave.ir import parse_graph

    graph = parse_graph((Path(__file__).parent / "graphs" / "gpt2_bf16_one_layer.txt").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error", CandidateRejected)
        result = search(graph, progress=False)
    assert "normalize-after-matmul" in result.candidates[0].derivation


def test_a_candidate_equal_to_a_decoding_far_from_the_input_graph_is_rejected():
    """The policy's roundings are tolerated within the half type's epsilon, not more."""
    from cleave.search.validate import Reference

    def scaled(factor):
        g = Graph("scaled")
        x = g.input("x", ("n",), "bf16")
        g.output(g.add("mul", x, g.const(factor, "bf16")), names=["y"])
        return g

    reference = Reference(scaled(2.0), decoded=scaled(2.03125))
    with pytest.raises(CandidateMismatch):
        reference.check(scaled(2.03125))
    assert Reference(scaled(2.0), decoded=scaled(2.0)).check(scaled(2.0)) is not None


def test_small_binding_meets_a_bound_between_products():
    """Labels no longer than the logits they pick from, each batch and length a symbol of
    its own (a shifted cross-entropy under dynamo): no scale of the small values met
    `b*(t-1) <= B*(T-1)`, and every candidate was left out with a CandidateRejected."""
    g = parse_graph("""graph picked {
  %0 = input(name="logits", shape=[B,T,V], dtype=f32) : f32[B,T,V]
  %1 = input(name="labels", shape=[b,t], dtype=i64) : i64[b,t]
  %2 = slice(%0, axis=1, start=0, stop=T-1, step=1) : f32[B,T-1,V]
  %3 = reshape(%2, shape=[B*(T-1),V]) : f32[B*(T-1),V]
  %4 = slice(%3, axis=0, start=0, stop=b*(t-1), step=1) : f32[b*(t-1),V]
  %5 = reduce(%4, op="sum", axis=1, keepdim=0) : f32[b*(t-1)]
  require b*(t-1) <= B*(T-1) from "slice %4"
  return out=%5
}""")
    env = small_binding(g, g)
    assert env["b"] * (env["t"] - 1) <= env["B"] * (env["T"] - 1)
    assert max(env.values()) <= 16, env  # near the small values, not scaled up


def shifted_cross_entropy(logits, labels):
    shifted, targets = logits[..., :-1, :].contiguous(), labels[..., 1:].contiguous()
    return F.cross_entropy(shifted.view(-1, shifted.size(-1)), targets.view(-1), ignore_index=-100)


def test_shifted_cross_entropy_keeps_its_candidates():
    labels = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(3))
    labels[0, -1] = -100
    logits = _randn(2, 7, 13, seed=4)
    f = cleave.compile(shifted_cross_entropy, dynamic="all", verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = f(logits, labels)
    assert not [w for w in caught if issubclass(w.category, CandidateRejected)], [str(w.message) for w in caught]
    _close(got, shifted_cross_entropy(logits, labels), 1e-5)
