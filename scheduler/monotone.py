"""Loop bounds from compares with a value that never decreases along the loop.

A segment id counted from an indptr, seg[j] = sum_k (j >= indptr[k]), never decreases
in j, whatever the indptr holds (each term steps up once). So `seg[x + c] >= g`, with
g fixed per program (a row's own segment id), holds on a suffix of the loop: from the
first j with seg[j] >= g on; `seg[x + c] <= g` on a prefix, up to the first j with
seg[j] >= g + 1; and `seg_q[i] == seg_kv[j]` on the range between, the row's request.
Where seg is materialised (a buffer the kernel reads), the kernel finds that first j by
searching the buffer (FIRST_AT_LEAST: 128 probes a step, two steps for 16K tokens).
No sorted indptr is assumed: the search reads the ids themselves.
"""
from __future__ import annotations

import sympy

from .index_bounds import provable
from .loop_bounds import Search
from .partition import buffer_name
from .program_values import index_expr, label_range
from .views import Views

FIRST_AT_LEAST = [
    "@triton.jit",
    "def first_at_least(ptr, n, t):",
    "    # the first j < n with ptr[j] >= t (n when none), for ptr[0:n] never decreasing",
    "    lo = tl.zeros([], tl.int32)",
    "    hi = (lo + n).to(tl.int32)",
    "    while lo < hi:",
    "        step = (hi - lo + 127) // 128",
    "        at = lo + step * tl.arange(0, 128)",
    "        below = tl.sum((tl.load(ptr + at, mask=at < hi, other=t) < t).to(tl.int32))",
    "        hi = tl.where(below == 0, lo, tl.minimum(hi, lo + below * step))",
    "        lo = tl.where(below == 0, lo, lo + (below - 1) * step + 1)",
    "    return lo",
]

_FLIP = {"ge": "le", "gt": "lt", "le": "ge", "lt": "gt", "eq": "eq"}
_NOT = {"ge": "lt", "gt": "le", "le": "gt", "lt": "ge"}  # eq negated (ne) bounds nothing
_VIEWS = {"broadcast", "permute", "reshape", "slice", "split"}


def monotone_bounds(em, x, term, negated, program) -> list | None:
    """Bounds (bounds.py's (side, any lane, all lanes)) of a compare between a value
    never decreasing in loop x and one fixed per program; None when neither side is such
    a value ([] when one is, but the compare bounds nothing)."""
    op = _NOT.get(term.op) if negated else term.op
    for side in (0, 1):
        read = _monotone_read(em, x, term.inputs[side])
        if read is None:
            continue
        if op is None:
            return []
        load, offset = read
        g = index_expr(term.inputs[1 - side], program)
        ends = None if g is None or em.labels[x].sym in g.free_symbols else program.extremes(g)
        if ends is None:
            return []
        least, greatest = ends
        op = op if side == 0 else _FLIP[op]

        def first(t):  # the loop index where the buffer reaches t
            return _search(program, load, t) - offset

        out = []
        if op in ("ge", "gt", "eq"):  # from the first j with seg[j] >= g (g + 1 for gt)
            k = int(op == "gt")
            out.append(("lo", first(least + k), first(greatest + k)))
        if op in ("le", "lt", "eq"):  # up to the first j with seg[j] >= g + 1 (g for lt)
            k = int(op != "lt")
            out.append(("hi", first(greatest + k), first(least + k)))
        return out
    return None


def _search(program, load, target):
    """A symbol for the search of `load`'s buffer for target, defined before the loop."""
    em, node = program.em, load.node
    bound = Search(buffer_name(em.views.graph, node), node.shape[0], target)
    sym = program.define(f"first{program.x}_{len(program.defs)}", bound, target.free_symbols)
    program.insts[sym] |= {load}
    return sym


def _monotone_read(em, x, inst):
    """(load, c) when inst reads a materialised 1-d integer buffer at index x + c (c fixed
    per program) whose values never decrease along it; else None."""
    while not inst.leaf and (inst.op in _VIEWS or inst.op == "cast" and _widens(inst.node)):
        inst = inst.inputs[0]
    if not inst.leaf or len(inst.node.shape) != 1 or not inst.node.dtype.is_int or x not in inst.labels:
        return None
    e, xs = sympy.expand(inst.view[0]), em.labels[x].sym
    c = sympy.expand(e - xs)
    if xs in c.free_symbols:
        return None
    table = em.views.by_sym()
    fixed = {}
    for s in c.free_symbols & set(table):
        rng = label_range(em, table[s].id)
        if rng is None or rng[0] != rng[1]:  # an offset per lane: not one search per program
            return None
        fixed[s] = rng[0]
    if not nondecreasing(em.views.graph, inst.node):
        return None
    return inst, c.xreplace(fixed)


def nondecreasing(graph, node) -> bool:
    """Whether the 1-d node's value never decreases along its axis, for any inputs."""
    views = Views(graph, set())
    pos = views.label(node.shape[0], "out")
    return _trend(views.get(node, (pos.sym,)), pos, {}) in (0, 1)


def _trend(inst, pos, memo):
    """+1 where inst's value never decreases as the position grows, -1 where it never
    increases, 0 where it does not vary, None where unknown."""
    if id(inst) in memo:
        return memo[id(inst)]
    op = inst.op
    if pos.id not in inst.labels:
        out = 0
    elif op == "iota":
        out = _index_trend(sympy.expand(inst.view[inst.node.attrs["axis"]]), pos.sym)
    elif op in _VIEWS or op == "cast" and _widens(inst.node) or op == "reduce" and inst.node.attrs["op"] in (
            "sum", "max", "min"):  # a sum, max or min over another axis of steps up steps up
        out = _trend(inst.inputs[0], pos, memo)
    elif op in ("add", "sub", "neg", "max", "min", "ge", "gt", "le", "lt"):
        signs = [_trend(i, pos, memo) for i in inst.inputs]
        # a - b and [a >= b] step up where a steps up and b down; [a <= b] the other way
        flip = {"sub": [1], "ge": [1], "gt": [1], "neg": [0], "le": [0], "lt": [0]}.get(op, [])
        out = _same([None if t is None else -t if k in flip else t for k, t in enumerate(signs)])
    else:
        out = None
    memo[id(inst)] = out
    return out


def _same(signs):
    """The trend of a value monotone in each of its operands with these trends."""
    if None in signs or (1 in signs and -1 in signs):
        return None
    return 1 if 1 in signs else (-1 if -1 in signs else 0)


def _index_trend(e, s):
    """The trend of index e in position s: linear, or the floor of a linear over a
    positive constant (a page of a token)."""
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return _index_trend(sympy.expand(num), s) if provable(den - 1) and s not in den.free_symbols else None
    if sympy.diff(e, s, 2) != 0:
        return None
    slope = sympy.diff(e, s)
    return 1 if provable(slope) else (-1 if provable(-slope) else None)


def _widens(node) -> bool:
    """A cast that keeps the order of values: to a type at least as wide, never to bool."""
    src = node.inputs[0].dtype
    return node.dtype.value != "bool" and (node.dtype.is_float or not src.is_float) and \
        node.dtype.itemsize >= src.itemsize
