"""FlashInfer-Bench's paged and ragged definitions (issue 14): each user program, as
plain PyTorch, equals its definition's per-request reference in fp64, and compiles
under the interpreter to kernels that do too, at small odd shapes with random
non-contiguous pages and an empty request (output 0, lse -inf, as FlashInfer gives).

The fast test compiles the ps1 decode; every other definition compiles under `slow`
(30-70 s each in the interpreter on an idle 2-core machine, prefills the longest).
"""
from __future__ import annotations

import re

import pytest
import torch

import cleave
from cleave import workloads as W
from cleave.runtime.traces import reference_fn, validate_definition
from cleave.workloads import flashinfer as F
from kernel_check import assert_loops_bounded_by, plan_sources

# (q lens, kv lens): odd sizes, an empty request (first and last too), several pages per request.
BATCHES = (([1, 2, 1], [7, 0, 11]), ([2, 0, 3, 1, 1], [4, 0, 9, 2, 5]), ([1, 1, 2, 1], [0, 6, 13, 0]))


def small_const(name: str) -> dict[str, int]:
    const = dict(F.DEFINITIONS[name][1])
    if "head_dim_ckv" in const:
        return {**const, "num_qo_heads": 3, "head_dim_ckv": 16, "head_dim_kpe": 8}
    small = {"num_qo_heads": 6, "num_kv_heads": 2 if const["num_kv_heads"] == 8 else 3, "head_dim": 16}
    return {**const, **small, **({"page_size": 3} if const.get("page_size", 1) > 1 else {})}


def small_inputs(name: str, which: int, seed: int, dtype=torch.bfloat16):
    const = small_const(name)
    q_lens, kv_lens = BATCHES[which]
    kind = F.kind_of(name)
    pages, pool = F.random_layout(kv_lens, const.get("page_size", 1), torch.Generator().manual_seed(seed))
    return F.layout_inputs(name, q_lens if kind.prefill else [1] * len(kv_lens), pages, kv_lens, pool,
                           const=const, seed=seed, dtype=dtype)


def fp64(args):
    return [a.double() if a.is_floating_point() else a for a in args]


def assert_matches_reference(name, got, args, context):
    """Against the definition's own reference run in fp64: bf16 output within its
    rounding, lse within f32's; -inf exactly where a request is empty."""
    out, lse = got
    want_out, want_lse = F.kind_of(name).reference(*fp64(args))
    assert out.dtype == args[0].dtype and lse.dtype == torch.float32, context
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse)), f"{context}: -inf lse where the reference has none"
    assert not out.isnan().any() and not lse.isnan().any(), context
    torch.testing.assert_close(out.double(), want_out, rtol=2e-2, atol=2e-2, msg=lambda m: f"{context}: {m}")
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse.double()[finite], want_lse[finite], rtol=1e-4, atol=1e-4,
                               msg=lambda m: f"{context}: {m}")
    empty = torch.isinf(want_lse).all(-1)
    assert (out[empty] == 0).all(), f"{context}: an empty request's output is not 0"


@pytest.mark.parametrize("name", F.FLASHINFER_BENCH)
def test_definition_is_valid_flashinfer_trace_with_its_reference(name):
    d = F.definition(name)
    validate_definition(d)
    assert d["name"] == name and d["inputs"]["sm_scale"]["shape"] is None
    var = {a for a, s in d["axes"].items() if s["type"] == "var"}
    assert {a for a, s in d["axes"].items() if s["type"] == "const"} == set(F.DEFINITIONS[name][1])
    assert var == set(F.kind_of(name).var)
    args = small_inputs(name, 1, seed=3)
    run = reference_fn(d)  # the JSON's own text, executed
    for got, want in zip(run(*args), F.kind_of(name).reference(*args)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", list(F.DEFINITIONS))
def test_user_program_equals_reference_in_fp64(name):
    """The plain-PyTorch program (gather, segment ids, masks) is the definition, eagerly."""
    seed = torch.seed() % 10_000
    for which in range(len(BATCHES)):
        args = fp64(small_inputs(name, which, seed, dtype=torch.float64))
        out, lse = F.kind_of(name).program(*args)
        want_out, want_lse = F.kind_of(name).reference(*args)
        # the program computes in f32 (its .float()), as a user's would: f32's tolerance
        torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5, msg=lambda m: f"seed {seed}: {m}")
        torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5, msg=lambda m: f"seed {seed}: {m}")


def compile_and_check(name):
    seed = torch.seed() % 10_000
    kind = F.kind_of(name)
    f = cleave.compile(kind.program, dynamic=F.dynamic_axes(kind), verbose=False)
    for which in range(len(BATCHES)):
        args = small_inputs(name, which, seed)
        assert_matches_reference(name, f(*args), args, f"{name}, seed {seed}, batch {BATCHES[which]}")
    assert f.stats["failed"] == 0 and f.stats["graph_breaks"] == 0, f.stats
    assert f.stats["operators"] == 1 and f.stats["compiles"] + f.stats["from_cache"] <= 1, f.stats
    return f


@pytest.mark.parametrize("name", F.FLASHINFER_BENCH)
def test_every_kv_loop_is_bounded_by_its_requests_indptr(name):
    """The bounds the scheduler derives (each kernel's `loops`), for the program as written
    (captured, not searched: scheduling it takes a second): every loop over the kv tokens
    starts and stops at bounds loaded from kv_indptr (and, in prefill, from qo_indptr: the
    causal end), so a program loops over its own request's pages only. The 64-token pages
    bound it through the page of a token, floor(token / 64)."""
    w = W.get(name)
    binding = w.test_bindings[0]
    (plan,) = cleave.schedule(w.graph, binding, dynamic=set(binding), top_k=1)
    kv = {"num_kv_indices", "total_kv"}
    loops = [loop for k in plan.kernels for loop in k.loops if kv & set(re.findall(r"\w+", loop["extent"]))]
    assert loops, [k.loops for k in plan.kernels]
    for loop in loops:
        assert "kv_indptr" in loop["loaded"].get("lo", ()) and "kv_indptr" in loop["loaded"].get("hi", ()), loop
        assert loop["lo"] != "0" and loop["hi"] != loop["extent"], loop
        if F.kind_of(name).prefill:
            assert "qo_indptr" in loop["loaded"]["hi"], loop


FAST = ("gqa_paged_decode_h32_kv8_d128_ps1",)  # a prefill takes ~4x as long to schedule and interpret


@pytest.mark.parametrize("name", FAST)
def test_compiles_once_and_matches_reference(name):
    """...and each program loops over its own request's pages only: every kv loop of every
    plan starts and stops at bounds computed from the kv_indptr it loads."""
    assert_loops_bounded_by(plan_sources(compile_and_check(name)), "kv_indptr")


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in F.DEFINITIONS if n not in FAST])
def test_every_definition_compiles_once_and_matches_reference(name):
    compile_and_check(name)


# a contraction emitted off the tensor cores: a broadcast product of two tiles summed over K
PRODUCT = re.compile(r"tl\.sum\(v\d+\[[^\]]*\]\.to\(tl\.float32\) \* v\d+\[")


def test_split_kv_plans_do_not_hold_a_contraction_product_in_registers():
    """At the H200 binding the paged decode's split-KV plans tiled the chunk axis by 4
    beside the kv loop: a [64, 16, 4, 128] product summed off the tensor cores, ranked
    second by the cost model and 79-105 ms on the H200 (0.21 ms for the first plan). The
    register estimate now counts that product, so those tilings no longer fit."""
    w = W.get("gqa_paged_decode_h32_kv8_d128_ps1")
    cand = cleave.search(w.graph).candidates[0]
    plans = cleave.schedule(cand, w.presets["h200"], top_k=3)
    assert any(p.split and any(v > 1 for v in p.split.values()) for p in plans)  # split plans are ranked
    assert not [m for p in plans for k in p.kernels for m in PRODUCT.findall(k.source)]


_GOOD = {"name": "d", "op_type": "s", "axes": {"n": {"type": "var"}},
         "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
         "outputs": {"o": {"shape": ["n"], "dtype": "float32"}}, "reference": "def run(x):\n    return x\n"}


@pytest.mark.parametrize("change, message", [
    (lambda d: [1, 2], "a definition is a JSON object, not list"),
    (lambda d: {**d, "axes": [1]}, "'axes' is not a JSON object but list"),
    (lambda d: {**d, "axes": {"n": "var"}}, r"axes \['n'\] are not JSON objects"),
    (lambda d: {**d, "inputs": {"x": "f32"}}, r"inputs \['x'\] are not JSON objects"),
    (lambda d: {**d, "reference": 5}, "reference is not a string but int"),
    (lambda d: {**d, "reference": "def run(x):\n  return (\n"}, r"its reference does not parse \('\(' was never closed"),
])
def test_a_malformed_definition_is_one_trace_error(change, message):
    """Each was an AttributeError, TypeError or SyntaxError traceback from the checks."""
    validate_definition(_GOOD)
    with pytest.raises(cleave.runtime.traces.TraceError, match=message):
        validate_definition(change(dict(_GOOD)))
