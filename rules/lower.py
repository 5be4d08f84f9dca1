"""Lowering of search terms (rules/dsl.py) to IR nodes.

The search's terms count axes from the right and use `squeeze`, `unsqueeze` and
`swap` for a split's bookkeeping; here they become positional reduce, reshape and
permute nodes of an ordinary IR graph. Both the rule instances (for the verifier)
and the search's extracted candidates go through this one function.

Precision: the search reasons in exact arithmetic (float casts are value
identities and are dropped by the encoder). With `lowp` set (the graph fed
f16/bf16 to its MatMuls) the policy is re-applied: MatMul operands are cast to
`lowp`, every other op computes in f32. A sum as a MatMul operand stays f32 (a
matrix-vector product then accumulates f32 values). Integer and bool values are
leaves of the search; where a rewrite puts one under a term's op, it is promoted to f32.
"""
from __future__ import annotations

import re

import sympy

from cleave.ir import Graph, Node, ShapeError
from cleave.ir import dims as D
from cleave.ir.dtypes import DType

from .dsl import PADS, REDUCE, Axis, Leaf, RuleError, Var

LOW = (DType.f16, DType.bf16)


def split_count(extent) -> sympy.Symbol:
    """The one symbolic split count of an axis, named after its extent (L -> s_L)."""
    name = re.sub(r"\W+", "_", D.fmt(extent)).strip("_") or "n"
    return D.symbol(f"s_{name}")


class Lowering:
    def __init__(self, graph: Graph, variables=None, axes=None, ints=None, leaf=None, lowp: DType | None = None,
                 what: str = "term"):
        self.g = graph
        self.variables = variables or {}
        self.axes = axes or {}
        self.ints = ints or {}
        self.leaf = leaf
        self.lowp = lowp
        self.what = what
        self.memo: dict = {}

    def __call__(self, term) -> Node:
        found = self.memo.get(term)
        if found is None:
            found = self.memo[term] = self._lower(term)
        return found

    def _axis(self, axis: Axis, rank: int, op: str, slot: bool = False) -> int:
        """The position of an axis counted from the right (-1 the last). A `slot` axis
        (squeeze's) names the slot right of the axis: 0 there is the last axis."""
        a = axis.value(self.axes)
        pos = rank + a - slot
        if a - slot >= 0 or pos < 0:
            raise RuleError(f"{self.what}: {op} axis {a} does not exist on an operand of rank {rank}")
        return pos

    def _f32(self, x: Node) -> Node:
        """x as an operand of a term's op, which computes in f32."""
        return x.cast("f32") if x.dtype in LOW else self._real(x)

    @staticmethod
    def _real(x: Node) -> Node:
        """A term's value is real: an integer or bool leaf under a term's op (the search
        moved `rsum` past the float mul that promoted it: `(x_u8 * 0.5).sum()` to
        `rsum(x_u8) * 0.5`) is promoted to f32, or its sum would wrap in u8 and its
        division floor."""
        return x if x.dtype.is_float else x.cast("f32")

    def _mm(self, x: Node) -> Node:
        """x as a MatMul operand: in the graph's MatMul precision, or f32 where the graph
        has none (its MatMuls take f32, maybe exact upcasts of half values the encoder
        dropped: a half MatMul would round their f32 product)."""
        if self.lowp is None:
            return self._f32(x)
        return x.cast(self.lowp) if x.dtype.is_float and x.dtype != self.lowp else x

    def _lower(self, t) -> Node:
        if isinstance(t, Var):
            return self.variables[t.name]
        if isinstance(t, Leaf):
            return self.leaf(t.key, [self(a) for a in t.args])
        op, args = t.op, t.args
        g = self.g
        try:
            if op == "const":
                return g.add("const", value=float(args[0]), dtype="f32")
            if op == "matmul":
                return g.add("matmul", *(self._real(self(a)) if _accumulated(a) else self._mm(self._real(self(a)))
                                         for a in args))
            x = self(args[0])
            if op in ("topk_values", "topk_indices"):  # an order, not arithmetic: an integer stays one
                x = x.cast("f32") if x.dtype in LOW else x
            elif op not in ("split", "squeeze", "unsqueeze", "swap", "where"):  # layout keeps the dtype; a where's mask
                x = self._f32(x)
            if op in REDUCE:
                return g.add("reduce", x, op=REDUCE[op], axis=self._axis(args[1], x.rank, op), keepdim=1)
            if op == "squeeze":  # removes axis a-1 (extent 1)
                pos = self._axis(args[1], x.rank, op, slot=True)
                if not D.is_one(x.shape[pos]):
                    raise RuleError(f"{self.what}: squeeze of axis {pos} of shape {D.fmt_shape(x.shape)}")
                if x.op == "reduce" and x.attrs["axis"] == pos and x.attrs["keepdim"]:
                    return g.add("reduce", x.inputs[0], op=x.attrs["op"], axis=pos, keepdim=0)
                return x.reshape(x.shape[:pos] + x.shape[pos + 1:])
            if op == "unsqueeze":  # inserts an extent-1 axis left of axis a, when x has axis a
                pos = x.rank + args[1].value(self.axes)
                if pos < 0:
                    return x
                return x.reshape(x.shape[:pos] + (1,) + x.shape[pos:])
            if op == "swap":
                if x.rank < 3:
                    raise RuleError(f"{self.what}: swap needs rank >= 3, got {D.fmt_shape(x.shape)}")
                return x.transpose(-2, -3)
            if op == "split":
                pos = self._axis(args[1], x.rank, op)
                return g.add("split", x, axis=pos, count=split_count(x.shape[pos]), pad=PADS[args[2]])
            if op in ("topk_values", "topk_indices"):
                k = self.ints[args[1].name] if isinstance(args[1], Var) else args[1]
                return g.add("topk", x, k=k, axis=self._axis(args[2], x.rank, op), which=op.split("_")[1])
            rest = [self._f32(self(a)) for a in args[1:]]
            return g.add(op, x, *rest)
        except ShapeError as err:  # the IR's errors name their op: the term's is added where it differs
            message = str(err) if str(err).startswith(f"{op}:") else f"{op}: {err}"
            raise RuleError(f"{self.what}: {message}") from None


def _accumulated(term) -> bool:
    """Whether a MatMul operand is a sum the search made (W 1 of `sum-of-matmul`, maybe
    split): it keeps its f32 accumulation, as rounding it to the MatMul's bf16 would
    lose what the program's own f32 sum kept."""
    while getattr(term, "op", None) in ("split", "squeeze", "unsqueeze", "swap"):
        term = term.args[0]
    return getattr(term, "op", None) == "rsum"


def condition_vars(term) -> set[str]:
    """The variables a pattern uses as a `where`'s condition: bool inputs (a mask) in
    the rule's instances and examples, where the others are f32."""
    out, stack = set(), [term]
    while stack:
        t = stack.pop()
        if hasattr(t, "op"):
            if t.op == "where" and isinstance(t.args[0], Var):
                out.add(t.args[0].name)
            stack.extend(t.args)
    return out


def lower_example(example) -> tuple[Graph, dict]:
    """An example (dsl.Example) as an IR graph: its tensors f32 inputs (bool where they
    are a `where`'s condition), its sizes scalars equal to an extent; also each of its
    subterms' node."""
    g = Graph(f"example at {example.source}")
    conds = condition_vars(example.term)
    nodes = {name: g.input(name, dims, "bool" if name in conds else "f32") for name, dims in example.tensors}
    nodes.update({name: g.add("size", value=dim, dtype="f32") for name, dim in example.sizes})
    # cleave.search.examples names the example's file, line and kind around this error
    low = Lowering(g, nodes, what=example.text)
    g.output(low(example.term), names=["out"])
    return g, dict(low.memo)
