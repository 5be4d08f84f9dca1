"""`cleave --version`, `workloads`, `show`, `cache`, and bad input to `trace` and
`explain`, run in-process."""
import errno
import shutil

import pytest
import torch
from test_runtime_cache import DoubleSearch, install_doubles

from cleave import __version__, workloads
from cleave.cli.main import main
from cleave.ir import parse_graph
from cleave.runtime import cache
from cleave.runtime.operator import CompiledOperator


def test_version(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"cleave {__version__}\n" == "cleave 0.1.0\n"


def test_workloads_lists_every_workload_with_presets(capsys):
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    for name in workloads.names():
        assert name in out
    assert "presets" in out


@pytest.mark.parametrize("name", workloads.names())
def test_show_prints_a_parsable_graph(name, capsys):
    """All of it: the constraints and presets after the graph are comments (they made
    `cleave show NAME > g.cir` a file cleave could not read back)."""
    assert main(["show", name]) == 0
    out = capsys.readouterr().out
    assert parse_graph(out).key() == workloads.get(name).graph.key()
    for preset in workloads.get(name).presets:
        assert f"# preset {preset}:" in out


def test_show_reads_a_graph_file(tmp_path, capsys):
    path = tmp_path / "g.cir"
    path.write_text(workloads.get("layernorm").graph.text())
    assert main(["show", str(path)]) == 0
    assert capsys.readouterr().out.startswith("graph layernorm {")


def test_unknown_workload_is_one_clear_line_and_exit_2(capsys):
    assert main(["show", "no_such_workload"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert "unknown workload 'no_such_workload'" in lines[0] and "mha" in lines[0]
    assert captured.out == ""


def test_a_missing_graph_file_is_named_as_a_file(tmp_path, capsys):
    path = tmp_path / "g.cir"
    assert main(["show", str(path)]) == 2
    assert capsys.readouterr().err == f"cleave show: error: graph file {path} does not exist\n"


def test_a_file_that_is_not_a_graph_is_named(tmp_path, capsys):
    path = tmp_path / "weights.cir"
    path.write_bytes(b"\x80\x04not text")
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cleave show: error: {path}: ") and len(err.splitlines()) == 1


# -- cache -------------------------------------------------------------------
def _rmsnorm_matmul_shapes(s, k, n):
    return {"x": (s, k), "w": (k, n)}


@pytest.fixture
def one_cached_operator(monkeypatch, tmp_path):
    """An operator built (searched and scheduled, not launched) into a fresh cache dir,
    the search and the scheduler replaced by test_runtime_cache's doubles: what is
    under test is the cache."""
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path / "cache"))
    install_doubles(monkeypatch)
    DoubleSearch.calls = 0
    op = CompiledOperator(workloads.get("rmsnorm_matmul").graph, {"s"})
    op.prepare(_rmsnorm_matmul_shapes(s=7, k=9, n=5))
    return op


def test_cache_clear_reports_an_entry_it_cannot_remove(one_cached_operator, monkeypatch, capsys):
    # What rmtree raises in a read-only cache dir; patched because root (CI) may write anywhere.
    def rmtree(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path / "operator.json"))

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    assert main(["cache", "clear"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("cleave cache: error: removed 0 of 1 cached operator(s); could not remove "
                                   f"{one_cached_operator.entry} (") and "Permission denied" in captured.err
    assert one_cached_operator.entry.is_dir()


def test_cache_ls_says_what_happens_to_a_damaged_operator_json(one_cached_operator, capsys):
    w = workloads.get("rmsnorm_matmul")
    path = one_cached_operator.entry / "operator.json"
    path.write_text(path.read_text()[:50])
    assert main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert f"DAMAGED: {path} is unreadable" in out
    assert "its 1 scheduled binding(s) still load; a new binding searches again, which rewrites it" in out
    # As ls says: the scheduled binding loads without the search, and the file stays damaged ...
    op = CompiledOperator(w.graph, {"s"})
    op.prepare(_rmsnorm_matmul_shapes(s=3, k=9, n=5))
    assert op.stats["searches"] == 0 and op.stats["from_cache"] == 1
    assert cache.entries()[0]["damaged"]
    # ... until a new binding of the static symbols needs the candidates.
    with pytest.warns(UserWarning, match="damaged cache entry"):
        op.prepare(_rmsnorm_matmul_shapes(s=3, k=13, n=5))
    assert op.stats["searches"] == 1 and cache.entries()[0]["damaged"] is None


def test_cache_ls_of_a_damaged_entry_without_bindings(one_cached_operator, capsys):
    entry = one_cached_operator.entry
    (entry / "operator.json").write_text("{}")
    for spec in entry.glob("spec-*"):
        shutil.rmtree(spec)
    assert main(["cache", "ls"]) == 0
    assert "is not a cleave artifact of format 2; the next use searches again and rewrites it" in \
        capsys.readouterr().out


# -- trace and explain ---------------------------------------------------------
@pytest.mark.parametrize("option, value, message", [
    ("--limit", "0", "argument --limit: must be >= 1, got 0"),  # used to replay every shape
    ("--limit", "-1", "argument --limit: must be >= 1, got -1"),  # used to drop the last one
    ("--scale", "0", "argument --scale: must be a finite number > 0, got '0'"),
])
def test_trace_replay_rejects_a_bad_number(option, value, message, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["trace", "replay", "traces/workloads/gqa_decode.jsonl", option, value])
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"cleave trace replay: error: {message}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_explain_on_cuda_without_a_gpu_is_one_line(capsys):
    assert main(["explain", "layernorm", "--device", "cuda"]) == 2
    assert capsys.readouterr().err == ("cleave explain: error: --device cuda: no CUDA device here "
                                       "(use --device cpu with TRITON_INTERPRET=1)\n")


def test_trace_build_into_a_file_is_refused_before_any_search(tmp_path, capsys):
    """`--out` naming a file exited 0 and printed "replay with ... --artifact FILE",
    with nothing written (warnings about "the cache" aside)."""
    out = tmp_path / "artifact"
    out.write_text("")
    assert main(["trace", "build", "traces/workloads/gqa_decode.jsonl", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}: cannot write the artifact there (it is a file)" in err and "searching" not in err


def test_cache_commands_say_when_the_cache_dir_lies_under_a_file(tmp_path, monkeypatch, capsys):
    """`cleave cache ls` with CLEAVE_CACHE_DIR under a file listed "0 operator(s)"."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(blocker / "cache"))
    for action in ("ls", "clear"):
        assert main(["cache", action]) == 1
        assert f"{blocker} is a file" in capsys.readouterr().err


def test_optimize_of_a_graph_without_outputs_says_so_before_its_shapes(tmp_path, capsys):
    # with --shape it said the graph has no symbol n ("its symbols: (none...)")
    path = tmp_path / "noout.cir"
    path.write_text('graph g {\n  %0 = input(name="x", shape=[n], dtype=f32) : f32[n]\n  return\n}\n')
    assert main(["optimize", str(path), "--shape", "n=5"]) == 2
    assert capsys.readouterr().err == "cleave optimize: error: graph 'g' has no outputs: nothing to optimize\n"


def test_a_trace_that_is_not_text_is_named(tmp_path, capsys):
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b"\xff\xfe\x00trace")
    assert main(["trace", "replay", str(path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == f"cleave trace: error: {path}: not a text file (JSON lines in UTF-8): byte 0 is b'\\xff'"




def test_a_warning_is_one_line_naming_the_command(monkeypatch):
    """A warning a subcommand raises is shown as one line: it printed the path and source
    line of cleave's code (".../cli/optimize.py:187: BudgetWarning: ... result = search(...)")."""
    import warnings

    from cleave.cli import workloads as command
    from cleave.search import BudgetWarning

    shown = []

    def warns(args):
        shown.append(warnings.formatwarning("time budget reached", BudgetWarning, command.__file__, 187, "search()"))
        return 0

    monkeypatch.setattr(command, "_list", warns)
    assert main(["workloads"]) == 0
    assert shown == ["cleave workloads: BudgetWarning: time budget reached\n"]
    assert "cleave workloads" not in warnings.formatwarning("w", UserWarning, "f.py", 1, "")  # as it was after
