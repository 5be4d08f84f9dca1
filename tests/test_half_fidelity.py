"""Half-precision MatMuls keep eager's accuracy against fp64 where a rewrite moves their
operands' rounding: a LayerNorm without affine weight before a projection rounded
x - mean, not (x - mean) / sigma, whose errors a weight row with a non-zero sum adds up
(3-6x eager's error; `unshifted_operands()` in the rules)."""
import re

import pytest
import torch
import torch.nn.functional as F

import cleave
from cleave import workloads
from cleave.search import search

K, N = 1031, 40


def normed_projection(x, w):
    return F.linear(F.layer_norm(x, (K,)), w)


def standardised_projection(x, w):
    h = x.float()
    mean = h.mean(-1, keepdim=True)
    var = ((h - mean) ** 2).mean(-1, keepdim=True)
    return ((h - mean) * torch.rsqrt(var + 1e-5)).to(x.dtype) @ w.t()


def _relative_l2(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("fn", [normed_projection, standardised_projection])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_normed_projection_is_as_accurate_as_eager(fn, dtype):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(N, K, generator=g) * 0.5 + 0.5).to(dtype)  # rows with a non-zero mean
    x = torch.randn(3, 13, K, generator=g).to(dtype)
    want = fn(x.double(), w.double())
    compiled = cleave.compile(fn, verbose=False)
    with torch.no_grad():
        got, eager = compiled(x, w), fn(x, w)
    assert compiled.stats["failed"] == 0 and compiled.capture_error is None, compiled.stats
    assert _relative_l2(got, want) <= 1.5 * _relative_l2(eager, want) + 1e-6, \
        (_relative_l2(got, want), _relative_l2(eager, want))


def test_rmsnorm_keeps_its_row_scale_after_the_matmul():
    """RMSNorm scales x itself, no shift: the fusion that needs the rule keeps it."""
    assert "rowscale-after-matmul" in search(workloads.get("rmsnorm_matmul").graph, progress=False).best.derivation


def upcast_scores_logsumexp(q, k):
    return torch.logsumexp(torch.einsum("bhd,bnd->bhn", q.float(), k.float()), -1)


def test_a_matmul_of_upcast_half_values_runs_on_the_tensor_cores():
    """Its products are exact in f32, so a bf16 dot with an f32 accumulator computes what
    the code's f32 MatMul does; it was an `ieee` f32 dot, off the tensor cores."""
    q, k = torch.randn(3, 7, 40).bfloat16(), torch.randn(3, 9, 40).bfloat16()
    graph = cleave.capture(upcast_scores_logsumexp, q, k)
    plan = cleave.schedule(graph, {}, top_k=1)[0]
    sources = "".join(kernel.source for kernel in plan.kernels)
    assert "tl.dot(" in sources and "ieee" not in sources


def test_an_upcast_operand_is_read_as_its_half_tile():
    """An f32 cast that only a MatMul reads is no f32 copy in registers: the dot takes the
    loaded half tile itself (a 64 x 512 f32 copy of MLA's V tile left no 32-row plan)."""
    q, k = torch.randn(3, 7, 40).bfloat16(), torch.randn(3, 9, 40).bfloat16()
    plan = cleave.schedule(cleave.capture(upcast_scores_logsumexp, q, k), {}, top_k=1)[0]
    source = "".join(kernel.source for kernel in plan.kernels)
    loaded = set(re.findall(r"(v\d+) = tl\.load\(", source))
    converted = set(re.findall(r"= (v\d+)\.to\(tl\.float32\)", source))
    assert loaded and not loaded & converted, source


def test_upcast_scores_keep_f32_where_the_search_rewrote_them():
    """The search drops exact casts; the lowering must not then make the scores a half
    MatMul with a half result (1.6e-3 against fp64 under dynamic shapes, eager ~1e-7)."""
    g = torch.Generator().manual_seed(3)
    compiled = cleave.compile(upcast_scores_logsumexp, dynamic="all", verbose=False)
    for n in (9, 23):
        q, k = (torch.randn(3, m, 40, generator=g).bfloat16() for m in (7, n))
        want = upcast_scores_logsumexp(q.double(), k.double())
        got = compiled(q, k)
        assert got.dtype == torch.float32
        assert _relative_l2(got, want) < 1e-5


def test_an_f32_operand_beside_upcast_half_values_keeps_inf_and_large_values():
    """x @ w.float() runs as two bf16 dots, x = hi + lo: an infinite x made lo inf - inf
    (NaN, eager: inf), and an f32 x above bf16's largest value rounded hi to inf."""
    def f(x, w):
        return x @ w.float()

    x = torch.randn(5, 16)
    x[0, 3], x[1, 2], x[2, 5] = float("inf"), 3.4e38, -float("inf")
    w = torch.full((16, 7), 0.5, dtype=torch.bfloat16)
    got, want = cleave.compile(f, verbose=False)(x, w), x.double() @ w.double()
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and not got.isnan().any()
    finite = torch.isfinite(want)
    assert ((got.double() - want)[finite].abs() / want[finite].abs().clamp_min(1)).max() < 1e-4
