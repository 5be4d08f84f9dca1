"""`cleave workloads` and `cleave show`, run in-process."""
import pytest

from cleave import workloads
from cleave.cli.main import main
from cleave.ir import parse_graph


def test_workloads_lists_every_workload_with_presets(capsys):
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    for name in workloads.names():
        assert name in out
    assert "presets" in out


@pytest.mark.parametrize("name", workloads.names())
def test_show_prints_a_parsable_graph(name, capsys):
    assert main(["show", name]) == 0
    out = capsys.readouterr().out
    text = out[:out.index("}\n") + 2]
    assert parse_graph(text).key() == workloads.get(name).graph.key()
    for preset in workloads.get(name).presets:
        assert f"preset {preset}:" in out


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
