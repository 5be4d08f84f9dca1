"""Artifacts, the public compile wrapper, trace --const and progress lines (probe 27):

- an artifact entry serves an operator only at its f32 MatMul precision; an entry from
  before the field reads as built at torch's default ("highest");
- an artifact with no matching entry says so: a warning naming what the nearest entry
  differs in where the search builds a new one, a one-line error where it cannot;
- cleave.compile takes every parameter of cleave.runtime.compile.compile;
- `cleave trace replay/build --const` that the program cannot take is a one-line error;
- verbose=True prints whatever the order of logging settings and cleave's imports.
"""
from __future__ import annotations

import inspect
import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import cleave
from cleave import progress
from cleave.cli.main import main
from cleave.runtime import artifact as A
from cleave.runtime.cache import key_fields

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "workloads" / "gqa_decode.jsonl"
GRAPH_TEXT = 'graph other {\n  %0 = input(name="x", shape=[n,8], dtype=f32) : f32[n,8]\n}\n'


def _fields(graph="g0", dynamic=("n",), **extra) -> dict:
    return {**key_fields(graph, set(dynamic), "cpu"), **extra}


def _entry(root: Path, name: str, fields: dict) -> Path:
    d = root / name
    A.write_json(d / "operator.json", {"name": "other", "fields": fields, "graph": GRAPH_TEXT, "candidates": []})
    return d


@pytest.fixture
def search_here(monkeypatch):
    monkeypatch.setattr(A, "_search_missing", lambda: [], raising=False)


@pytest.fixture
def no_search(monkeypatch):
    """A serving box: egglog and z3 cannot be imported (as tests/test_runtime_e2e.py blocks them)."""
    monkeypatch.setitem(sys.modules, "egglog", None)
    monkeypatch.setitem(sys.modules, "z3", None)


# -- d01: the f32 MatMul precision is part of an artifact's match ------------------------
def test_an_entry_built_at_medium_precision_does_not_serve_highest(tmp_path, search_here):
    medium = _entry(tmp_path, "a" * 32, _fields(f32_matmul="medium"))
    with pytest.warns(UserWarning, match=r"f32 MatMul precision \(medium there, highest here\)"):
        found = A.find_operator(tmp_path, _fields())
    assert found != medium and found.parent == tmp_path
    assert A.find_operator(tmp_path, _fields(f32_matmul="medium")) == medium


def test_an_entry_without_the_precision_field_reads_as_built_at_highest(tmp_path, search_here):
    old = _entry(tmp_path, "b" * 32, _fields())  # as written before f32_matmul existed, and at "highest"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert A.find_operator(tmp_path, _fields()) == old
    with pytest.warns(UserWarning, match=r"f32 MatMul precision \(highest there, medium here\)"):
        assert A.find_operator(tmp_path, _fields(f32_matmul="medium")) != old


def mm_relu(x, w):
    return (x @ w).relu()


def test_artifact_built_at_medium_is_not_served_to_a_highest_process(tmp_path):
    from cleave.runtime.operator import f32_matmul_precision

    torch.manual_seed(0)
    x, w = torch.randn(7, 64), torch.randn(64, 24)
    want = (x.double() @ w.double()).relu()
    art = tmp_path / "art"
    torch.set_float32_matmul_precision("medium")
    try:
        assert f32_matmul_precision() == "medium"
        built = cleave.compile(mm_relu, dynamic={"x": {0: "n"}}, artifact=art, verbose=False)
        assert (built(x, w).double() - want).abs().max() > 1e-3  # f32 operands rounded to bf16
    finally:
        torch.set_float32_matmul_precision("highest")
    assert f32_matmul_precision() == "highest"
    # (no warning: this process wrote the medium entry; another one is warned, as above)
    served = cleave.compile(mm_relu, dynamic={"x": {0: "n"}}, artifact=art, verbose=False)
    assert (served(x, w).double() - want).abs().max() < 1e-4
    assert served.stats["from_cache"] == 0 and len(list(art.glob("*/operator.json"))) == 2


# -- d08: an artifact with no matching entry says so -------------------------------------
def test_no_matching_entry_and_no_search_is_one_line_naming_the_artifact(tmp_path, no_search):
    _entry(tmp_path, "c" * 32, _fields(graph="g1"))
    with pytest.raises(A.ArtifactMismatch) as err:
        A.find_operator(tmp_path, _fields(graph="g0", dynamic=("m",)))
    message = str(err.value)
    assert "\n" not in message and str(tmp_path) in message
    assert "graph (it holds other of inputs x f32[n,8])" in message and "dynamic axes ([n] there, [m] here)" in message
    assert "egglog and z3" in message
    assert len(list(tmp_path.iterdir())) == 1  # nothing written


def test_no_matching_entry_with_the_search_warns_what_differs(tmp_path, search_here):
    _entry(tmp_path, "d" * 32, _fields(graph="g1"))
    with pytest.warns(UserWarning, match=rf"artifact {tmp_path} holds no operator for this program: 1 entry, "
                                         rf"the nearest \(d+\) differing in graph"):
        A.find_operator(tmp_path, _fields(graph="g0"))


def test_building_into_an_artifact_warns_nothing_about_its_own_entries(tmp_path, search_here):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = A.find_operator(tmp_path / "new", _fields(graph="g0"))  # an empty artifact: a build
        A.write_json(first / "operator.json", {"name": "f", "fields": _fields(graph="g0"), "candidates": []})
        second = A.find_operator(tmp_path / "new", _fields(graph="g1"))  # another operator of the same build
    assert first != second


def test_trace_replay_with_an_unmatched_artifact_and_no_search_is_one_line(tmp_path, no_search, capsys):
    _entry(tmp_path / "art", "e" * 32, _fields(graph="g1"))
    rc = main(["trace", "replay", str(TRACE), "--device", "cpu", "--scale", "0.02", "--limit", "1",
               "--const", "h=4,hkv=2,d=16", "--artifact", str(tmp_path / "art")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("cleave trace: error: artifact ") and "egglog" in err[-1]
    assert "Traceback" not in "\n".join(err)


# -- d03: the public wrapper takes the runtime's parameters -----------------------------
def test_public_compile_takes_every_parameter_of_the_runtime_compile():
    from cleave.runtime.compile import compile as runtime_compile

    def params(fn):
        return {n: p.default for n, p in inspect.signature(fn).parameters.items()}

    assert params(cleave.compile) == params(runtime_compile)
    order = list(inspect.signature(cleave.compile).parameters)
    assert order[:4] == list(inspect.signature(runtime_compile).parameters)[:4] == ["fn", "dynamic", "device", "top_k"]


def test_compile_candidates_is_forwarded():
    compiled = cleave.compile(lambda x: torch.softmax(x, -1), candidates=3)
    assert compiled.ctx.candidates == 3
    with pytest.raises(ValueError, match="candidates"):
        cleave.compile(lambda x: x, candidates=0)


# -- d05: --const the program cannot take -----------------------------------------------
@pytest.mark.parametrize("action", ["replay", "build"])
def test_const_heads_not_a_multiple_of_kv_heads_is_one_line(tmp_path, capsys, action):
    extra = ["--device", "cpu", "--limit", "1"] if action == "replay" else ["--out", str(tmp_path / "out")]
    rc = main(["trace", action, str(TRACE), "--scale", "0.02", "--const", "h=4,hkv=3,d=16", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert err[-1].startswith("cleave trace: error: --const: gqa_decode cannot take the const axes")
    assert "h=4 (query heads)" in err[-1] and "hkv=3 (kv heads)" in err[-1] and "input 'q' dim 1" in err[-1]
    assert not (tmp_path / "out").exists()


def test_const_check_passes_what_the_program_takes():
    from cleave.cli.trace import _check_const

    _check_const(str(TRACE), {"h": 4, "hkv": 2, "d": 16})
    _check_const(str(TRACE), {"h": 6, "hkv": 3})


# -- d06: verbose=True prints whatever the logging setup ----------------------------------
def test_verbose_prints_when_the_level_was_set_before_progress_was_imported():
    code = """
        import logging, cleave
        logging.getLogger("cleave").setLevel(logging.WARNING)  # right after import cleave
        from cleave import progress  # imported lazily, at the first compile
        with progress.verbose(True):
            progress.report("[cleave test] shown")
        progress.report("[cleave test] hidden")
        logging.getLogger("cleave").setLevel(logging.INFO)
        progress.report("[cleave test] at info")
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       env={**os.environ, "CLEAVE_CACHE_DIR": "/nonexistent"}, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == ["[cleave test] shown", "[cleave test] at info"]


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("where", ["cleave", "root"])
def test_verbose_goes_once_to_the_applications_handler(monkeypatch, capfd, where):
    logger, root, mine = logging.getLogger("cleave"), logging.getLogger(), _Collect()
    monkeypatch.setattr(logger, "level", logging.WARNING)
    monkeypatch.setattr(logger, "handlers", [mine] if where == "cleave" else [])
    monkeypatch.setattr(logger, "propagate", where == "root")
    monkeypatch.setattr(root, "handlers", [mine] if where == "root" else [])
    capfd.readouterr()
    with progress.verbose(True):
        progress.report("[cleave test] once")
    progress.report("[cleave test] silenced by the level")
    assert mine.lines == ["[cleave test] once"]
    assert "[cleave test]" not in capfd.readouterr().err
