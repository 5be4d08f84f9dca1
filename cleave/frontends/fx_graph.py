"""An aten-level FX graph, as torch.compile hands it to a backend (dynamo's graph
lowered by AOTAutograd with `decompositions.table()`), into an IR graph.

Nothing is traced again: each node's meta value gives its shape and dtype,
placeholders are the inputs (named as in the graph), and a dim torch made symbolic
(`mark_dynamic`, automatic dynamic shapes, `dynamic=True`) is an IR symbol named
after torch's (`s0`, `s77`). Every other dim is an int, so a module's parameters
are static. Integer placeholders (sizes dynamo passes along) are their values; one
whose symbol no tensor's dim carries (`x[:n]` with n an argument) is also an input of
its own, a [n] tensor the launcher makes from the int (Captured.size_inputs), so the
operator reads its value off the shapes as it reads every other symbol. An int torch
does not know to be >= 0 (an offset that automatic dynamic shapes made symbolic,
`x + pos`) is read as p - q, two such inputs of lengths max(n, 0) + 1 and
max(-n, 0) + 1.
"""
from __future__ import annotations

import sympy
import torch

from ..ir import Graph, rebuild
from ..ir import dims as D
from ..ir.graph import fresh_name
from . import aten_map
from .capture import Captured, constant_node
from .errors import UnequalResidue, UnequalSymbols, UnsupportedOpError, source_of
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
    checked by nothing. Likewise dims of one symbol s that are equal only where s is
    c·t + r (the halves of `x.chunk(2)` over a dynamic width) read s as c·t + r: the
    binding solves t, and an input where it has no solution runs eagerly."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    bound = {str(d.node.expr) for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)
             for d in n.meta["val"].shape if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol)}
    same: dict[str, str] = {}  # a symbol's name -> the one it is read as
    residues: dict[str, tuple[int, int]] = {}  # a symbol's name -> (c, r): read as c·t + r
    while True:
        try:
            return _translate(gm, name, placeholders, same, residues)
        except UnequalSymbols as err:
            a, b = (_root(same, s) for s in err.symbols)
            if a == b or not {a, b} <= bound or {a, b} & set(residues):
                raise
            same[max(a, b)] = min(a, b)
        except UnequalResidue as err:
            if err.symbol not in bound or err.symbol in residues:
                raise
            residues[err.symbol] = (err.divisor, err.residue)


def _root(same: dict[str, str], s: str) -> str:
    while s in same:
        s = same[s]
    return s


def _translate(gm, name: str, placeholders, same: dict[str, str], residues: dict) -> Captured:
    symbols = SymbolMap()
    carried = {d.node.expr for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)
               for d in n.meta["val"].shape if isinstance(d, torch.SymInt)}
    signed = {}  # int placeholder -> the names of its two carriers, pos and neg
    for node in placeholders:  # name torch's symbols before reading any shape
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol) \
                and val.node.expr not in carried and not _at_least_zero(val):
            names = set(signed.values()) | {p.name for p in placeholders}
            pos = fresh_name(f"{node.name}_pos", names)
            signed[node.name] = (pos, fresh_name(f"{node.name}_neg", names | {pos}))
            symbols.signed(val.node.expr, *signed[node.name])
            continue
        for d in (val.shape if isinstance(val, torch.Tensor) else [val]):
            if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol):
                root = _root(same, str(d.node.expr))
                if root in residues:
                    c, r = residues[root]
                    symbols.residue(d.node.expr, f"{root}_by{c}", c, r)
                else:
                    symbols.name(d.node.expr, root)
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
    size_inputs = _size_inputs(graph, placeholders, t, signed)
    return Captured(sink_layouts(regroup_repeated_operands(simplify_masks(rebuild(graph)))), constants=constants,
                    size_inputs=size_inputs)


def _size_inputs(graph: Graph, placeholders, t, signed: dict) -> list[tuple[str, str, str]]:
    """Declare an input [n] for each int placeholder n that the graph's ops use and no
    tensor input's dim carries, when torch knows n >= 0 (a length), and inputs [p] and
    [q] for one it does not (`signed`: read as p - q); return (graph input, placeholder,
    kind) for each, kind "len", "pos" or "neg" (Captured.size_inputs)."""
    carried = {s for n in graph.inputs.values() for d in n.shape for s in sympy.sympify(d).free_symbols}
    used = {s for n in graph.live_nodes() for d in n.shape for s in sympy.sympify(d).free_symbols}
    used |= {s for n in graph.live_nodes() for v in n.attrs.values() if isinstance(v, sympy.Expr)
             for s in v.free_symbols}
    out = []
    for node in placeholders:
        val = node.meta.get("val")
        if not isinstance(val, torch.SymInt):
            continue
        if node.name in signed:
            pos, neg = signed[node.name]
            if {D.symbol(pos), D.symbol(neg)} & used:
                for name, kind in ((pos, "pos"), (neg, "neg")):
                    graph.input(name, (D.symbol(name),), "bool")
                    out.append((name, node.name, kind))
            continue
        size = t.size(val)
        if isinstance(size, sympy.Symbol) and size in used - carried and _at_least_zero(val):
            graph.input(node.name, (size,), "bool")
            out.append((node.name, node.name, "len"))
            carried.add(size)
    return out


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
