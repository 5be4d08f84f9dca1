"""IR graph -> search terms (and the facts only dims can decide), and back.

Widening float casts are value identities and are dropped; decoding re-applies
the graph's precision policy (rules/lower.py), which computes in f32. So a cast to
f64 that an op computes with is kept (a sum of f32 values in f64 rounds otherwise
than in f32), as an opaque leaf, for the scheduler to refuse; one that is only an
output is dropped, re-applied to the output. A cast that rounds (to bf16, say)
is kept: as an opaque leaf, so no rule can move or delete it, except where it is
a MatMul's operand precision (every consumer a MatMul, every MatMul of the graph
in that precision), which the policy re-applies to each MatMul operand only: the
other terms are `unrounded`, the condition of a rule that moves a value out of every
MatMul (sum-of-matmul's W), which would lose such a rounding. An f32 constant is a
`const` term, by value, as rules write constants. Ops outside the rewritable
vocabulary (layout, compare, gather, ...) become opaque leaves keyed by their IR
node, so they decode to themselves.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import sympy

from cleave.ir import Graph, Node
from cleave.ir import dims as D
from cleave.ir.dtypes import DType, rounds
from cleave.ir.ops import BINARY, STEPS, UNARY, half_read, reads_half_rounded
from cleave.rules.dsl import REDUCE, Axis, Leaf, Term, const_value
from cleave.rules.instances import within
from cleave.rules.lower import LOW, Lowering

from .finite import finite_nodes, nonzero_nodes

_REDUCE_NAME = {v: k for k, v in REDUCE.items()}


@dataclass
class Encoded:
    graph: Graph
    outputs: list  # one term per graph output
    terms: dict = field(default_factory=dict)  # IR node id -> term
    lowp: object = None
    reducible: set = field(default_factory=set)  # symbols absent from every output

    def decode(self, roots: list, name: str | None = None, region: bool = False) -> tuple[Graph, Lowering]:
        """An ordinary IR graph computing `roots` (one term per output); with `region`,
        roots are values inside the program (one region of its extraction), output as
        they are."""
        src = self.graph
        g = Graph(name or src.name)
        for n in src.inputs.values():
            g.input(n.attrs["name"], n.attrs["shape"], n.attrs["dtype"])

        def leaf(key: int, operands: list) -> Node:
            n = src.nodes[key]
            if n.op == "input":
                return g.inputs[n.attrs["name"]]
            if reads_half_rounded(n.op, n.dtype):
                # A compare, a cast to an integer or bool and a floor read their half
                # operands rounded, as eager does: the policy computes them in f32, and f16
                # x * 1024 past 65504 was finite to isfinite, (g + 1) == g never held
                operands = [_read_rounded(x, o) for x, o in zip(operands, n.inputs)]
            if _is_float_cast(n):
                # A kept rounding cast rounds from its operand's precision in the input
                # graph: `x / math.sqrt(d)` takes an f64 square root of a size and rounds
                # it to f32, where the policy computes the root in f32 (the same value
                # once rounded, but the check's fp64 interpreter rounds at casts only).
                (x,) = operands
                wide = n.inputs[0].dtype
                if x.dtype != wide and x.dtype.is_float and not rounds(x.dtype, wide):
                    operands = [x.cast(wide)]
            return g.add(n.op, *operands, loc=n.loc, **n.attrs)

        low = Lowering(g, leaf=leaf, lowp=self.lowp, what=f"candidate of {src.name}")
        if region:
            g.output(*(low(t) for t in roots))
            return g, low
        outs = []
        for term, orig in zip(roots, src.outputs):
            out = low(term)
            if out.dtype != orig.dtype and out.dtype.is_float and orig.dtype.is_float:
                out = out.cast(orig.dtype)
            outs.append(out)
        g.output(*outs, names=src.output_names)
        return g, low


HALVES = (DType.f16, DType.bf16)


def _read_rounded(x: Node, original: Node) -> Node:
    """Operand x, decoded for `original`, as an op reading it rounded takes it: rounded to
    the half type `original` holds or widened from (`half_read`), in original's dtype."""
    half = half_read(original)
    if half is None or not x.dtype.is_float or x.dtype == half:
        return x
    x = x.cast(half)
    return x if original.dtype == half else x.cast(original.dtype)


def _is_float_cast(n: Node) -> bool:
    return n.op == "cast" and n.dtype.is_float and n.inputs[0].dtype.is_float


def matmul_precision(graph: Graph):
    """The low precision (f16/bf16) that every MatMul of the graph takes its operands
    in, or None when there is none or the MatMuls disagree (one takes f32)."""
    kinds = {x.dtype for n in graph.live_nodes() if n.op == "matmul" for x in n.inputs}
    return next(iter(kinds)) if len(kinds) == 1 and kinds <= set(LOW) else None


def operand_roundings(graph: Graph, source: Graph | None = None) -> set[int]:
    """Ids of the rounding casts that are only a MatMul's operand precision: rules may
    move where such an operand rounds (FlashAttention rounds P before normalising it),
    as the lowering casts every MatMul operand to that precision again. The precision
    is `source`'s, the graph a candidate was decoded from: the lowering re-applies it
    even where it leaves a MatMul mixed (an f16 X times sum-of-matmul's f32 W 1)."""
    lowp = matmul_precision(source or graph)
    if lowp is None:
        return set()
    users: dict[int, set[str]] = {}
    for n in graph.live_nodes():
        for x in n.inputs:
            users.setdefault(x.id, set()).add(n.op)
    outputs = {o.id for o in graph.outputs}
    return {n.id for n in graph.live_nodes() if _is_float_cast(n) and n.dtype == lowp
            and users.get(n.id) == {"matmul"} and n.id not in outputs}


def _widenings_to_f64_used(graph: Graph) -> set[int]:
    """Ids of the casts to f64 that some op takes as its operand: the op computes in f64,
    which the policy's f32 would round otherwise."""
    used = {x.id for n in graph.live_nodes() for x in n.inputs}
    return {n.id for n in graph.live_nodes() if _is_float_cast(n) and n.dtype == DType.f64 and n.id in used}


def encode(graph: Graph) -> Encoded:
    terms: dict[int, object] = {}
    identities = operand_roundings(graph)
    kept = _widenings_to_f64_used(graph)
    for n in graph.live_nodes():
        args = [terms[x.id] for x in n.inputs]
        terms[n.id] = args[0] if n.id in identities else _term(n, args, kept)
    out_syms = set()
    for o in graph.outputs:
        out_syms |= D.free_symbols(o.shape)
    all_syms = set(graph.symbols())
    return Encoded(graph, [terms[o.id] for o in graph.outputs], terms,
                   lowp=matmul_precision(graph), reducible=all_syms - out_syms)


def _term(n: Node, args: list, kept: set[int]):
    op, a = n.op, n.attrs
    if _is_float_cast(n) and not rounds(n.inputs[0].dtype, n.dtype) and n.id not in kept:
        return args[0]
    if op == "const" and n.dtype is DType.f32:
        return Term("const", (const_value(a["value"]),))
    # Rules are proven over the reals: integers wrap and divide by flooring, so (x*y)/c ->
    # x*(y/c) would lose int32's wraparound. Integer values stay leaves; a topk's indices
    # (an order, not arithmetic) are a term, as its values are.
    real = n.dtype.is_float
    if (op in STEPS or op == "fmod") and n.dtype in HALVES:  # opaque, so its half operand comes rounded
        return Leaf(n.id, tuple(args))
    if real and (op in UNARY or op in BINARY or op in ("where", "matmul")):  # the same op in both vocabularies
        return Term(op, tuple(args))
    if real and op == "reduce":
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
    nodes = [enc.graph.nodes[i] for i in enc.terms]
    scalars = [n for n in nodes if n.op in ("size", "const") and n.rank == 0]
    finite, nonzero = finite_nodes(enc.graph), nonzero_nodes(enc.graph)
    rounded = {enc.terms[i] for i in operand_roundings(enc.graph)}
    for n in nodes:
        t = enc.terms[n.id]
        out.append(("rank", t, n.rank))
        if t not in rounded:
            out.append(("unrounded", t))
        if n.op in BINARY or n.op == "where":  # operands that meet: which broadcasts into which
            for c, x in itertools.permutations(n.inputs, 2):
                if within(c, x):
                    out.append(("within", enc.terms[c.id], enc.terms[x.id]))
        if n.id in finite:
            out.append(("finite", t))
        if n.id in nonzero:
            out.append(("nonzero", t))
        for a in range(-n.rank, 0):
            d = n.shape[a]
            if D.is_one(d):
                out.append(("flat", t, a))
            elif not d.is_number and d.free_symbols <= enc.reducible:
                out.append(("splittable", t, a))
            for s in scalars:
                value = s.attrs["value"]
                if value is None or s.op == "const" and not float(value).is_integer():
                    continue
                # a float const's value as an integer: sympy's Float(5.0) is no Integer(5)
                if (sympy.Integer(int(value)) if isinstance(value, float) else sympy.sympify(value)) == d:
                    out.append(("extent", enc.terms[s.id], t, a))
    return out
