"""Tile skipping from the graph's own masks.

A `where(cond, x, c)` inside a loop over label X, whose constant branch c leaves
every accumulator of that loop unchanged (a max of -inf, a sum of 0, a dot with a
0 operand: found by evaluating c forward through the elementwise ops, all other
values taken as finite), and whose cond is an affine compare between index (iota)
expressions over X and the program's own labels, bounds the loop per program:
tiles where c is taken everywhere are skipped, and tiles where x is taken
everywhere run without the mask. A causal mask `j <= i` is one instance. One mask
on each side (a sliding window's `j > i - W` with the causal one) bounds the loop
from both ends: it runs over the band between them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import sympy

from cleave.ir import dims as D

from .exprs import code

FIN = "finite"  # any finite value
_UNKNOWN = None


@dataclass
class Segment:
    lo: str  # first start of the loop (code)
    hi: str  # bound of the loop (code)
    keep: dict = field(default_factory=dict)  # id(where instance) -> the branch taken everywhere
    fraction: float = 1.0  # mean share of the loop's tiles this segment runs
    defs: list = field(default_factory=list)  # lines defining the bounds, emitted before the loop
    full: bool = False  # every tile lies inside the extent: the loop label needs no mask


def _add(a, b):
    if a is _UNKNOWN or b is _UNKNOWN:
        return _UNKNOWN
    if a == FIN or b == FIN:
        other = b if a == FIN else a
        return other if other != FIN and math.isinf(other) else FIN
    s = a + b
    return _UNKNOWN if math.isnan(s) else s


def _neg(a):
    return a if a in (FIN, _UNKNOWN) else -a


def _mul(a, b):
    if a is _UNKNOWN or b is _UNKNOWN:
        return _UNKNOWN
    if a == FIN and b == FIN:
        return FIN
    if a == FIN or b == FIN:
        other = b if a == FIN else a
        return 0.0 if other == 0 else (FIN if not math.isinf(other) else _UNKNOWN)
    p = a * b
    return _UNKNOWN if math.isnan(p) else p


def _exp(a):
    if a in (FIN, _UNKNOWN):
        return a
    return 0.0 if a == -math.inf else math.exp(min(a, 700.0))


_SAME = {"cast", "broadcast", "permute", "reshape", "slice"}


def value(inst, where, const, memo) -> object:
    """Abstract value of `inst` when `where` yields `const` everywhere."""
    key = id(inst)
    if key in memo:
        return memo[key]
    if inst is where:
        out = const
    elif inst.reduced is not None or inst.leaf:  # loads; reductions (running values are guarded finite)
        out = FIN
    elif inst.op == "const":
        out = float(inst.node.attrs["value"])
    elif inst.op in _SAME:
        out = value(inst.inputs[0], where, const, memo)
    elif inst.op in ("add", "sub", "mul", "max", "min", "neg", "exp", "where"):
        args = [value(i, where, const, memo) for i in inst.inputs]
        if inst.op == "add":
            out = _add(*args)
        elif inst.op == "sub":
            out = _add(args[0], _neg(args[1]))
        elif inst.op == "mul":
            out = _mul(*args)
        elif inst.op == "neg":
            out = _neg(args[0])
        elif inst.op == "exp":
            out = _exp(args[0])
        elif inst.op == "where":
            x, y = args[1], args[2]
            out = x if x == y else (FIN if x is not _UNKNOWN and y is not _UNKNOWN and
                                    all(v == FIN or not math.isinf(v) for v in (x, y)) else _UNKNOWN)
        else:  # max / min with the op's own identity passes the other side through
            a, b = args
            ident = -math.inf if inst.op == "max" else math.inf
            out = b if a == ident else a if b == ident else (
                FIN if _UNKNOWN not in args and all(v == FIN or not math.isinf(v) for v in args) else _UNKNOWN)
    elif _depends(inst, where):
        out = _UNKNOWN
    else:
        out = FIN
    memo[key] = out
    return out


def _depends(inst, target) -> bool:
    stack, seen = list(inst.inputs), set()
    while stack:
        i = stack.pop()
        if i is target:
            return True
        if id(i) not in seen:
            seen.add(id(i))
            stack.extend(i.inputs)
    return False


def absorbed(acc, where, const) -> bool:
    """Whether `acc` (a loop accumulator) is unchanged by a tile where `where` is `const`."""
    memo: dict = {}
    if acc.op == "matmul":
        vals = [value(i, where, const, memo) for i in acc.inputs]
        return any(v == 0 for v in vals) and all(v is not _UNKNOWN and (v == FIN or not math.isinf(v)) for v in vals)
    ident = {"sum": 0.0, "max": -math.inf, "min": math.inf}[acc.node.attrs["op"]]
    return value(acc.inputs[0], where, const, memo) == ident


def index_expr(inst):
    """The integer index an iota-derived value holds, as a sympy expression over labels."""
    if inst.op == "iota":
        return sympy.sympify(inst.view[inst.node.attrs["axis"]])
    if inst.op == "const" and not inst.node.dtype.is_float:
        return sympy.Integer(int(inst.node.attrs["value"]))
    if inst.op in ("cast", "broadcast"):
        return index_expr(inst.inputs[0])
    if inst.op in ("add", "sub"):
        a, b = (index_expr(i) for i in inst.inputs)
        if a is None or b is None:
            return None
        return a + b if inst.op == "add" else a - b
    return None


# cond -> an expression that is <= 0 exactly where cond holds (integers)
_LE0 = {"le": lambda l, r: l - r, "lt": lambda l, r: l - r + 1,
        "ge": lambda l, r: r - l, "gt": lambda l, r: r - l + 1}
_NOT = {"le": "gt", "lt": "ge", "ge": "lt", "gt": "le"}


def _const_value(inst):
    while inst.op in _SAME:
        inst = inst.inputs[0]
    return float(inst.node.attrs["value"]) if inst.op == "const" else None


def segments(em, x: int, order, trips: int) -> list[Segment]:
    """The loop over label x as segments: skipped tiles left out, unmasked ones
    separated from masked ones. Without a qualifying mask, the whole tiles and the
    ragged last one (when the extent is not a known multiple of the tile)."""
    bx = em.t.block[x]
    extent = code(em.labels[x].extent)
    static = em.t.static.get(x)
    chunk = bool(em.labels[x].extent.free_symbols & em.views.graph.split_counts())
    if (static is not None and static % bx == 0) or chunk:
        # A split's chunk keeps its tail mask (merged index < N) on whole tiles too:
        # peeling it only doubled the loop (measured no faster on the H200).
        plain = [Segment("0", extent)]
    else:  # peeled: the body over whole tiles carries no bounds mask for x
        whole = f"whole{x}"
        plain = [Segment("0", whole, defs=[f"{whole} = {extent} // {bx} * {bx}"], full=True),
                 Segment(whole, extent)]
        _fractions(em, plain, trips, bx)
    limits = {}  # the first mask found on each side: +1 keeps j <= a limit, -1 keeps j >= one
    for where, keep, le0 in _index_masks(em, x, order):
        found = _limits(em, x, le0)
        if found is not None:
            side, any_, all_ = found
            limits.setdefault(side, (any_, all_, where, keep))
    if not limits:
        return plain
    segs = _band(x, bx, extent, limits.get(-1), limits.get(1))
    _fractions(em, segs, trips, bx)
    return segs


def _index_masks(em, x: int, order):
    """(where, the branch it keeps, an expression <= 0 exactly where it keeps it) for each
    where over x whose other branch every accumulator absorbs and whose cond compares
    index expressions."""
    for w in em.views.memo.values():
        if w.op != "where" or x not in w.labels or not any(w is a or _depends(a, w) for a in order):
            continue
        cond, tv, fv = w.inputs
        if cond.op not in _LE0 or cond.node.inputs[0].dtype.is_float:
            continue
        lhs, rhs = (index_expr(i) for i in cond.inputs)
        if lhs is None or rhs is None:
            continue
        for const, keep, op in ((_const_value(fv), tv, cond.op), (_const_value(tv), fv, _NOT[cond.op])):
            if const is not None and all(absorbed(a, w, const) for a in order):
                yield w, keep, sympy.expand(_LE0[op](lhs, rhs))
                break


def _label_range(em, lid: int):
    """Least and greatest index of label lid within one program (code symbols)."""
    b = em.t.block[lid]
    if em.t.role[lid] == "grid":
        tid = sympy.Symbol(f"tid{lid}", integer=True, nonnegative=True)
        return (tid, tid) if b == 1 else (tid * b, tid * b + b - 1)
    if em.t.role[lid] == "full":
        return sympy.Integer(0), sympy.Integer(b - 1)
    return None


def _limits(em, x, le0):
    """(side, limit over any row, limit over every row) of the kept index of x within one
    program: side +1 keeps x <= limit, -1 keeps x >= limit. None unless le0 steps x by one
    and is affine in the program's labels."""
    table = em.views.by_sym()
    xs = em.labels[x].sym
    a = le0.coeff(xs)
    if a not in (1, -1) or sympy.diff(le0, xs, 2) != 0:  # unit steps: bounds need no division
        return None
    rest = sympy.expand(le0 - a * xs)
    lo_sub, hi_sub = {}, {}
    for sym in rest.free_symbols:
        lab = table.get(sym)
        if lab is None:  # a graph symbol: a kernel argument, constant per launch
            continue
        rng = _label_range(em, lab.id)
        c = rest.coeff(sym)
        if rng is None or not c.is_number or sympy.diff(rest, sym, 2) != 0:
            return None
        lo_sub[sym], hi_sub[sym] = (rng if c > 0 else rng[::-1])
    rmin, rmax = rest.xreplace(lo_sub), rest.xreplace(hi_sub)
    return (1, -rmin, -rmax) if a > 0 else (-1, rmin, rmax)


def _band(x, bx, extent, lower, upper) -> list[Segment]:
    """The loop between a lower and/or an upper limit (each (any, all, where, kept branch)):
    tiles outside both skipped, the masked tiles at each edge, and between them the whole
    tiles every mask keeps, run without masks. lo <= inner <= mid <= hi, all but hi tile
    multiples; when the limits cross (lo > mid) only [mid, hi) runs, masked."""
    lo, inner, mid, hi = f"lo{x}", f"inner{x}", f"mid{x}", f"hi{x}"
    defs, keep = [], {}
    if upper:
        last_any, last_all, where, kept = upper
        keep[id(where)] = kept
        defs += [f"{hi} = tl.minimum({extent}, {code(last_any)} + 1)",
                 f"{mid} = tl.minimum(tl.maximum(({code(last_all)} + 1) // {bx} * {bx}, 0), {hi} // {bx} * {bx})"]
    else:
        mid = hi = extent
    if lower:
        first_any, first_all, where, kept = lower
        keep[id(where)] = kept
        defs += [f"{lo} = tl.maximum({code(first_any)}, 0) // {bx} * {bx}",
                 f"{inner} = tl.maximum(tl.minimum(({code(first_all)} + {bx - 1}) // {bx} * {bx}, {mid}), {lo})"]
    else:
        lo = inner = "0"
    # Only tiles before mid are whole (mid <= hi // bx * bx <= extent); without an upper
    # limit the last tile may be ragged and keeps the extent mask.
    segs = ([Segment(lo, inner)] if lower else []) + [Segment(inner, mid, keep, full=bool(upper))]
    segs += [Segment(mid, hi)] if upper else []
    segs[0].defs = defs
    return segs


def _fractions(em, segs, trips, bx):
    """Mean share of the full loop's tiles each segment runs, over the programs
    (evaluated at the scheduled shapes; the cost model reads it)."""
    env = dict(em.env)
    defs = [d for seg in segs for d in seg.defs]
    tids = sorted({int(s[3:]) for s in _names(" ".join(defs)) if re.fullmatch(r"tid\d+", s)})
    counts = [-(-D.evaluate(em.labels[t].extent, env) // em.t.block[t]) for t in tids]
    total = math.prod(counts) if counts else 1
    stride = max(1, total // 512)
    sums, n = [0.0] * len(segs), 0
    scope = {"tl": _Scalar, **env}
    for k in range(0, total, stride):
        rem = k
        for t, c in zip(tids, counts):
            scope[f"tid{t}"] = rem % c
            rem //= c
        for line in defs:
            name, expr = line.split(" = ", 1)
            scope[name] = eval(expr, {}, scope)
        bounds = [(eval(s.lo, {}, scope), eval(s.hi, {}, scope)) for s in segs]
        for i, (lo, hi) in enumerate(bounds):
            sums[i] += max(0, -(-(hi - lo) // bx))
        n += 1
    for seg, s in zip(segs, sums):
        seg.fraction = s / max(n, 1) / max(trips, 1)


def _names(text: str) -> set:
    return set(re.findall(r"[A-Za-z_]\w*", text))


class _Scalar:
    minimum = staticmethod(min)
    maximum = staticmethod(max)
