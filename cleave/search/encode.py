"""IR graph -> search terms (and the facts only dims can decide), and back.

Float-to-float casts are value identities and are dropped; decoding re-applies
the graph's precision policy (rules/lower.py). Ops outside the rewritable
vocabulary (layout, compare, gather, ...) become opaque leaves keyed by their
IR node, so they decode to themselves.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from cleave.ir import Graph, Node
from cleave.ir import dims as D
from cleave.ir.ops import BINARY, UNARY
from cleave.rules.dsl import REDUCE, Axis, Leaf, Term
from cleave.rules.lower import LOW, Lowering

_REDUCE_NAME = {v: k for k, v in REDUCE.items()}


@dataclass
class Encoded:
    graph: Graph
    outputs: list  # one term per graph output
    terms: dict = field(default_factory=dict)  # IR node id -> term
    lowp: object = None
    reducible: set = field(default_factory=set)  # symbols absent from every output

    def decode(self, roots: list, name: str | None = None) -> tuple[Graph, Lowering]:
        """An ordinary IR graph computing `roots` (one term per output)."""
        src = self.graph
        g = Graph(name or src.name)
        for n in src.inputs.values():
            g.input(n.attrs["name"], n.attrs["shape"], n.attrs["dtype"])

        def leaf(key: int, operands: list) -> Node:
            n = src.nodes[key]
            if n.op == "input":
                return g.inputs[n.attrs["name"]]
            return g.add(n.op, *operands, loc=n.loc, **n.attrs)

        low = Lowering(g, leaf=leaf, lowp=self.lowp, what=f"candidate of {src.name}")
        outs = []
        for term, orig in zip(roots, src.outputs):
            out = low(term)
            if out.dtype != orig.dtype and out.dtype.is_float and orig.dtype.is_float:
                out = out.cast(orig.dtype)
            outs.append(out)
        g.output(*outs, names=src.output_names)
        return g, low


def _is_float_cast(n: Node) -> bool:
    return n.op == "cast" and n.dtype.is_float and n.inputs[0].dtype.is_float


def encode(graph: Graph) -> Encoded:
    terms: dict[int, object] = {}
    for n in graph.live_nodes():
        terms[n.id] = _term(n, [terms[x.id] for x in n.inputs])
    low = {x.dtype for n in graph.live_nodes() if n.op == "matmul" for x in n.inputs if x.dtype in LOW}
    out_syms = set()
    for o in graph.outputs:
        out_syms |= D.free_symbols(o.shape)
    all_syms = set(graph.symbols())
    return Encoded(graph, [terms[o.id] for o in graph.outputs], terms,
                   lowp=min(low, key=str) if low else None, reducible=all_syms - out_syms)


def _term(n: Node, args: list):
    op, a = n.op, n.attrs
    if _is_float_cast(n):
        return args[0]
    if op in UNARY:
        return Term(op, tuple(args))
    if op in BINARY or op == "where" or op == "matmul":
        return Term(op, tuple(args))
    if op == "reduce":
        rank = n.inputs[0].rank
        t = Term(_REDUCE_NAME[a["op"]], (args[0], Axis(None, a["axis"] - rank)))
        return t if a["keepdim"] else Term("squeeze", (t, Axis(None, a["axis"] - rank + 1)))
    if op == "topk":
        return Term("topk_" + a["which"], (args[0], a["k"], Axis(None, a["axis"] - n.inputs[0].rank)))
    if len(args) > 3:
        raise ValueError(f"{op} %{n.id}: the search encodes at most 3 operands of an opaque op, got {len(args)}")
    return Leaf(n.id, tuple(args))


def seeds(enc: Encoded) -> list[tuple]:
    """Facts about the input graph's terms: (kind, term(s)..., axis) tuples."""
    out = []
    scalars = [n for n in enc.graph.live_nodes() if n.op in ("size", "const") and n.rank == 0]
    for n in enc.graph.live_nodes():
        t = enc.terms[n.id]
        out.append(("rank", t, n.rank))
        for a in range(-n.rank, 0):
            d = n.shape[a]
            if D.is_one(d):
                out.append(("flat", t, a))
            elif not d.is_number and d.free_symbols <= enc.reducible:
                out.append(("splittable", t, a))
            for s in scalars:
                value = s.attrs["value"]
                if s.op == "const" and not float(value).is_integer():
                    continue
                if value is not None and sympy.sympify(value) == d:
                    out.append(("extent", enc.terms[s.id], t, a))
    return out
