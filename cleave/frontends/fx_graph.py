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

from ..ir import Graph
from ..ir import dims as D
from ..ir.graph import fresh_name
from . import aten_map
from .capture import Captured, constant_node, tidied
from .errors import Unify, UnsupportedOpError, source_of
from .output_layout import eager_order
from .symbols import SymbolMap
from .translate import Translator, ir_dtype
from .unify import resolved


def translate_graph_module(gm: torch.fx.GraphModule, name: str) -> Captured:
    """The IR graph of gm. Raises UnsupportedOpError naming the first node cleave
    cannot express (the caller cuts the graph there).

    Dims an op needs equal that the IR reads as different expressions (SDPA's k and v
    lengths under automatic dynamic shapes, a symbol each; the halves of `x.chunk(2)`
    over a dynamic width; a view into blocks of T // 4) make one symbol read as an
    expression of others (cleave.frontends.unify), and the graph is translated again.
    The operator's binding checks every input dim against its reading, so inputs where
    it does not hold run eagerly (graph_breaks.Launcher). Only symbols some tensor
    input's dim binds are read so: a size passed as a number is checked by nothing."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    bound = {str(d.node.expr) for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)
             for d in n.meta["val"].shape if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol)}
    reads: dict[str, sympy.Expr] = {}  # an IR symbol's name -> the expression it is read as
    while True:
        try:
            return _translate(gm, name, placeholders, reads)
        except Unify as err:
            if err.symbol in reads or not (err.symbol in bound or any(D.symbol(err.symbol) in e.free_symbols
                                                                      for e in reads.values())):
                raise  # a symbol only a number carries: nothing would check the reading
            reads[err.symbol] = err.expr


def _hint(d: torch.SymInt) -> int | None:
    """The size torch traced a symbolic int at."""
    value = getattr(d.node, "hint", None)
    return int(value) if value is not None else None


def _symbol_hint(d: torch.SymInt, sym) -> int | None:
    """The size torch traced the symbol of a dim expression at."""
    env = d.node.shape_env
    if env is None:
        return None
    traced = env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val  # its newer name
    value = traced.get(sym)
    return int(value) if value is not None else None


def _translate(gm, name: str, placeholders, reads: dict) -> Captured:
    symbols = SymbolMap()
    carried = {d.node.expr for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)
               for d in n.meta["val"].shape if isinstance(d, torch.SymInt)}
    signed = {}  # int placeholder -> the names of its two carriers, pos and neg
    for node in placeholders:  # name torch's symbols before reading any shape
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol) \
                and val.node.expr not in carried and not _at_least_zero(val):
            names = {n for pair in signed.values() for n in pair} | {p.name for p in placeholders}
            pos = fresh_name(f"{node.name}_pos", names)
            signed[node.name] = (pos, fresh_name(f"{node.name}_neg", names | {pos}))
            symbols.signed(val.node.expr, *signed[node.name], hint=_hint(val))
            continue
        for d in (val.shape if isinstance(val, torch.Tensor) else [val]):
            if not isinstance(d, torch.SymInt):
                continue
            if isinstance(d.node.expr, sympy.Symbol) and d.node.expr not in symbols.subs:
                symbols.read_as(d.node.expr, resolved(reads, str(d.node.expr)), _hint(d))
            elif len(d.node.expr.free_symbols) == 1:  # a dim of one symbol binds it (2 * s, x.view(-1, d))
                (sym,) = d.node.expr.free_symbols
                if sym not in symbols.subs:
                    symbols.read_as(sym, resolved(reads, str(sym)), _symbol_hint(d, sym))
    _name_opaque_sizes(placeholders, symbols)
    graph = Graph(name)
    t = Translator(graph, symbols)
    constants: dict = {}
    orders: dict = {}
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
            orders = _outputs(t, graph, node)
    for fact in symbols.facts:
        graph._constrain(fact)
    size_inputs = _size_inputs(graph, placeholders, t, signed)
    return Captured(tidied(graph), constants=constants, size_inputs=size_inputs, output_orders=orders)


def _name_opaque_sizes(placeholders, symbols: SymbolMap) -> None:
    """A dim of several symbols none of the inputs binds alone (the Min(n, m - 1) of a
    diagonal an eager region made before this one) is a size of its own: a symbol of
    its own, bound from that input's extent as any other."""
    taken = {p.name for p in placeholders} | symbols.names()
    for node in placeholders:
        val = node.meta.get("val")
        for axis, d in enumerate(val.shape if isinstance(val, torch.Tensor) else ()):
            expr = d.node.expr if isinstance(d, torch.SymInt) else None
            if expr is None or expr.free_symbols <= set(symbols.subs) or symbols.knows(expr):
                continue
            ours = fresh_name(f"{node.name}_size{axis}", taken)
            taken.add(ours)
            symbols.name_expr(expr, ours, _hint(d))


def _size_inputs(graph: Graph, placeholders, t, signed: dict) -> list[tuple[str, str, str]]:
    """Declare an input [n] for each int placeholder n that the graph's ops use and no
    tensor input's dim carries, when torch knows n >= 0 (a length), and inputs [p] and
    [q] for one it does not (`signed`: read as p - q); return (graph input, placeholder,
    kind) for each, kind "len", "pos" or "neg" (Captured.size_inputs)."""
    # a dim of one symbol binds it; one of several (x.view(b * s, d)) binds none alone
    carried = {s for n in graph.inputs.values() for d in n.shape
               if len(sympy.sympify(d).free_symbols) == 1 for s in sympy.sympify(d).free_symbols}
    used = {s for n in graph.live_nodes() for d in n.shape for s in sympy.sympify(d).free_symbols}
    used |= {s for n in graph.live_nodes() for v in n.attrs.values() if isinstance(v, sympy.Expr)
             for s in v.free_symbols}
    used |= {s for c in graph.constraints for s in c.free_symbols}
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


def _outputs(t, graph, node) -> dict:
    """Declare the graph's outputs: tensors the kernels compute (the launcher makes the
    views and sizes a region returns on the host, graph_breaks.plan_outputs). Returns
    those eager lays out in another order than row-major (Captured.output_orders)."""
    raw = node.args[0]
    raw = list(raw) if isinstance(raw, (tuple, list)) else [raw]
    values = [t.value(v) for v in raw]
    for k, v in enumerate(values):
        if not hasattr(v, "graph"):
            raise UnsupportedOpError("output", source_of(node), f"output {k} is {v!r}, not a tensor")
    names = [fresh_name(f"out{k}", graph.inputs) for k in range(len(values))]
    graph.output(*values, names=names)
    orders = {name: eager_order(r.meta.get("val")) for name, r in zip(names, raw) if isinstance(r, torch.fx.Node)}
    return {name: order for name, order in orders.items() if order is not None}
