"""Graphs and candidates as pictures: graphviz DOT text, written here with no
dependency, and SVG through graphviz's `dot` program when it is installed.

A candidate's rewritten nodes are those it computes and the graph as written does
not: two nodes are the same computation when their op, attributes and operands are
(operands compared the same way, down to the named inputs).
"""
from __future__ import annotations

import shutil
import subprocess

from .ir import CleaveError, Graph, rebuild
from .ir.contracts import Candidate

REWRITTEN_COLOR = "#ffcf70"
INPUT_COLOR = "#dde8f5"


def _nodes(graph: Graph) -> list:
    """Every declared input, then the live nodes: the order of the text form."""
    return list(graph.inputs.values()) + [n for n in graph.live_nodes() if n.op != "input"]


def _classes(graph: Graph, table: dict[tuple, int]) -> dict[int, int]:
    """Node id -> computation class, numbered through `table`, which graphs share:
    interning each node's signature to an int keeps nested signatures flat."""
    out: dict[int, int] = {}
    for n in _nodes(graph):
        attrs = tuple((k, repr(v) if isinstance(v, float) else str(v)) for k, v in sorted(n.attrs.items()))
        signature = (n.op, tuple(out[x.id] for x in n.inputs), attrs)
        out[n.id] = table.setdefault(signature, len(table))
    return out


def rewritten(original: Graph, candidate: Graph) -> set[int]:
    """Ids of the candidate's nodes that compute what no node of `original` computes."""
    table: dict[tuple, int] = {}
    known = set(_classes(original, table).values())
    return {nid for nid, c in _classes(candidate, table).items() if c not in known}


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _node_lines(graph: Graph) -> dict[int, str]:
    """Each node's line of the text form, keyed by its printed id."""
    lines = {}
    for line in graph.text().splitlines():
        line = line.strip()
        if line.startswith("%"):
            lines[int(line[1:line.index(" ")])] = line
    return lines


def _cluster(index: int, title: str, graph: Graph, marked: set[int]) -> list[str]:
    """One graph as a cluster; node names carry `index` so that clusters never share one.
    `graph` must be renumbered (ir.rebuild) so that node ids are its printed ids."""
    lines = _node_lines(graph)
    out = [f"  subgraph cluster_{index} {{", f"    label={_quote(title)};"]
    for n in _nodes(graph):
        computation, _, shape = lines[n.id].partition(" : ")
        style = ""
        if n.id in marked:
            style = f', style=filled, fillcolor="{REWRITTEN_COLOR}", penwidth=2'
        elif n.op == "input":
            style = f', style=filled, fillcolor="{INPUT_COLOR}"'
        out.append(f"    g{index}_{n.id} [label={_quote(computation + chr(10) + shape)}{style}];")
        out.extend(f"    g{index}_{x.id} -> g{index}_{n.id};" for x in n.inputs)
    for name, node in zip(graph.output_names, graph.outputs):
        out.append(f"    g{index}_out_{name} [label={_quote('return ' + name)}, shape=ellipse];")
        out.append(f"    g{index}_{node.id} -> g{index}_out_{name};")
    out.append("  }")
    return out


def to_dot(graph: Graph, candidates: list[Candidate] = ()) -> str:
    """The graph as written, then each candidate beside it with its rewritten nodes filled."""
    written = rebuild(graph)
    body = _cluster(0, f"{graph.name} (as written)", written, set())
    for i, c in enumerate(candidates):
        # The symbolic cost stays out: it runs to hundreds of characters (`cleave optimize` prints it).
        title = f"candidate {i}, derivation: {', '.join(c.derivation) or '(none, the graph as written)'}"
        body += _cluster(i + 1, title, c.graph, rewritten(written, c.graph))
    header = ["digraph cleave {", "  rankdir=TB;", '  node [shape=box, fontname="monospace", fontsize=10];',
              '  graph [fontname="monospace", fontsize=11, labeljust=l];']
    return "\n".join(header + body + ["}"]) + "\n"


def dot_program() -> str:
    """The path of graphviz's `dot`, or an error that says how to install it."""
    program = shutil.which("dot")
    if program is None:
        raise CleaveError("--format svg needs graphviz's `dot` program on PATH (apt-get install graphviz, "
                          "brew install graphviz or conda install graphviz); --format dot needs nothing")
    return program


def to_svg(dot: str, program: str) -> str:
    """SVG text rendered from DOT text by graphviz's `dot` program."""
    run = subprocess.run([program, "-Tsvg"], input=dot, capture_output=True, text=True)
    if run.returncode != 0:
        raise CleaveError(f"dot -Tsvg failed: {run.stderr.strip()}")
    return run.stdout
