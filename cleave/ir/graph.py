"""The IR graph: hash-consed nodes with symbolic shapes, plus collected constraints."""
from __future__ import annotations

import builtins
import hashlib
import keyword
import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import sympy

from . import dims as D
from .dims import Dim
from .dtypes import DType, dtype as to_dtype
from .errors import BindingError, DimMismatch, ShapeError
from .ops import SPECS
from .tensor_ops import TensorOps


@dataclass(frozen=True)
class Constraint:
    """A fact every binding must satisfy: kind is 'eq', 'le' or 'divides' (lhs | rhs).
    `node`: the id of the node whose check made it, which binds only while that node is
    live (a reshape built and dropped constrains nothing); None for the graph's own."""
    kind: str
    lhs: Dim
    rhs: Dim
    origin: str
    node: int | None = field(default=None, compare=False)

    @property
    def free_symbols(self) -> set[sympy.Symbol]:
        return sympy.sympify(self.lhs - self.rhs).free_symbols

    def holds(self, env: dict) -> bool:
        lhs, rhs = D.evaluate(self.lhs, env), D.evaluate(self.rhs, env)
        if self.kind == "eq":
            return lhs == rhs
        if self.kind == "le":
            return lhs <= rhs
        return lhs != 0 and rhs % lhs == 0

    def __str__(self) -> str:
        sign = {"eq": "==", "le": "<=", "divides": "|"}[self.kind]
        return f"{D.fmt(self.lhs)} {sign} {D.fmt(self.rhs)}  (from {self.origin})"


def _whole(d: Dim) -> tuple[Dim, Dim] | None:
    """(q, p) where the dim d = p/q is a size only at bindings with q | p (`reshape(2,
    'n/2')`, an input of 'L/s' rows); None where every binding makes it whole. Without
    the constraint, an odd n evaluated n/2 down and dropped an element."""
    if not isinstance(d, sympy.Expr) or d.is_integer:
        return None
    p, q = sympy.fraction(sympy.together(d))
    return None if q == 1 else (q, p)


def fresh_name(name: str, taken) -> str:
    """name, or name_1, name_2...: the first not in `taken`."""
    k, out = 0, name
    while out in taken:
        k += 1
        out = f"{name}_{k}"
    return out


def _check_name(kind: str, name: str) -> None:
    """Inputs and outputs name the kernels' buffer arguments: Python identifiers."""
    if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
        raise ShapeError(f"{kind} name {name!r} is not a Python identifier (letters, digits and _, "
                         f"not starting with a digit, not a keyword)")


# Names the generated Triton modules use (scheduler/codegen.py, partition.py, tma.py):
# a symbol is a kernel parameter, so one of these would shadow or clash with it.
KERNEL_NAMES = frozenset({
    "tl", "triton", "os", "DOT_BF16", "INTERPRETED", "TMA", "AXIS", "to_bf16", "mul", "max_nan", "min_nan",
    "reduce_max", "reduce_min", "first_at_least", "negative", "pow_f32", "atan2_f32", "hypot_f32", "erfinv_f32", "erfc_f32",
    "pid", "tile", "pmn", "first", "rows", "arrived", "arrivals", "out"})
# kernel locals and buffers (v3, tid0, idx1, acc0, start2, t4, out0), pointer and
# descriptor parameters (x_ptr), and the split factors the search adds (s_n)
KERNEL_NAME_PATTERN = re.compile(r"(v|t|tid|idx|acc|start|out)\d+|.*_(ptr|desc)|s_.*")


def kernel_name_clash(symbol: str) -> str | None:
    """Why a symbol (an identifier) cannot name a kernel parameter, or None: the
    generated kernels would not parse (`if`), or would read another value (`pid`)."""
    return ("a Python keyword" if keyword.iskeyword(symbol)
            else "a Python builtin" if hasattr(builtins, symbol)
            else "a name the generated kernels use" if symbol in KERNEL_NAMES or KERNEL_NAME_PATTERN.fullmatch(symbol)
            else None)


class Node(TensorOps):
    """One operation; nodes of a graph are unique by (op, operands, attributes)."""

    __slots__ = ("graph", "id", "op", "inputs", "attrs", "shape", "dtype", "loc")

    def __init__(self, graph, id, op, inputs, attrs, shape, dtype, loc):
        self.graph = graph
        self.id = id
        self.op = op
        self.inputs: tuple[Node, ...] = inputs
        self.attrs: dict = attrs
        self.shape: tuple[Dim, ...] = shape
        self.dtype: DType = dtype
        self.loc: str | None = loc

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"<%{self.id} {self.op} {D.fmt_shape(self.shape)} {self.dtype}>"

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other):  # elementwise equality is spelled .eq(); nodes compare by identity
        return self is other


def _normalize(kind: str, value):
    if kind == "shape":
        return D.shape(value)
    if kind == "dim":
        return D.dim(value)
    if kind == "ints":
        return tuple(int(v) for v in value)
    if kind == "int":
        return int(value)
    if kind == "float":
        if value is None:
            return None
        if isinstance(value, bool):
            return float(value)
        return value if isinstance(value, int) else float(value)
    if kind == "dtype":
        return to_dtype(value)
    return str(value)


class Graph:
    """A tensor program with symbolic dimensions.

    Build it through `input`, the ops on the returned nodes (`q @ k.T`, `x.exp()`,
    `x.sum(-1)`) and `output`. Equal subexpressions are shared (hash-consing).
    """

    def __init__(self, name: str = "graph"):
        self.name = name
        self.nodes: list[Node] = []
        self.inputs: dict[str, Node] = {}
        self.outputs: list[Node] = []
        self.output_names: list[str] = []
        self.constraints: list[Constraint] = []
        self._interned: dict[tuple, Node] = {}

    # -- building ---------------------------------------------------------
    def add(self, op: str, /, *inputs: Node, loc: str | None = None, **attrs) -> Node:
        spec = SPECS.get(op)
        if spec is None:
            raise ShapeError(f"unknown op {op!r}")
        if spec.arity is not None and len(inputs) != spec.arity:
            raise ShapeError(f"{op}: takes {spec.arity} operands, got {len(inputs)}")
        if spec.arity is None and not inputs:
            raise ShapeError(f"{op}: needs at least one operand")
        for k, x in enumerate(inputs):
            if not isinstance(x, Node) or x.graph is not self:
                raise ShapeError(f"{op}: operand {k} is not a node of graph {self.name!r}")
        names = {name for name, _ in spec.attrs}
        unknown = set(attrs) - names
        if unknown:
            raise ShapeError(f"{op}: unknown attribute(s) {', '.join(sorted(unknown))}")
        missing = [n for n in names if n not in attrs]
        if missing:
            raise ShapeError(f"{op}: missing attribute(s) {', '.join(missing)}")
        norm = {}
        for name, kind in spec.attrs:
            try:
                norm[name] = _normalize(kind, attrs[name])
            except (ValueError, TypeError) as err:  # a bare "a dimension cannot be negative (-1)"
                where = f" (at {loc})" if loc else ""
                message = f"{op}: attribute {name}={attrs[name]!r}: {err}{where}"
                raise (ShapeError(message) if isinstance(err, ValueError) else TypeError(message)) from None
        key = (op, tuple(x.id for x in inputs), tuple((k, _key(v)) for k, v in norm.items()))
        found = self._interned.get(key)
        if found is not None:
            return found
        try:
            result = spec.infer(*inputs, **norm)
        except ShapeError as err:
            if loc and isinstance(err, DimMismatch):
                raise DimMismatch(f"{err} (at {loc})", err.dims) from None
            if loc:
                raise ShapeError(f"{err} (at {loc})") from None
            raise
        for kind, lhs, rhs, origin in result.constraints:
            self._constrain(Constraint(kind, lhs, rhs, f"{origin} %{len(self.nodes)}", len(self.nodes)))
        for d in result.shape:
            whole = _whole(d)
            if whole is not None:
                of = f"input {norm['name']!r}" if op == "input" else f"{op} %{len(self.nodes)}"
                self._constrain(Constraint("divides", *whole, f"{of}'s dim {D.fmt(d)}",
                                           None if op == "input" else len(self.nodes)))
        node = Node(self, len(self.nodes), op, tuple(inputs), norm, result.shape, result.dtype, loc)
        self.nodes.append(node)
        self._interned[key] = node
        return node

    def input(self, name: str, shape: Sequence, dtype="f32") -> Node:
        _check_name("input", name)
        if name in self.inputs:
            raise ShapeError(f"input {name!r} is declared twice")
        node = self.add("input", name=name, shape=_input_shape(name, shape), dtype=dtype)
        self.inputs[name] = node
        for i, d in enumerate(node.shape):  # `s - 100`: a binding must keep it a size
            if d.is_nonnegative is not True:
                self._constrain(Constraint("le", D.dim(0), d, f"input {name!r} dim {i}"))
        return node

    def const(self, value, dtype="f32") -> Node:
        return self.add("const", value=value, dtype=dtype)

    def iota(self, shape: Sequence, axis: int, dtype="i64") -> Node:
        return self.add("iota", shape=shape, axis=axis, dtype=dtype)

    def output(self, *nodes: Node, names: Sequence[str] | None = None) -> "Graph":
        names = list(names) if names else [fresh_name(f"out{len(self.outputs) + i}", self.inputs)
                                            for i in range(len(nodes))]
        if len(names) != len(nodes):
            raise ShapeError(f"output: {len(nodes)} node(s) but {len(names)} name(s) ({', '.join(map(str, names))})")
        before = len(self.outputs)
        try:
            for node, name in zip(nodes, names):
                _check_name("output", name)
                if name in self.output_names:
                    raise ShapeError(f"output {name!r} is declared twice")
                if name in self.inputs:  # one kernel argument, one buffer, for both
                    raise ShapeError(f"output {name!r} has the name of an input")
                if not isinstance(node, Node):
                    raise ShapeError(f"output {name!r} is {node!r:.40} ({type(node).__name__}), not a node of "
                                     f"graph {self.name!r}")
                if node.graph is not self:
                    raise ShapeError(f"output {name!r} is not a node of graph {self.name!r}")
                self.outputs.append(node)
                self.output_names.append(name)
            self._check_buffer_names()
        except ShapeError:  # the graph stays as it was
            del self.outputs[before:], self.output_names[before:]
            raise
        return self

    def _check_buffer_names(self) -> None:
        """The launcher passes each kernel argument by name, a buffer's (an input the
        outputs read, an output) and a symbol's alike: one name for both would pass the
        symbol's value as the buffer. An input no output reads (a size carrier of the
        torch.compile backend, [n] named n) is no kernel argument."""
        symbols = {s.name for s in self.symbols()}
        read = [n.attrs["name"] for n in self.live_nodes() if n.op == "input"]
        for kind, name in [("input", n) for n in read] + [("output", n) for n in self.output_names]:
            if name in symbols:
                raise ShapeError(f"{kind} {name!r} has the name of a dim symbol of the graph (the kernels name "
                                 f"buffers and symbols alike); rename one of them")

    def _constrain(self, c: Constraint) -> None:
        if all(c.kind != o.kind or c.lhs != o.lhs or c.rhs != o.rhs for o in self.constraints):
            self.constraints.append(c)

    # -- reading ----------------------------------------------------------
    def live_nodes(self) -> list[Node]:
        """Nodes the outputs depend on, in a canonical topological order: depth-first
        post-order from the outputs, operands left to right. The order depends on the
        structure alone, never on the order nodes were built, so equal graphs print,
        hash and renumber identically."""
        order: list[Node] = []
        done: set[int] = set()
        for root in self.outputs:
            stack = [(root, False)]
            while stack:
                node, expanded = stack.pop()
                if node.id in done:
                    continue
                if expanded:
                    done.add(node.id)
                    order.append(node)
                    continue
                stack.append((node, True))
                stack.extend((x, False) for x in reversed(node.inputs) if x.id not in done)
        return order

    def users(self) -> dict[int, list[Node]]:
        out: dict[int, list[Node]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for x in n.inputs:
                out[x.id].append(n)
        return out

    def symbols(self) -> list[sympy.Symbol]:
        syms = set()
        for n in self.live_nodes():
            syms |= D.free_symbols(n.shape)
            for v in n.attrs.values():
                if isinstance(v, sympy.Expr):
                    syms |= v.free_symbols
        return sorted(syms, key=lambda s: s.name)

    def split_counts(self) -> set[sympy.Symbol]:
        """The symbols that split counts are made of."""
        return {s for n in self.live_nodes() if n.op == "split" for s in n.attrs["count"].free_symbols}

    def reduced_symbols(self) -> set[sympy.Symbol]:
        """The symbols of the extents a reduce runs over (softmax's keys, a norm's row)."""
        return {s for n in self.live_nodes() if n.op == "reduce"
                for s in n.inputs[0].shape[n.attrs["axis"]].free_symbols}

    def summed_symbols(self) -> set[sympy.Symbol]:
        """reduced_symbols and those of the extents a MatMul contracts."""
        return self.reduced_symbols() | {s for n in self.live_nodes() if n.op == "matmul"
                                         for s in n.inputs[0].shape[-1].free_symbols}

    def nonempty_symbols(self) -> set[sympy.Symbol]:
        """summed_symbols and those of the sizes the graph reads as values (`y /
        x.shape[0]`): the symbols rewrites take as non-zero (search/finite.py), so that
        a rewritten candidate serves where each is at least 1 and the graph as written
        where one is 0."""
        return self.summed_symbols() | {s for n in self.live_nodes() if n.op == "size"
                                        for s in sympy.sympify(n.attrs["value"]).free_symbols}

    def text(self) -> str:
        from .text import print_graph

        return print_graph(self)

    def __str__(self) -> str:
        return self.text()

    def key(self) -> str:
        """Structural hash: equal graphs (same ops, attributes, wiring, input names) hash equal."""
        from .text import print_graph

        return hashlib.sha256(print_graph(self, name=False).encode()).hexdigest()

    # -- binding ----------------------------------------------------------
    def bind(self, shapes: dict[str, Sequence[int]], extra: dict | None = None) -> dict[str, int]:
        """Values of the symbols from concrete input shapes; checks every constraint."""
        env: dict[str, int] = dict(extra or {})
        pending: list[tuple[str, int, Dim, int]] = []
        for name, node in self.inputs.items():
            if name not in shapes:
                raise BindingError(f"input {name!r} is missing (the graph takes {', '.join(self.inputs)})")
            actual = tuple(shapes[name])
            if len(actual) != node.rank:
                raise BindingError(f"input {name!r}: expected rank {node.rank} {D.fmt_shape(node.shape)}, "
                                   f"got shape {list(actual)}")
            for i, (d, v) in enumerate(zip(node.shape, actual)):
                if isinstance(d, sympy.Symbol):
                    if env.setdefault(d.name, v) != v:
                        raise BindingError(f"input {name!r} dim {i}: {d.name} is {env[d.name]} elsewhere, "
                                           f"but {v} here")
                else:
                    pending.append((name, i, d, v))
        for _ in range(2):  # expressions such as b*h may bind a symbol once others are known
            still = []
            for name, i, d, v in pending:
                free = [s for s in d.free_symbols if s.name not in env]
                if not free:
                    if D.evaluate(d, env) != v:
                        expected = D.fmt(d) if d.is_number else f"{D.fmt(d)} = {D.evaluate(d, env)}"
                        raise BindingError(f"input {name!r} dim {i}: expected {expected}, got {v}")
                elif len(free) == 1:
                    subs = {D.symbol(k): val for k, val in env.items()}
                    try:
                        sol = sympy.solve(sympy.Eq(d.subs(subs), v), free[0])
                    except NotImplementedError:  # sympy solves no floor or Mod (a strided conv's length)
                        sol = _floor_solution(d.subs(subs), free[0], v,
                                              [(e.subs(subs), w) for _, _, e, w in pending
                                               if e.free_symbols - set(map(D.symbol, env)) == {free[0]}])
                        if sol is None:
                            raise BindingError(f"input {name!r} dim {i}: cannot solve {D.fmt(d)} = {v} "
                                               f"for {free[0]}") from None
                    sol = [s for s in sol if s.is_integer and s > 0]
                    if not sol:
                        raise BindingError(f"input {name!r} dim {i}: no positive integer {free[0]} "
                                           f"makes {D.fmt(d)} = {v}")
                    env[free[0].name] = int(sol[0])
                else:
                    still.append((name, i, d, v))
            pending = still
        if pending:
            name, i, d, _ = pending[0]
            raise BindingError(f"input {name!r} dim {i}: cannot solve {D.fmt(d)} for its symbols")
        self.check(env)
        return env

    def live_constraints(self, live: set[int] | None = None) -> list[Constraint]:
        """The constraints of the graph and of its live nodes (`live`: their ids)."""
        if live is None:
            live = {n.id for n in self.live_nodes()}
        return [c for c in self.constraints if c.node is None or c.node in live]

    def check(self, env: dict) -> None:
        for c in self.live_constraints():
            try:
                ok = c.holds(env)
            except KeyError:
                continue  # a constraint on symbols this binding leaves open (e.g. a split count)
            if not ok:
                values = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
                raise BindingError(f"constraint {c} fails for {values}")

    def concrete_shape(self, node: Node, env: dict) -> tuple[int, ...]:
        return tuple(D.evaluate(d, env) for d in node.shape)


def _floor_solution(d, sym, v: int, others: list) -> list | None:
    """The least positive integer making d = v, d nondecreasing in sym (a strided conv's
    floor((s - 1) / 4) + 1), that also satisfies every other (expression, value) pair
    over sym alone: any value of the run that gives v serves, as the graph reads sym
    only through such dims. None where no value does."""
    def at(x: int) -> int:
        return int(d.subs(sym, x))

    hi = 1
    while at(hi) < v:
        if hi > 1 << 40:
            return None
        hi *= 2
    lo = 1
    while lo < hi:  # the least x with d(x) >= v
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if at(mid) < v else (lo, mid)
    x = lo
    while at(x) == v:
        if all(int(e.subs(sym, x)) == w for e, w in others):
            return [sympy.Integer(x)]
        x += 1
    return None


def _input_shape(name: str, shape) -> tuple[Dim, ...]:
    """An input's dims, each readable and each symbol free to be a kernel parameter."""
    if isinstance(shape, str) or not isinstance(shape, Iterable):
        raise ShapeError(f"input {name!r}: shape must be a sequence of dims, not {shape!r}")
    dims = []
    for i, d in enumerate(shape):
        try:
            dims.append(D.dim(d))
        except (ValueError, TypeError) as err:  # ShapeError is a ValueError
            raise ShapeError(f"input {name!r} dim {i}: {err}") from None
        if dims[-1].is_negative:
            raise ShapeError(f"input {name!r} dim {i}: {D.fmt(dims[-1])} is negative at every binding")
        for s in sorted(dims[-1].free_symbols, key=str):
            why = kernel_name_clash(s.name)
            if why:
                raise ShapeError(f"input {name!r} dim {i}: symbol {s.name!r} is {why} (each symbol is a "
                                 f"kernel parameter); rename it")
    return tuple(dims)


def _key(value):
    if isinstance(value, tuple):
        return tuple(_key(v) for v in value)
    if isinstance(value, sympy.Expr):
        return ("dim", sympy.srepr(value))
    if isinstance(value, float):
        return ("f", repr(value))
    return value


def rewritten(graph: Graph, replace) -> Graph:
    """A copy of the graph's inputs and live nodes in which `replace(node, out, operands)`
    may stand for a node: it returns the node of `out` (given the node's operands there)
    to use in its place, or None to copy it. The constraints are the caller's to carry."""
    out = Graph(graph.name)
    mapping: dict[int, Node] = {}
    for n in graph.inputs.values():
        mapping[n.id] = out.input(n.attrs["name"], n.attrs["shape"], n.attrs["dtype"])
    for n in graph.live_nodes():
        if n.op == "input":
            continue
        args = [mapping[x.id] for x in n.inputs]
        node = replace(n, out, args)
        mapping[n.id] = node if node is not None else out.add(n.op, *args, loc=n.loc, **n.attrs)
    out.output(*(mapping[o.id] for o in graph.outputs), names=graph.output_names)
    return out


def rebuild(graph: Graph, nodes: Iterable[Node] | None = None) -> Graph:
    """A copy holding only the live nodes, renumbered in topological order."""
    out = Graph(graph.name)
    mapping: dict[int, Node] = {}
    for n in graph.inputs.values():  # every declared input stays: it is the signature
        mapping[n.id] = out.input(n.attrs["name"], n.attrs["shape"], n.attrs["dtype"])
    for n in (nodes if nodes is not None else graph.live_nodes()):
        if n.op != "input":
            mapping[n.id] = out.add(n.op, *(mapping[x.id] for x in n.inputs), loc=n.loc, **n.attrs)
    out.output(*(mapping[o.id] for o in graph.outputs), names=graph.output_names)
    # the original's constraints first: those the nodes' checks added again keep their
    # origins (`slice %6`, not the new ids), and the text form stays the same
    built, out.constraints = out.constraints, []
    kept = [replace(c, node=None if c.node is None else mapping[c.node].id) for c in graph.live_constraints()
            if c.node is None or c.node in mapping]
    for c in [*kept, *built]:
        out._constrain(c)
    return out
