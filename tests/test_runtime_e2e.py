"""End to end through the real pipeline (capture -> search -> scheduler -> Triton
under TRITON_INTERPRET=1), at tiny shapes (the interpreter's cost grows with the
tl ops it executes): cleave.compile and torch.compile(backend="cleave") at three
sizes of the dynamic axes, one search per operator, the on-disk cache across
processes (cold, warm, concurrent, damaged), a graph break, explain, and the
trace build -> replay flow.

The search runs a handful of times in the whole file: compiled functions and one
cache directory are shared through module-scoped fixtures wherever a test does
not need a cold start (the rule verifier keeps its verdicts in that directory too).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import cleave
from cleave import workloads

HERE = Path(__file__).parent
ROOT = HERE.parent
SUBSET = ["mha_causal", "gqa_decode", "rmsnorm_matmul", "moe_routing"]
# Tiny bindings, three per workload, differing only along the dynamic axes.
SIZES = {
    "mha_causal": [{"b": 1, "h": 2, "d": 16, "s": s} for s in (7, 13, 21)],
    "gqa_decode": [{"hkv": 2, "g": 2, "d": 16, "b": b, "L": L} for b, L in ((2, 17), (3, 30), (4, 45))],
    "rmsnorm_matmul": [{"k": 21, "n": 19, "s": s} for s in (5, 9, 14)],
    "moe_routing": [{"e": 21, "t": t} for t in (5, 9, 14)],
}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("cleave-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLEAVE_CACHE_DIR", str(path))
        yield path


def _fresh_cache(shared: Path, path: Path) -> Path:
    """An operator cache with nothing in it, sharing the verifier's proven verdicts."""
    path.mkdir(parents=True)
    if (shared / "verify").is_dir():
        shutil.copytree(shared / "verify", path / "verify")
    return path


def _check(got, want):
    got = got if isinstance(got, (tuple, list)) else [got]
    want = want if isinstance(want, (tuple, list)) else [want]
    for g, e in zip(got, want, strict=True):
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g.float(), e.float(), atol=3e-2, rtol=3e-2)
        else:
            assert torch.equal(g, e)


def _no_fallback(stats):
    assert stats["failed"] == 0 and stats["graph_breaks"] == 0 and stats["unsupported"] == [], stats


@pytest.fixture(scope="module")
def compiled(shared_cache):
    """One cleave.compile per workload, filled lazily by the test that runs it first."""
    return {}


def _compiled(compiled, name):
    if name not in compiled:
        w = workloads.get(name)
        compiled[name] = (w, cleave.compile(w.reference, dynamic=w.dynamic))
    return compiled[name]


@pytest.mark.parametrize("name", SUBSET)
def test_compile_matches_eager_with_one_search(compiled, name):
    w, fn = _compiled(compiled, name)
    for i, env in enumerate(SIZES[name]):
        inputs = w.inputs(env, seed=100 + i)
        _check(fn(*inputs.values()), w.reference(*inputs.values()))
    st = fn.stats
    _no_fallback(st)
    assert st["operators"] == 1 and st["searches"] == 1 and st["compiles"] == 1, st
    assert st["calls"] == 3 and len(fn.operators[0].specs) == 1  # no new codegen on later sizes


def test_repeated_shape_adds_no_binding_work(compiled, monkeypatch):
    """A repeated shape is a dict lookup: the graph is not bound again (no sympy), and
    the call goes straight to the prepared kernels (no operator or plan lookup), on
    fresh values; explain still sees that launch."""
    w, fn = _compiled(compiled, "rmsnorm_matmul")
    fn(*w.inputs(SIZES["rmsnorm_matmul"][1], seed=7).values())
    op = fn.operators[0]

    def refuse(*args, **kwargs):
        raise AssertionError("a shape already seen was looked up or bound again")
    monkeypatch.setattr(op.graph, "bind", refuse)
    monkeypatch.setattr(fn.ctx, "run", refuse)
    calls = op.stats["calls"]
    inputs = w.inputs(SIZES["rmsnorm_matmul"][1], seed=9)
    _check(fn(*inputs.values()), w.reference(*inputs.values()))
    assert op.stats["calls"] == calls + 1
    monkeypatch.undo()
    assert cleave.explain(fn, *inputs.values()).kernels
    new = w.inputs({**SIZES["rmsnorm_matmul"][0], "s": 17}, seed=8)  # a new size: symbols read off the tensors
    _check(fn(*new.values()), w.reference(*new.values()))


@pytest.mark.parametrize("name", SUBSET)
def test_torch_compile_backend_respects_mark_dynamic(shared_cache, name):
    from cleave.runtime import backend

    torch._dynamo.reset()
    ctx = backend.reset()
    w = workloads.get(name)
    fn = torch.compile(w.reference, backend="cleave")
    for i, env in enumerate(SIZES[name]):
        inputs = w.inputs(env, seed=200 + i)
        for arg, axes in w.dynamic.items():
            for axis in axes:
                torch._dynamo.mark_dynamic(inputs[arg], axis)
        _check(fn(*inputs.values()), w.reference(*inputs.values()))
    st = ctx.stats()
    _no_fallback(st)
    assert st["operators"] == 1 and st["searches"] == 1 and st["compiles"] == 1, st


def test_transformer_block_through_backend(shared_cache):
    from transformer_block import Block, rope

    from cleave.runtime import backend

    torch._dynamo.reset()
    ctx = backend.reset()
    block = Block(dim=32, heads=2, kv_heads=1, hidden=24)  # head_dim 16: tl.dot's minimum
    fn = torch.compile(block, backend="cleave")
    for s in (5, 9, 14):
        x = torch.randn(1, s, 32)
        cos, sin = rope(s, block.head_dim)
        for t in (x, cos, sin):
            torch._dynamo.mark_dynamic(t, t.dim() - 2)
        _check(fn(x, cos, sin), block(x, cos, sin))
    st = ctx.stats()
    _no_fallback(st)
    assert st["operators"] >= 1 and st["searches"] == st["operators"], st


def sorted_softmax(x, w):
    y = torch.softmax((x @ w).float(), dim=-1)
    top, _ = torch.sort(y, dim=-1, descending=True)
    return (top * 2.0).sum(-1)


def test_graph_break_on_sort_is_correct_and_warns_once(shared_cache):
    torch._dynamo.reset()
    fn = cleave.compile(sorted_softmax, dynamic={"x": {0: "s"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in (3, 8, 13):
            x, w = torch.randn(s, 16), torch.randn(16, 5)
            torch.testing.assert_close(fn(x, w), sorted_softmax(x, w), atol=1e-4, rtol=1e-4)
    cleave_warnings = [str(w.message) for w in caught if str(w.message).startswith("cleave")]
    assert len(cleave_warnings) == 1 and "sort" in cleave_warnings[0], cleave_warnings
    assert "graph break" in cleave_warnings[0]
    st = fn.stats
    assert st["graph_breaks"] >= 1 and st["unsupported"] == ["aten.sort.default"] and st["failed"] == 0
    assert st["operators"] >= 1 and st["searches"] == st["operators"], st


def test_explain_reports_graph_derivation_schedule_and_kernels(compiled):
    w, fn = _compiled(compiled, "gqa_decode")
    inputs = w.inputs(SIZES["gqa_decode"][0], seed=3)
    report = cleave.explain(fn, *inputs.values())
    assert len(report.operators) == 1 and report.kernels
    assert all(k.source and k.grid and "@triton.jit" in k.source for k in report.kernels)
    op = report.operators[0]
    assert op.derivation, "the chosen decode candidate was rewritten by rules"
    text = str(report)
    assert "captured graph" in text and "derivation" in text and "kernel" in text
    assert op.from_cache is False and op.search_seconds > 0


# -- the cache across processes -----------------------------------------------
PROCESS = """
    import sys
    {block}
    import torch
    import cleave
    from cleave import workloads
    w = workloads.get("rmsnorm_matmul")
    inputs = w.inputs({{"k": 21, "n": 19, "s": 6}}, seed=5)
    compiled = cleave.compile(w.reference, dynamic=w.dynamic)
    out = compiled(*inputs.values())
    torch.testing.assert_close(out.float(), w.reference(*inputs.values()).float(), atol=3e-2, rtol=3e-2)
    st = compiled.stats
    assert st["failed"] == 0, st
    print(st["from_cache"], st["searches"], [m for m in ("egglog", "z3") if m in sys.modules])
"""
BLOCK = """
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("egglog", "z3"):
                raise ImportError("blocked " + name)
    sys.meta_path.insert(0, Block())
"""


def _start(code: str, cache: Path, *args) -> subprocess.Popen:
    env = {**os.environ, "CLEAVE_CACHE_DIR": str(cache), "TRITON_INTERPRET": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _finish(proc: subprocess.Popen) -> list[str]:
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    return out.strip().splitlines()[-1].split(" ", 2)


def test_cache_concurrent_cold_then_warm_without_egglog_then_damaged(shared_cache, tmp_path, monkeypatch):
    cache = _fresh_cache(shared_cache, tmp_path / "cache")
    # Two processes compile the same operator at once into an empty cache: both succeed.
    cold = [_finish(p) for p in [_start(PROCESS.format(block=""), cache) for _ in range(2)]]
    for from_cache, searches, _ in cold:
        assert (from_cache, searches) in {("0", "1"), ("1", "0")}, cold
    # A later process loads it: no search, egglog and z3 never imported.
    warm = _finish(_start(PROCESS.format(block=BLOCK), cache))
    assert warm == ["1", "0", "[]"], warm
    # A tampered kernel file is detected, warned about and rebuilt (scheduled again, not searched).
    kernel = next(cache.glob("*/spec-*/kernels/*.py"))
    kernel.write_text(kernel.read_text() + "\n# tampered\n")
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(cache))
    w = workloads.get("rmsnorm_matmul")
    inputs = w.inputs({"k": 21, "n": 19, "s": 6}, seed=6)
    fn = cleave.compile(w.reference, dynamic=w.dynamic)
    with pytest.warns(UserWarning, match="damaged cache entry"):
        _check(fn(*inputs.values()), w.reference(*inputs.values()))
    assert fn.stats["searches"] == 0 and fn.stats["compiles"] == 1 and fn.stats["from_cache"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt entry is whole again
        again = cleave.compile(w.reference, dynamic=w.dynamic)
        again(*inputs.values())
    assert again.stats["from_cache"] == 1 and again.stats["compiles"] == 0


# -- traces: build here, replay without the search --------------------------------
REPLAY = BLOCK + """
    from cleave.cli.main import main
    rc = main(sys.argv[1:])
    print(rc, [m for m in ("egglog", "z3") if m in sys.modules])
"""


def test_trace_build_then_replay_from_artifact_without_egglog(shared_cache, tmp_path, capsys):
    from cleave.cli.main import main

    trace = ROOT / "traces" / "workloads" / "gqa_decode.jsonl"
    tiny = ["--scale", "0.01", "--const", "h=4,hkv=2,d=16"]
    artifact = tmp_path / "artifact"
    assert main(["trace", "build", str(trace), "--out", str(artifact), *tiny]) == 0
    # the printed command replays the scaled shapes the artifact was built for
    assert f"replay with: cleave trace replay {trace} --artifact {artifact} --scale 0.01 --const h=4,hkv=2,d=16" \
        in capsys.readouterr().out
    assert len(list(artifact.glob("*/operator.json"))) == 1 and list(artifact.glob("*/spec-*/plans.json"))
    empty = tmp_path / "empty-cache"
    proc = _start("import sys\n" + textwrap.dedent(REPLAY), empty, "trace", "replay", str(trace), "--device", "cpu",
                  "--limit", "3", "--artifact", str(artifact), *tiny)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    assert out.strip().splitlines()[-1] == "0 []", out[-2000:]
    assert "recompiles after the first call: 0 (searches 0, compiles 0, from_cache 1" in out
    assert "geomean" in out
    assert not empty.exists() or not any(empty.iterdir())  # nothing was built on the replaying side
