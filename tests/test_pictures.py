"""Pictures: `cleave show --format dot|svg` (cleave/draw.py) and `cleave trace replay
--plot` (cleave/plot.py). The DOT text is cleave's own and is checked node by node
against the graphs it draws; the plot is checked through the data it was given."""
import re
import shutil
from pathlib import Path

import pytest

from cleave.cli.main import main
from cleave.draw import REWRITTEN_COLOR, rewritten, to_dot
from cleave.ir import Graph, rebuild
from cleave.ir.contracts import Candidate
from cleave.plot import speedup_figure
from cleave.runtime.replay import ReplayResult, ShapeResult

ROOT = Path(__file__).parent.parent
NODE = re.compile(r'^\s+g(\d+)_(\d+) \[label="((?:[^"\\]|\\.)*)"(.*)\];$')
EDGE = re.compile(r"^\s+g(\d+)_(\d+) -> g\1_(\d+);$")


def _scaled_sum():
    """sum(exp(x) * 2) as written, and the rewrite that takes the scale out of the sum:
    exp(x), x and the 2 stay; the reduce (now over exp(x)) and the mul are new."""
    g = Graph("scaled_sum")
    x = g.input("x", ["n", "m"])
    g.output((x.exp() * 2.0).sum(-1), names=["y"])
    c = Graph("scaled_sum")
    x = c.input("x", ["n", "m"])
    c.output(x.exp().sum(-1) * 2.0, names=["y"])
    return g, Candidate(rebuild(c), derivation=["scale-out-of-sum"])


def _dot_nodes(dot: str) -> dict[int, dict[int, tuple[str, str]]]:
    """cluster -> node id -> (label, style), from the DOT text."""
    out: dict[int, dict[int, tuple[str, str]]] = {}
    for line in dot.splitlines():
        m = NODE.match(line)
        if m:
            out.setdefault(int(m[1]), {})[int(m[2])] = (m[3], m[4])
    return out


def test_rewritten_marks_the_new_computations_only():
    graph, candidate = _scaled_sum()
    marked = {candidate.graph.nodes[i].op for i in rewritten(graph, candidate.graph)}
    assert marked == {"reduce", "mul"}
    assert rewritten(graph, rebuild(graph)) == set()  # a graph rewrites nothing of itself


def test_dot_draws_every_node_and_edge_and_fills_exactly_the_rewritten_ones():
    graph, candidate = _scaled_sum()
    dot = to_dot(graph, [candidate])
    clusters = _dot_nodes(dot)
    assert sorted(clusters) == [0, 1]
    assert "candidate 0, derivation: scale-out-of-sum" in dot
    edges = [EDGE.match(line).groups() for line in dot.splitlines() if EDGE.match(line)]
    for index, drawn in ((0, rebuild(graph)), (1, candidate.graph)):
        nodes = drawn.live_nodes()
        assert sorted(clusters[index]) == sorted(n.id for n in nodes)
        for n in nodes:  # the label is the node's line of the text form, shape on its own line
            label, _ = clusters[index][n.id]
            line = next(t.strip() for t in drawn.text().splitlines() if t.strip().startswith(f"%{n.id} = "))
            assert label.replace("\\n", " : ").replace('\\"', '"') == line
        drawn_edges = sorted((int(a), int(b)) for c, a, b in edges if int(c) == index)
        assert drawn_edges == sorted((x.id, n.id) for n in nodes for x in n.inputs)
        assert f"g{index}_out_y" in dot
    filled = {i for i, (_, style) in clusters[1].items() if REWRITTEN_COLOR in style}
    assert {candidate.graph.nodes[i].op for i in filled} == {"reduce", "mul"}
    assert not any(REWRITTEN_COLOR in style for _, style in clusters[0].values())


def test_show_with_candidates_draws_and_lists_what_the_search_returned(monkeypatch, tmp_path, capsys):
    graph, candidate = _scaled_sum()
    path = tmp_path / "scaled_sum.cir"
    path.write_text(graph.text())
    monkeypatch.setattr("cleave.cli.show._candidates", lambda g, n: [candidate] * n)
    assert main(["show", str(path), "--format", "dot", "--candidates", "2"]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith("digraph cleave {") and sorted(_dot_nodes(dot)) == [0, 1, 2]
    assert main(["show", str(path), "--candidates", "1"]) == 0
    new = sorted(n.id for n in candidate.graph.nodes if n.op in ("reduce", "mul"))
    assert f"# rewritten nodes: {' '.join(f'%{i}' for i in new)}\n" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed; the DOT tests cover "
                                                          "what it draws")
def test_show_svg_renders_every_node(capsys):
    assert main(["show", "layernorm", "--format", "svg"]) == 0
    svg = capsys.readouterr().out
    assert "<svg" in svg
    assert all(f"<title>g0_{n.id}</title>" in svg for n in rebuild(_layernorm()).live_nodes())


def _layernorm():
    from cleave import workloads

    return workloads.get("layernorm").graph


def test_show_svg_without_dot_says_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["show", "layernorm", "--format", "svg"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "graphviz" in err and "--format dot" in err


# -- the replay plot ------------------------------------------------------------------


def _result(graph_times: bool) -> ReplayResult:
    shapes = [ShapeResult({"b": b, "L": 64 * b}, cleave_ms=c, sdpa_ms=s, max_error=0.0,
                          cleave_graph_ms=c * 0.9 if graph_times else None,
                          sdpa_graph_ms=s if graph_times else None)
              for b, c, s in ((1, 2.0, 1.0), (2, 1.0, 1.5), (4, 0.5, 2.0))]
    return ReplayResult("gqa_decode", "cuda", shapes,
                        stats={"searches": 1, "compiles": 1, "from_cache": 0, "tunings": 0})


@pytest.mark.parametrize("graph_times", [True, False])
def test_plot_has_one_point_per_shape_at_its_speedup(graph_times):
    result = _result(graph_times)
    lines = speedup_figure(result).axes[0].get_lines()
    series = [line for line in lines if len(line.get_xdata()) == len(result.shapes)]
    assert len(series) == (2 if graph_times else 1)
    assert list(series[0].get_ydata()) == pytest.approx([0.5, 1.5, 4.0])
    if graph_times:
        assert list(series[1].get_ydata()) == pytest.approx([0.5 / 0.9, 1.5 / 0.9, 4.0 / 0.9])
    assert any(list(line.get_ydata()) == [1.0, 1.0] for line in lines)  # the reference's line


def _fake_replay(calls):
    def replay(path, **kwargs):
        calls.append(path)
        return _result(True)
    return replay


def test_trace_replay_plot_writes_a_png(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr("cleave.runtime.replay.replay", _fake_replay(calls))
    png = tmp_path / "speedup.png"
    trace = str(ROOT / "traces" / "workloads" / "gqa_decode.jsonl")
    assert main(["trace", "replay", trace, "--device", "cpu", "--plot", str(png)]) == 0
    assert calls == [trace] and f"wrote {png}" in capsys.readouterr().err
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_trace_replay_plot_without_matplotlib_fails_before_replaying(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr("cleave.runtime.replay.replay", _fake_replay(calls))
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # `import matplotlib` now fails
    trace = str(ROOT / "traces" / "workloads" / "gqa_decode.jsonl")
    assert main(["trace", "replay", trace, "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert calls == [] and len(err.splitlines()) == 1 and "pip install matplotlib" in err
