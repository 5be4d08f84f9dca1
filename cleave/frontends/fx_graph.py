"""An aten-level FX graph, as torch.compile hands it to a backend (dynamo's graph
lowered by AOTAutograd with `decompositions.table()`), into an IR graph.

Nothing is traced again: each node's meta value gives its shape and dtype,
placeholders are the inputs (named as in the graph), and a dim torch made symbolic
(`mark_dynamic`, automatic dynamic shapes, `dynamic=True`) is an IR symbol named
after torch's (`s0`, `s77`). Every other dim is an int, so a module's parameters
are static. Integer placeholders (sizes dynamo passes along) are their values; one
whose symbol no tensor's dim carries (`x[:n]` with n an argument) is also an input of
its own, a [n] tensor the launcher makes from the int (Captured.size_inputs), so the
operator reads its value off the shapes as it reads every other symbol.
"""
from __future__ import annotations

import sympy
import torch

from ..ir import Graph, rebuild
from ..ir.graph import fresh_name
from . import aten_map
from .capture import Captured, constant_node
from .errors import UnequalSymbols, UnsupportedOpError, source_of
from .masks import simplify_masks
from .layout_sink import sink_layouts
from .regroup import regroup_repeated_operands
from .symbols import SymbolMap
from .translate import Translator, ir_dtype


def translate_graph_module(gm: torch.fx.GraphModule, name: str) -> Captured:
    """The IR graph of gm. Raises UnsupportedOpError naming the first node cleave
    cannot express (the caller cuts the graph there).

    Dims torch traced as two symbols that an op needs equal (a MatMul's contracted
    dims, broadcast dims; torch's own meta functions do not always guard them: SDPA's
    k and v lengths under automatic dynamic shapes) become one symbol, and the graph
    is translated again. The operator's binding checks every input dim against its
    symbol, so inputs where they differ run eagerly (graph_breaks.Launcher). Only
    symbols some tensor input's dim binds are merged: a size passed as a number is
    checked by nothing."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    bound = {str(d.node.expr) for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)
             for d in n.meta["val"].shape if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol)}
    same: dict[str, str] = {}  # a symbol's name -> the one it is read as
    while True:
        try:
            return _translate(gm, name, placeholders, same)
        except UnequalSymbols as err:
            a, b = (_root(same, s) for s in err.symbols)
            if a == b or not {a, b} <= bound:
                raise
            same[max(a, b)] = min(a, b)


def _root(same: dict[str, str], s: str) -> str:
    while s in same:
        s = same[s]
    return s


def _translate(gm, name: str, placeholders, same: dict[str, str]) -> Captured:
    symbols = SymbolMap()
    for node in placeholders:  # name torch's symbols before reading any shape
        val = node.meta.get("val")
        for d in (val.shape if isinstance(val, torch.Tensor) else [val]):
            if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol):
                symbols.name(d.node.expr, _root(same, str(d.node.expr)))
    graph = Graph(name)
    t = Translator(graph, symbols)
    constants: dict = {}
    for node in placeholders:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            shape = tuple(t.size(d) for d in val.shape)
            t.set(node, graph.input(node.name, shape, ir_dtype(val.dtype, f"input {node.name!r}", source_of(node))))
        elif isinstance(val, aten_map.SIZE_TYPES):
            t.set(node, t.size(val))
        else:
            raise UnsupportedOpError(f"input {node.name}", None, f"a placeholder holding {type(val).__name__}")
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            t.set(node, constant_node(t, getattr(gm, node.target), node, constants, {p.name for p in placeholders}))
        elif node.op == "call_function" and not aten_map.is_ignored(node):
            t.translate(node)
        elif node.op == "output":
            _outputs(t, graph, node)
    size_inputs = _size_inputs(graph, placeholders, t)
    return Captured(sink_layouts(regroup_repeated_operands(simplify_masks(rebuild(graph)))), constants=constants,
                    size_inputs=size_inputs)


def _size_inputs(graph: Graph, placeholders, t) -> list[str]:
    """Declare an input [n] for each int placeholder n that the graph's ops use and no
    tensor input's dim carries, when torch knows n >= 0 (a length); return their names."""
    carried = {s for n in graph.inputs.values() for d in n.shape for s in sympy.sympify(d).free_symbols}
    used = {s for n in graph.live_nodes() for d in n.shape for s in sympy.sympify(d).free_symbols}
    used |= {s for n in graph.live_nodes() for v in n.attrs.values() if isinstance(v, sympy.Expr)
             for s in v.free_symbols}
    names = []
    for node in placeholders:
        val = node.meta.get("val")
        if not isinstance(val, torch.SymInt):
            continue
        size = t.size(val)
        if isinstance(size, sympy.Symbol) and size in used - carried and _at_least_zero(val):
            graph.input(node.name, (size,), "bool")
            names.append(node.name)
            carried.add(size)
    return names


def _at_least_zero(val: torch.SymInt) -> bool:
    env = val.node.shape_env
    return env is not None and env.bound_sympy(val.node.expr).lower >= 0


def _outputs(t, graph, node) -> None:
    """Declare the graph's outputs: tensors the kernels compute (the launcher makes the
    views and sizes a region returns on the host, graph_breaks.plan_outputs)."""
    raw = node.args[0]
    values = [t.value(v) for v in (raw if isinstance(raw, (tuple, list)) else [raw])]
    for k, v in enumerate(values):
        if not hasattr(v, "graph"):
            raise UnsupportedOpError("output", source_of(node), f"output {k} is {v!r}, not a tensor")
    graph.output(*values, names=[fresh_name(f"out{k}", graph.inputs) for k in range(len(values))])
