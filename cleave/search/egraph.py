"""The egglog vocabulary of the search and the compilation of DSL rules to it.

Tensor terms are one sort, `Tn`. Dims never enter egglog: each term carries only
its rank and the axes (counted from the right) along which it is constant
(`flat`), computed by the analysis ruleset below; the encoder seeds them for the
input graph, and `splittable`/`extent` facts, which only the encoder can decide
(they need the dims), exist for the input graph's terms only, as do `finite` ones
(search/finite.py: no infinity can reach the term), `within` ones (two operands of
an elementwise op, the one broadcasting into the other without widening it) and
`unrounded` ones (no MatMul rounds the term to its operand precision: encode.py).
"""
from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass

from egglog import (EGraph, Expr, String, StringLike, eq, function, i64, i64Like, relation, rewrite, rule, ruleset,
                    set_, var)

from cleave.ir.ops import BINARY, UNARY
from cleave.rules.dsl import GRAPH_CONDITIONS, OPS, REDUCE, Axis, Leaf, Rule, RuleError, Term, Var

MAX_RANK = 8


class Tn(Expr):
    """A tensor term."""


@function
def LeafT(key: i64Like) -> Tn: ...


@function
def Op1(key: i64Like, x: Tn) -> Tn: ...


@function
def Op2(key: i64Like, x: Tn, y: Tn) -> Tn: ...


@function
def Op3(key: i64Like, x: Tn, y: Tn, z: Tn) -> Tn: ...


@function
def Const(value: StringLike) -> Tn: ...


@function
def Un(op: StringLike, x: Tn) -> Tn: ...


@function
def Bin(op: StringLike, x: Tn, y: Tn) -> Tn: ...


@function
def Where(c: Tn, x: Tn, y: Tn) -> Tn: ...


@function
def MatMul(x: Tn, y: Tn) -> Tn: ...


@function
def Red(op: StringLike, a: i64Like, x: Tn) -> Tn: ...


@function
def Split(a: i64Like, pad: StringLike, x: Tn) -> Tn: ...


@function
def Sq(a: i64Like, x: Tn) -> Tn: ...


@function
def Unsq(a: i64Like, x: Tn) -> Tn: ...


@function
def Swap(x: Tn) -> Tn: ...


@function
def TopK(which: StringLike, k: i64Like, a: i64Like, x: Tn) -> Tn: ...


@function(merge=lambda old, new: old)
def rank(t: Tn) -> i64: ...


flat = relation("flat", Tn, i64)
splittable = relation("splittable", Tn, i64)
extent = relation("extent", Tn, Tn, i64)
finite = relation("finite", Tn)
nonzero = relation("nonzero", Tn)
within = relation("within", Tn, Tn)
unrounded = relation("unrounded", Tn)
TERM_FACTS = {"finite": finite, "nonzero": nonzero, "within": within, "unrounded": unrounded}  # no axis
AxisId = relation("AxisId", i64)

LEAVES = ("LeafT", "Op1", "Op2", "Op3")  # by operand count
CONSTRUCTORS = {str(f): f for f in (LeafT, Op1, Op2, Op3, Const, Un, Bin, Where, MatMul, Red, Split, Sq, Unsq, Swap,
                                    TopK)}


# -- terms <-> egglog ---------------------------------------------------------

@dataclass(frozen=True)
class Encoding:
    """How a DSL op is an e-node: its constructor, and the constructor's arguments in
    order, each the index of a term argument (of the kind OPS gives it) or OP: the op's
    name past `prefix`, where several ops share the constructor."""
    constructor: str
    slots: tuple
    prefix: str = ""


OP = "op"
ENCODINGS = {
    **{op: Encoding("Un", (OP, 0)) for op in UNARY},
    **{op: Encoding("Bin", (OP, 0, 1)) for op in BINARY},
    **{op: Encoding("Red", (OP, 1, 0), prefix="r") for op in REDUCE},
    "where": Encoding("Where", (0, 1, 2)),
    "matmul": Encoding("MatMul", (0, 1)),
    "split": Encoding("Split", (1, 2, 0)),
    "squeeze": Encoding("Sq", (1, 0)),
    "unsqueeze": Encoding("Unsq", (1, 0)),
    "swap": Encoding("Swap", (0,)),
    **{op: Encoding("TopK", (OP, 1, 2, 0), prefix="topk_") for op in ("topk_values", "topk_indices")},
    "const": Encoding("Const", (0,)),
}
if set(ENCODINGS) != set(OPS):
    raise RuleError(f"search/egraph.py: ENCODINGS and rules/dsl.OPS differ in {sorted(set(OPS) ^ set(ENCODINGS))}")
_DECODINGS = {e.constructor: (op, e) for op, e in ENCODINGS.items()}  # the op, where only one has it


def enode_of(t, tensor, axis, value=lambda v: v):
    """A term's e-node as (constructor name, arguments): `tensor`, `axis` and `value`
    map its tensor, axis and other (int, pad) arguments."""
    if isinstance(t, Leaf):
        return LEAVES[len(t.args)], [t.key, *(tensor(a) for a in t.args)]
    enc, kinds = ENCODINGS[t.op], OPS[t.op]
    args = []
    for slot in enc.slots:
        if slot == OP:
            args.append(t.op[len(enc.prefix):])
        else:
            kind, arg = kinds[slot], t.args[slot]
            args.append(tensor(arg) if kind == "t" else axis(arg) if kind == "a" else value(arg))
    return enc.constructor, args


def to_egg(t, tvars=None, avars=None, shared=None):
    """A rules/dsl term (concrete, or a pattern with variables) as an egglog expression.
    `shared` (concrete terms): a function naming each subterm once, bottom-up (egglog's
    `let`), with its memo: a term is a DAG, and a deep one written out as a tree (a
    transformer layer) took tens of seconds to build and register."""
    def axis(a: Axis):
        if a.var is None:
            return i64(a.offset)
        v = avars.setdefault(a.var, var(a.var, i64))
        return v + a.offset if a.offset else v

    def value(v):  # a top-k count may be a pattern variable
        return avars.setdefault(v.name, var(v.name, i64)) if isinstance(v, Var) else v

    def go(t):
        if shared is not None:
            memo, name = shared
            found = memo.get(id(t))
            if found is None:
                found = memo[id(t)] = (name(build(t)), t)  # the term is kept: its id stays its own
            return found[0]
        return build(t)

    def build(t):
        if isinstance(t, Var):
            return tvars.setdefault(t.name, var(t.name, Tn))
        constructor, args = enode_of(t, go, axis, value)
        return CONSTRUCTORS[constructor](*args)

    tvars = {} if tvars is None else tvars
    avars = {} if avars is None else avars
    try:
        return go(t)
    finally:
        # go and build hold each other, and go the e-graph (shared's namer): left to the
        # garbage collector, the e-graph was freed on whichever thread collected, and
        # egglog refuses that ("EGraph is unsendable"), leaking it
        del go, build


def from_node(constructor: str, args: list):
    """A term from an extracted e-node: its constructor's name and its children
    (terms for tensors, Python values for primitives)."""
    if constructor in LEAVES:
        return Leaf(args[0], tuple(args[1:]))
    if constructor not in _DECODINGS:
        raise RuleError(f"unknown e-node {constructor!r}")
    op, enc = _DECODINGS[constructor]
    term_args = {}
    for slot, arg in zip(enc.slots, args):
        if slot == OP:
            op = enc.prefix + arg
        else:
            term_args[slot] = arg
    kinds = OPS[op]
    return Term(op, tuple(Axis(None, term_args[i]) if kinds[i] == "a" else term_args[i] for i in range(len(kinds))))


def compile_rule(r: Rule):
    """One DSL rule as an egglog rewrite (conditions become facts in the query)."""
    tvars: dict = {}
    avars: dict = {}
    lhs = to_egg(r.lhs, tvars, avars)
    rhs = to_egg(r.rhs, tvars, avars)
    facts = []
    for c in r.conditions:
        if c.kind == "nonempty" or c.kind in GRAPH_CONDITIONS:  # a binding's constraint; the search's choice
            continue
        ts = [to_egg(a, tvars, avars) for a in c.args if isinstance(a, Var)]
        if c.kind in TERM_FACTS:
            facts.append(TERM_FACTS[c.kind](*ts))
            continue
        a = c.args[-1]
        av = i64(a.offset) if a.var is None else (avars[a.var] + a.offset if a.offset else avars[a.var])
        facts.append({"flat": flat, "splittable": splittable, "extent": extent}[c.kind](*ts, av))
    return rewrite(lhs).to(rhs, *facts)


# -- the analysis: rank and constant axes of every term ------------------------

def analysis_ruleset():
    t, x, y, z = (var(n, Tn) for n in "txyz")
    a, b, r, rx, ry, rz, k = (var(n, i64) for n in ("a", "b", "r", "rx", "ry", "rz", "k"))
    op = var("op", String)
    rules = []

    def eq_(a_, b_):
        return eq(a_).to(b_)

    def rank_rule(pattern, facts, value):
        rules.append(rule(eq_(t, pattern), *facts).then(set_(rank(t)).to(value)))

    rx_f = eq(rx).to(rank(x))
    ry_f = eq(ry).to(rank(y))
    rz_f = eq(rz).to(rank(z))
    rank_rule(Const(op), [], i64(0))
    rank_rule(Un(op, x), [rx_f], rx)
    rank_rule(Bin(op, x, y), [rx_f, ry_f], rx.max(ry))
    rank_rule(Where(x, y, z), [rx_f, ry_f, rz_f], rx.max(ry).max(rz))
    rank_rule(MatMul(x, y), [rx_f, ry_f], rx.max(ry))
    rank_rule(Red(op, a, x), [rx_f], rx)
    rank_rule(Split(a, op, x), [rx_f], rx + 1)
    rank_rule(Sq(a, x), [rx_f], rx - 1)
    rank_rule(Unsq(a, x), [rx_f, rx + a >= 0], rx + 1)
    rank_rule(Unsq(a, x), [rx_f, rx + a < 0], rx)
    rank_rule(Swap(x), [rx_f], rx)
    rank_rule(TopK(op, k, a, x), [rx_f], rx)

    def flat_rule(pattern, facts, axis):
        rules.append(rule(eq_(t, pattern), *facts).then(flat(t, axis)))

    flat_rule(Un(op, x), [flat(x, b)], b)
    flat_rule(Bin(op, x, y), [flat(x, b), flat(y, b)], b)
    flat_rule(Where(x, y, z), [flat(x, b), flat(y, b), flat(z, b)], b)
    flat_rule(Red(op, a, x), [], a)
    flat_rule(Red(op, a, x), [flat(x, b)], b)
    flat_rule(MatMul(x, y), [flat(y, -1)], i64(-1))
    flat_rule(MatMul(x, y), [flat(x, -2)], i64(-2))
    flat_rule(MatMul(x, y), [flat(x, b), flat(y, b), b <= -3], b)
    flat_rule(Split(a, op, x), [flat(x, b), b > a], b)
    flat_rule(Split(a, op, x), [flat(x, b), b < a], b - 1)
    flat_rule(Sq(a, x), [flat(x, b), b >= a], b)
    flat_rule(Sq(a, x), [flat(x, b), b < a - 1], b + 1)
    flat_rule(Unsq(a, x), [flat(x, b), b >= a], b)
    flat_rule(Unsq(a, x), [flat(x, b), b < a], b - 1)
    flat_rule(Unsq(a, x), [], a - 1)
    flat_rule(Swap(x), [flat(x, -2)], i64(-3))
    flat_rule(Swap(x), [flat(x, -3)], i64(-2))
    flat_rule(Swap(x), [flat(x, -1)], i64(-1))
    flat_rule(Swap(x), [flat(x, b), b <= -4], b)
    flat_rule(TopK(op, k, a, x), [flat(x, b), b < a], b)
    flat_rule(TopK(op, k, a, x), [flat(x, b), b > a], b)
    # An axis the term does not have is one it is constant along (broadcasting).
    rules.append(rule(AxisId(b), eq(r).to(rank(t)), r + b < 0).then(flat(t, b)))
    rules += _within_rules(t, x, y, z, a, k, op)
    rules += _nonzero_rules(t, x, a)
    return ruleset(*rules, name="analysis")


def _nonzero_rules(t, x, a) -> list:
    """`nonzero` beyond the encoder's seeds (cleave/search/finite.py), for terms the
    rewrites make: a softmax's denominator, sum_a exp(x - max_a x), lies in [1, n]
    wherever x is finite (the max term is exp(0)), as softmax-shift builds it. x is
    not required finite here: a row a mask fills with -inf throughout gives NaN, which
    the moved division keeps NaN, as eager's is (attention's masks reach every such
    denominator). A view of a non-zero value is one."""
    rules = [rule(eq(t).to(Red("sum", a, Un("exp", Bin("sub", x, Red("max", a, x)))))).then(nonzero(t))]
    for view in (Sq(a, x), Unsq(a, x)):
        rules.append(rule(eq(t).to(view), nonzero(x)).then(nonzero(t)))
    rules.append(rule(eq(t).to(Swap(x)), nonzero(x)).then(nonzero(t)))
    return rules


def _within_rules(t, x, y, z, a, k, op) -> list:
    """`within` beyond the encoder's seeds, for terms the rewrites make (the softmax of
    a top-k's values): built upward from a term x, a value is within x when its
    operands are (a reduction, an elementwise op of values within x); a row statistic
    within x is within what is computed from x elementwise; a top-k keeps x's other
    axes. No transitive closure: under rules that multiply e-classes (associativity,
    commutativity) it grew quadratically, seconds per analysis step."""
    c, w = var("c", Tn), var("w", Tn)
    b, op2 = var("b", i64), var("op2", String)
    row = eq(c).to(Red(op2, b, w))  # a row statistic: what the rules' c is
    return [
        # a row statistic within x is within what is computed from x elementwise
        rule(eq(t).to(Un(op, y)), row, within(c, y)).then(within(c, t)),
        rule(eq(t).to(Bin(op, y, z)), row, within(c, y)).then(within(c, t)),
        rule(eq(t).to(Bin(op, y, z)), row, within(c, z)).then(within(c, t)),
        rule(eq(t).to(Un(op, x))).then(within(x, x)),
        rule(eq(t).to(Bin(op, y, z))).then(within(y, y), within(z, z)),
        rule(eq(t).to(Red(op, a, y)), within(y, x)).then(within(t, x)),
        rule(eq(t).to(Un(op, y)), within(y, x)).then(within(t, x)),
        rule(eq(t).to(Bin(op, y, z)), within(y, x), within(z, x)).then(within(t, x)),
        rule(eq(t).to(TopK(op, k, a, x)), within(c, x), flat(c, a)).then(within(c, t)),
    ]


def new_egraph() -> EGraph:
    _free_stranded()
    eg = _ThreadBoundEGraph()
    eg.register(*(AxisId(-i) for i in range(1, MAX_RANK + 1)))
    if _forked_after_search():
        _NEVER_FREED.append(eg)
    return eg


class _ThreadBoundEGraph(EGraph):
    """An e-graph freed on the thread that made it. egglog refuses to free one anywhere
    else ("EGraph is unsendable", and it leaks), yet its state can outlive it in a
    reference cycle (egglog's scheduled runs make one; so does a kept traceback), and
    the garbage collector frees such a cycle on whichever thread collects next: a
    server's request thread. So the e-graph itself is let go of when its wrapper is;
    let go of on another thread, it waits for its own thread's next search."""

    def __init__(self):
        super().__init__()
        self._owner = threading.current_thread()  # not its id: a later thread may reuse that

    def __del__(self):
        rust, self._state.egraph = self._state.egraph, None
        if threading.current_thread() is not self._owner:
            with _STRANDED_LOCK:
                _STRANDED.setdefault(self._owner, []).append(rust)


_STRANDED: dict = {}  # thread -> its e-graphs let go of on other threads
_STRANDED_LOCK = threading.Lock()


def _free_stranded() -> None:
    with _STRANDED_LOCK:
        mine = _STRANDED.pop(threading.current_thread(), None)
    del mine  # freed here, on its own thread


# The process whose e-graphs started egglog's thread pool. Freeing an e-graph waits on
# that pool, whose threads a forked child does not have: the child hung there for good
# (gunicorn or DataLoader-style workers forked after a warm-up). A child keeps its
# e-graphs instead, saying so once.
_POOL_PID: int | None = None
_NEVER_FREED: list = []


def _forked_after_search() -> bool:
    global _POOL_PID
    if _POOL_PID is None:
        _POOL_PID = os.getpid()
        return False
    if os.getpid() == _POOL_PID:
        return False
    if not _NEVER_FREED:
        warnings.warn("cleave: searching in a process forked after its parent searched: egglog cannot free "
                      "e-graphs here (its thread pool stayed in the parent), so each search's memory is kept "
                      "until the process exits; warm up every shape before forking, or start workers with "
                      "the 'spawn' method", stacklevel=2)
    return True
