"""Scheduler + Triton codegen, run on CPU under TRITON_INTERPRET=1 at small odd
shapes, against the fp64 interpreter, with fresh random inputs and NaN-poisoned
outputs. The candidates are stand-ins for search output (tests/fixtures_candidates)."""
import dataclasses
import keyword
import os
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave
from cleave import workloads as W
from cleave.runtime import profile
from cleave.runtime.launch import launch
from cleave.scheduler import H200, Plan, schedule
from cleave.interpreter import TORCH_DTYPES, interpret
from fixtures_candidates import CANDIDATES
from kernel_check import LOOPS, check_outputs, computed_kernels, run_and_check as _run

NAIVE = [n for n in W.names()]


@pytest.mark.parametrize("name", NAIVE)
def test_naive_workload_runs(name):
    """Any naive graph schedules and runs correctly (cascades without facts: more passes)."""
    w = W.get(name)
    env = dict(w.test_bindings[1])
    plan = schedule(w.graph, env, top_k=1)[0]
    _run(w.graph, plan, env, seed=torch.seed() % 1000)


@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_fixture_computes_its_naive_workload(name):
    """The stand-ins are rewrites written by hand: each must compute its workload's naive
    graph (in fp64, with the roundings each graph writes: the decode stand-ins round P to
    bf16 before normalising it), with a split count that leaves a ragged last chunk; else
    the kernel tests check codegen against a wrong program."""
    w = W.get(name)
    cand = CANDIDATES[name]()
    for seed, binding in enumerate(w.test_bindings):
        env = {**binding, "sp": 4}
        inputs = w.inputs(binding, seed=seed)
        got = interpret(cand.graph, inputs, compute_dtype=torch.float64, env=env)
        want = interpret(w.graph, inputs, compute_dtype=torch.float64, env=env)
        stored = [g.to(TORCH_DTYPES[o.dtype]) for g, o in zip(got, cand.graph.outputs)]  # as a kernel stores it
        check_outputs(stored, want, f"{name} at {env}")


COUNTS = {"mha": 1, "mha_causal": 1, "gqa": 1, "gqa_causal": 1, "rope_attention_causal": 1,
          "rmsnorm_matmul": 1, "swiglu": 1, "moe_routing": 1, "layernorm": 1}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_candidate_fuses_to_one_kernel(name):
    cand = CANDIDATES[name]()
    w = W.get(name)
    env = dict(w.test_bindings[0])
    plan = schedule(cand, env, target=LOOPS, top_k=1)[0]
    assert len(plan.kernels) == COUNTS[name], [k.name for k in plan.kernels]
    _run(cand.graph, plan, env, seed=torch.seed() % 1000, reference=w.graph)


def test_cascade_needs_the_fact():
    """Without the Separable fact the max and the sum cannot share a loop."""
    cand = CANDIDATES["mha"]()
    env = dict(W.get("mha").test_bindings[0])
    fused = schedule(cand, env, target=LOOPS, top_k=1)[0].kernels[0].source
    unfused = schedule(dataclasses.replace(cand, facts=[]), env, target=LOOPS, top_k=1)[0].kernels[0].source
    passes = "in range(0, "  # a pass over the keys: its whole tiles, then the ragged last one
    assert fused.count(passes) == 1
    assert unfused.count(passes) == 2
    assert "alpha" in fused and "alpha" not in unfused


@pytest.mark.parametrize("name", ["gqa_decode", "mqa_decode", "mla_decode"])
def test_decode_split_and_unsplit(name):
    cand = CANDIDATES[name]()
    w = W.get(name)
    env = dict(w.test_bindings[0])
    split = schedule(cand, env, target=LOOPS, top_k=1, split={"sp": 3})[0]
    assert computed_kernels(split) == 2 and split.split == {"sp": 3}
    _run(cand.graph, split, env, seed=torch.seed() % 1000, reference=w.graph)
    whole = schedule(cand, env, target=LOOPS, top_k=1, split={"sp": 1})[0]
    assert len(whole.kernels) == 1
    if name == "gqa_decode":
        _run(cand.graph, whole, env, seed=torch.seed() % 1000, reference=w.graph)


def test_split_count_from_sm_count():
    """At a decode preset the chosen split fills the GPU; the cheapest plan leads, and the
    top-k offers distinct split counts first, for the GPU's profiling to choose among."""
    cand = CANDIDATES["gqa_decode"]()
    plans = schedule(cand, {"b": 1, "hkv": 8, "g": 4, "L": 131072, "d": 128}, top_k=4)
    assert plans[0].split["sp"] > 1
    assert plans[0].cost == min(p.cost for p in plans)
    assert len({p.split["sp"] for p in plans}) == len(plans)


def test_dynamic_plan_serves_three_sizes():
    cand = CANDIDATES["mha_causal"]()
    plan = schedule(cand, {"b": 1, "h": 2, "s": 37, "d": 16}, dynamic={"s"}, target=LOOPS, top_k=1)[0]
    assert plan.dynamic == ["s"]
    src = plan.kernels[0].source
    assert "do_not_specialize=['s']" in src and "s: tl.constexpr" not in src
    for s in (37, 21, 50):
        _run(cand.graph, plan, {"b": 1, "h": 2, "s": s, "d": 16}, seed=s)
    from cleave.runtime.launch import _MODULES
    assert (plan.kernels[0].name, hash(plan.kernels[0].source)) in _MODULES


def test_static_symbol_mismatch_is_a_clear_error():
    cand = CANDIDATES["layernorm"]()
    plan = schedule(cand, {"t": 7, "n": 37}, top_k=1)[0]
    x = torch.randn(7, 21).bfloat16()
    with pytest.raises(Exception, match="n=37"):
        launch(plan, {"x": x})


def test_plan_json_round_trip():
    """A plan read back from its JSON is the same plan, and runs: it computes the naive graph."""
    cand = CANDIDATES["swiglu"]()
    env = {"s": 7, "k": 37, "n": 19}
    plan = schedule(cand, env, top_k=1)[0]
    back = Plan.from_json(plan.to_json())
    assert back.to_json() == plan.to_json()
    assert back.kernels[0].grid and "@triton.jit" in back.kernels[0].source
    _run(cand.graph, back, env, seed=4, reference=W.get("swiglu").graph)


def test_profile_ranks_by_measured_time_on_the_gpu(monkeypatch):
    """On the GPU the measured times decide, not the cost model: a stand-in clock times the
    cost model's plans slowest first, so rank must put its last one first. On CPU nothing is
    launched or timed and the cost model's order stands."""
    import types

    plans = schedule(CANDIDATES["swiglu"](), {"s": 150, "k": 37, "n": 300}, top_k=3)
    assert len(plans) >= 2
    launched = []
    monkeypatch.setattr(profile, "launch", lambda plan, inputs: launched.append(plan))
    on_cpu = W.get("swiglu").inputs({"s": 150, "k": 37, "n": 300}, seed=3)
    assert profile.rank(plans, on_cpu) == list(range(len(plans))) and not launched
    slowest_first = {id(p): float(len(plans) - i) for i, p in enumerate(plans)}

    def clock(fn, cold=True):
        assert cold  # graph replays rank with the L2 flushed before each call
        fn()
        return slowest_first[id(launched[-1])]

    def timer(fn, cold=False):
        ms = clock(fn, cold)
        return lambda: ms

    monkeypatch.setattr(profile, "graph_timer", timer)
    monkeypatch.setattr(profile, "once_ms", clock)  # one call is within reach of the fastest
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    on_gpu = {"x": types.SimpleNamespace(device=torch.device("cuda"))}
    assert profile.rank(plans, on_gpu) == list(reversed(range(len(plans))))


def _causal_source_and_check(cand, env, **kw):
    plan = schedule(cand, env, target=LOOPS, top_k=1, **kw)[0]
    _run(cand.graph, plan, env, seed=torch.seed() % 1000)
    return plan.kernels[0].source


def test_causal_mask_bounds_the_kv_loop():
    """The compare between the row and column iotas bounds the kv loop per program
    (tiles above the diagonal skipped) and only the diagonal tiles apply the mask."""
    cand = CANDIDATES["mha_causal"]()
    src = _causal_source_and_check(cand, {"b": 1, "h": 2, "s": 45, "d": 16})
    assert "hi4 = tl.minimum(s, " in src
    loops = [ln.strip() for ln in src.splitlines() if ln.strip().startswith("for start")]
    assert len(loops) == 2 and loops[0].startswith("for start4 in range(0, full_hi4, ") \
        and loops[1].startswith("for start4 in range(full_hi4, hi4, ")
    masked, unmasked = src.split(loops[1])[1], src.split(loops[1])[0].split(loops[0])[1]
    assert " <= " in masked and " <= " not in unmasked
    # A dynamic s keeps the bounds as runtime expressions.
    dyn = schedule(cand, {"b": 1, "h": 2, "s": 37, "d": 16}, dynamic={"s"}, target=LOOPS, top_k=1)[0]
    for s in (19, 64, 71):
        _run(cand.graph, dyn, {"b": 1, "h": 2, "s": s, "d": 16}, seed=s)


def test_upper_triangular_mask_bounds_the_loop_from_below():
    """`j >= i` (keep the upper triangle) skips the leading tiles instead."""
    from cleave.ir import Graph
    from cleave.workloads.attention import NEG_INF, scale
    from fixtures_candidates import EXP, _cand, _online_softmax_av

    g = Graph("mha_causal")  # the workload's inputs and reference interpreter; only the mask differs
    q, k, v = (g.input(n, ("b", "h", "s", "d"), "bf16") for n in "qkv")
    scores = (q @ k.T).cast("f32") * scale(g, "d")
    i, j = g.iota(("s", "s"), axis=0), g.iota(("s", "s"), axis=1)
    scores = g.add("where", j >= i, scores, g.const(NEG_INF))
    o, e, m = _online_softmax_av(scores, v)
    g.output(o.cast("bf16"), names=["o"])
    cand = _cand(g, [(e, m, EXP)])
    src = _causal_source_and_check(cand, {"b": 2, "h": 1, "s": 53, "d": 16})
    assert "lo4 = " in src and "for start4 in range(lo4, first_hi4" in src


def test_long_decode_split_fills_the_gpu_twice():
    """b1 L131072 (8 kv heads): the chosen split gives at least 2 programs per SM, and
    each program's K/V loads are multi-buffered."""
    cand = CANDIDATES["gqa_decode"]()
    plan = schedule(cand, {"b": 1, "hkv": 8, "g": 4, "L": 131072, "d": 128}, top_k=1)[0]
    programs = 8 * plan.split["sp"]
    assert programs >= 2 * H200.sms, plan.split
    assert plan.kernels[0].num_stages >= 2


def test_matmul_grouped_order_and_honest_smem():
    """Two tiled MatMul sides get the grouped (L2-swizzled) program order; every kept
    plan's pipelined tiles fit the shared-memory budget; results stay correct."""
    cand = CANDIDATES["swiglu"]()
    env = {"s": 150, "k": 37, "n": 300}
    plan = schedule(cand, env, top_k=1)[0]
    assert "pmn = pid %" in plan.kernels[0].source
    _run(cand.graph, plan, env, seed=5)
    for p in schedule(cand, {"s": 4096, "k": 4096, "n": 14336}, top_k=4):
        t = {k.split(".")[-1]: v for k, v in p.tiles.items()}
        bm, bn, bk = t["X0"], t["X1"], t["X2"]
        assert p.kernels[0].num_stages * (bm * bk + 2 * bk * bn) * 2 <= H200.smem_per_block, p.tiles


def test_small_rows_share_a_program():
    """MoE routing (128 experts a row): several rows per program, not one tiny program each."""
    cand = CANDIDATES["moe_routing"]()
    plan = schedule(cand, {"t": 16384, "e": 128}, top_k=1)[0]
    assert plan.tiles["moe_routing_k0.X0"] >= 4
    small = schedule(cand, {"t": 37, "e": 24}, top_k=1)[0]
    _run(cand.graph, small, {"t": 37, "e": 24}, seed=6)


def test_padded_contraction_lanes_add_nothing_to_a_dot():
    """A computed tl.dot operand is masked on the padded lanes of a ragged contraction
    tile: a zero load on the other side does not cancel inf there (softmax's exp(0 - m)
    on a padded lane overflows when every score of the row is below -88)."""
    from cleave.interpreter import interpret
    from cleave.ir import Graph
    from kernel_check import check_outputs

    g = Graph("softmax_matmul")
    x, v = g.input("x", (3, "n"), "f32"), g.input("v", ("n", 5), "f32")
    e = (x - x.max(-1, keepdim=True)).exp()
    g.output((e / e.sum(-1, keepdim=True)) @ v, names=["y"])
    inputs = {"x": torch.randn(3, 37) - 1000.0, "v": torch.randn(37, 5)}
    for name, target in (("H200", H200), ("LOOPS", LOOPS)):
        plan = schedule(g, {"n": 37}, target=target, top_k=1)[0]
        check_outputs(launch(plan, inputs), interpret(g, inputs, compute_dtype=torch.float64), name)


@pytest.mark.parametrize("name", ["<lambda>", "functools.partial", "my-fn.v2", "2fast", "class", "<>"])
def test_kernel_names_are_identifiers_whatever_the_graph_name(name):
    from cleave.ir import Graph

    g = Graph(name)
    x = g.input("x", (3, 5), "f32")
    g.output(x.exp(), names=["y"])
    plan = schedule(g, {}, top_k=1)[0]
    kernel = plan.kernels[0]
    assert kernel.name.isidentifier() and not keyword.iskeyword(kernel.name), kernel.name
    assert f"def {kernel.name}(" in kernel.source
    x = torch.randn(3, 5)
    torch.testing.assert_close(launch(plan, {"x": x})[0], x.exp())


def test_compiled_lambda_runs_its_kernels(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    f = cleave.compile(lambda x: torch.softmax(x, -1))
    x = torch.randn(3, 5)
    torch.testing.assert_close(f(x), torch.softmax(x, -1))
    assert f.stats["failed"] == 0 and f.stats["compiles"] == 1, f.stats


KERNEL_DIR_PROBE = """
import os, tempfile
import torch
import cleave
from cleave.runtime.launch import launch
from cleave.scheduler import schedule

def kernel_dirs():
    return [n for n in os.listdir(tempfile.gettempdir()) if n.startswith("cleave_kernels_")]

assert not kernel_dirs(), "made before any kernel is loaded"
g = cleave.Graph("probe")
g.output(g.input("x", (3, 5), "f32").exp(), names=["y"])
launch(schedule(g, {}, top_k=1)[0], {"x": torch.randn(3, 5)})
assert len(kernel_dirs()) == 1, kernel_dirs()
"""


def test_kernel_files_leave_no_directory_behind(tmp_path):
    """Each process writes its kernel files into one temporary directory, made on first
    need and removed when the process exits."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "TRITON_INTERPRET": "1", "CLEAVE_CACHE_DIR": str(tmp_path / "c")}
    done = subprocess.run([sys.executable, "-c", KERNEL_DIR_PROBE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("cleave_kernels_")]


def test_kernel_check_is_element_wise_and_names_seed_and_binding():
    """One wrong element in a ragged tail passes a relative L2 check (its share of the
    norm is small) but not the element-wise one; failures name the seed and binding."""
    from cleave.ir import Graph
    from kernel_check import check_outputs

    ref = torch.randn(64, 160, dtype=torch.float64)
    got = ref.bfloat16()
    got[-1, -1] += 0.05 * ref.abs().max().item()
    assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-2
    with pytest.raises(AssertionError, match=r"element-wise error .* at index \[63, 159\]"):
        check_outputs([got], [ref], "tail")
    g, other = Graph("exp"), Graph("exp")
    g.output(g.input("x", (3, "n"), "f32").exp(), names=["y"])
    other.output(other.input("x", (3, "n"), "f32").exp() * 1.01, names=["y"])
    plan = schedule(g, {"n": 5}, top_k=1)[0]
    with pytest.raises(AssertionError, match=r"exp: seed 7, binding \{'n': 5\}"):
        _run(g, plan, {"n": 5}, seed=7, reference=other)


def test_each_output_name_gets_its_own_store():
    """A node returned under several names, or an input returned as is, is stored into
    every output buffer (not only the first name's, nor into the input)."""
    from cleave.ir import Graph

    g = Graph("aliases")
    x = g.input("x", ("n",), "f32")
    e = x.exp()
    g.output(e, e, x, names=["a", "b", "c"])
    plan = schedule(g, {"n": 5}, dynamic={"n"}, top_k=1)[0]
    for n in (5, 37):
        _run(g, plan, {"n": n}, seed=n)


def test_pow_follows_torch_for_negative_bases():
    """pow(a, b) is exp(b log|a|) with torch's sign: an odd integer exponent keeps a
    negative base's sign (GELU's tanh form takes x**3), a fractional one gives NaN."""
    from cleave.interpreter import interpret
    from cleave.ir import Graph
    from kernel_check import check_outputs

    g = Graph("pow")
    g.output(g.add("pow", g.input("a", (8,), "f32"), g.input("b", (8,), "f32")), names=["y"])
    inputs = {"a": torch.tensor([-2.0, -2.0, -2.0, -2.0, -1.5, 0.0, 0.0, 3.0]),
              "b": torch.tensor([3.0, 2.0, 0.5, 0.0, -3.0, 2.0, 0.0, 0.5])}
    plan = schedule(g, {}, top_k=1)[0]
    check_outputs(launch(plan, inputs), interpret(g, inputs, compute_dtype=torch.float64), "pow")
