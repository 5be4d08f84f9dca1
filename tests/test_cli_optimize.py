"""`cleave optimize`: candidates, the scheduled plan in --json, kernels written by --emit,
and one clear line (exit 2) for bad input."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

import cleave.search  # noqa: F401  (the package, so that "cleave.search.search" can be patched)
from cleave import workloads
from cleave.cli.main import main
from cleave.ir import BindingError, Candidate


def test_optimize_json_has_candidates_and_a_plan(capsys):
    # The default --top-k: there the scheduler cannot tile one of gqa_decode's candidates,
    # which used to abort the command (CI ran --top-k 2 and never saw it).
    assert main(["optimize", "gqa_decode", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["candidates"] and out["candidates"][0]["derivation"]
    plan = out["plan"]
    assert plan["shapes"] == {"b": 8, "hkv": 8, "g": 4, "L": 8192, "d": 128}  # the first preset
    assert set(plan) >= {"kernels", "split", "tiles", "cost"}
    # a partial kernel that runs its split's combine stands for two
    computed = sum(2 if k["arrivals"] else 1 for k in plan["kernels"])
    assert computed == (2 if plan["split"].get("s_L", 1) > 1 else 1)
    for k in plan["kernels"]:
        assert k["name"] and k["grid"] and "@triton.jit" in k["source"]


def test_emit_writes_kernels_that_run(tmp_path, capsys):
    out = tmp_path / "kernels"
    args = ["optimize", "layernorm", "--quiet", "--shape", "t=7", "--shape", "n=37", "--emit", str(out)]
    assert main(args) == 0
    files = sorted(os.listdir(out))
    assert "plan.json" in files and "run.py" in files and any(f.startswith("layernorm_k") for f in files)
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, str(out / "run.py")], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    error = float(run.stdout.split("relative error")[1].split()[0])
    assert error < 1e-2


def test_emitted_runner_checks_integer_outputs_against_the_input_graph(tmp_path, capsys, monkeypatch):
    """run.py printed "relative error 0" for every integer output (the router's topk
    indices), whatever the kernels returned; it now counts their wrong elements, against
    the graph as written (graph.cir) rather than the candidate the plan was made from."""
    import runpy

    import cleave.runtime.launch as launching

    out = tmp_path / "kernels"
    assert main(["optimize", "moe_routing", "--quiet", "--top-k", "1", "--shape", "t=9", "--emit", str(out)]) == 0
    capsys.readouterr()
    runpy.run_path(str(out / "run.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert any(" 0 of " in line and "elements differ" in line for line in lines), lines
    real = launching.launch
    monkeypatch.setattr(launching, "launch", lambda *a, **k: [o if o.is_floating_point() else o + 1
                                                                for o in real(*a, **k)])
    runpy.run_path(str(out / "run.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert not any(" 0 of " in line for line in lines) and any("elements differ" in line for line in lines), lines


def test_a_graph_file_without_shapes_is_a_clear_error(tmp_path, capsys):
    from cleave import workloads

    path = tmp_path / "g.cir"
    path.write_text(workloads.get("layernorm").graph.text())
    assert main(["optimize", str(path), "--quiet"]) == 2
    assert "no value for n, t" in capsys.readouterr().err


def test_a_preset_of_a_graph_file_is_refused_naming_why(tmp_path, capsys):
    """It was ignored, and the error named the missing sizes only."""
    from cleave import workloads

    path = tmp_path / "g.cir"
    path.write_text(workloads.get("layernorm").graph.text())
    assert main(["optimize", str(path), "--preset", "s4096", "--quiet"]) == 2
    assert "--preset s4096" in capsys.readouterr().err


@pytest.mark.slow  # the same path as gqa_decode above, at the default --top-k
@pytest.mark.parametrize("name", ["mqa_decode", "mla_decode"])
def test_optimize_schedules_the_other_decode_workloads(name, capsys):
    assert main(["optimize", name, "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["kernels"]


LAYERNORM = ["optimize", "layernorm", "--quiet", "--shape", "t=7", "--shape", "n=37"]


@pytest.fixture
def two_candidates(monkeypatch):
    """The search stubbed out (it takes seconds): layernorm's graph, twice, as candidates 0 and 1."""
    graph = workloads.get("layernorm").graph
    candidates = [Candidate(graph, derivation=["first"]), Candidate(graph, derivation=["second"])]
    result = SimpleNamespace(candidates=candidates, stats={})
    monkeypatch.setattr("cleave.search.search", lambda *args, **kwargs: result)
    return candidates


def _unschedulable(monkeypatch, bad):
    """The scheduler raises for the candidates in `bad`, as it does when no tiling fits."""
    import cleave.scheduler

    real = cleave.scheduler.schedule

    def schedule(candidate, shapes, **kwargs):
        if any(candidate is c for c in bad):
            raise BindingError("scheduler: no tiling of kernel layernorm_k0 fits the target")
        return real(candidate, shapes, **kwargs)

    monkeypatch.setattr(cleave.scheduler, "schedule", schedule)


def test_a_candidate_that_cannot_be_scheduled_is_skipped_and_named(two_candidates, monkeypatch, capsys):
    _unschedulable(monkeypatch, bad=two_candidates[:1])
    assert main(LAYERNORM + ["--verbose"]) == 0
    captured = capsys.readouterr()
    assert "# plan at {'t': 7, 'n': 37}: candidate 1," in captured.out
    assert "candidate 0 not scheduled: scheduler: no tiling of kernel layernorm_k0 fits" in captured.err


def test_no_schedulable_candidate_is_an_error_naming_each_reason(two_candidates, monkeypatch, capsys):
    _unschedulable(monkeypatch, bad=two_candidates)
    assert main(LAYERNORM) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("cleave optimize: error: no candidate can be scheduled")
    assert "candidate 0: scheduler: no tiling" in err and "candidate 1: scheduler: no tiling" in err


def test_the_graph_as_written_is_the_last_resort(monkeypatch, capsys):
    other = workloads.get("moe_routing").graph  # its expert count is not bound at layernorm's shapes
    result = SimpleNamespace(candidates=[Candidate(other, derivation=["elsewhere"])], stats={})
    monkeypatch.setattr("cleave.search.search", lambda *args, **kwargs: result)
    assert main(LAYERNORM + ["--verbose"]) == 0
    captured = capsys.readouterr()
    assert "# plan at {'t': 7, 'n': 37}: the graph as written," in captured.out
    assert "candidate 0 not scheduled" in captured.err


@pytest.mark.parametrize("option, value, message", [
    ("--top-k", "0", "argument --top-k: must be >= 1, got 0"),
    ("--top-k", "-1", "argument --top-k: must be >= 1, got -1"),
    ("--iterations", "0", "argument --iterations: must be >= 1, got 0"),
    ("--enodes", "0", "argument --enodes: must be >= 1, got 0"),
    ("--enodes", "many", "argument --enodes: expected a positive integer, got 'many'"),
    ("--seconds", "0", "argument --seconds: must be a finite number > 0, got '0'"),
    ("--seconds", "nan", "argument --seconds: must be a finite number > 0, got 'nan'"),
    ("--shape", "t=0", "argument --shape: t=0: extents must be >= 1 to schedule at"),
    ("--shape", "t=-3", "argument --shape: t=-3: extents must be >= 1 to schedule at"),
    ("--shape", "t=2.5", "argument --shape: t='2.5': N must be an integer"),
    ("--shape", "t", "argument --shape: expected SYM=N, got 't'"),
])
def test_a_bad_number_is_rejected_before_the_search(option, value, message, monkeypatch, capsys):
    # 0 used to reach the search API, where `x or default` read it as "not given".
    monkeypatch.setattr("cleave.search.search", lambda *a, **k: pytest.fail("searched despite a bad option"))
    with pytest.raises(SystemExit) as exit:
        main(["optimize", "layernorm", option, value])
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"cleave optimize: error: {message}"


@pytest.mark.parametrize("target", ["missing.cir", "graphs/missing", "notes.txt"])
def test_a_missing_graph_file_is_named_as_a_file(target, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["optimize", target]) == 2
    assert capsys.readouterr().err == f"cleave optimize: error: graph file {target} does not exist\n"


def test_an_unknown_workload_lists_the_known_ones(capsys):
    assert main(["optimize", "no_such_workload"]) == 2
    err = capsys.readouterr().err
    assert "unknown workload 'no_such_workload'" in err and "gqa_decode" in err


def test_emit_to_an_unwritable_path_is_a_clear_error(two_candidates, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # a directory cannot be made inside a file, even as root
    assert main(LAYERNORM + ["--emit", str(blocker / "kernels")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cleave optimize: error: --emit {blocker / 'kernels'}: cannot write ")
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_emit_without_a_plan_is_rejected_before_the_search(monkeypatch, capsys):
    monkeypatch.setattr("cleave.search.search", lambda *a, **k: pytest.fail("searched despite a bad option"))
    assert main(["optimize", "layernorm", "--no-schedule", "--emit", "out"]) == 2
    assert "--emit needs a plan (drop --no-schedule)" in capsys.readouterr().err
