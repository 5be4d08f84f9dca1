"""Tile skipping from the graph's own masks.

A `where(cond, x, c)` inside a loop over label X, whose constant branch c leaves
every accumulator of that loop unchanged (a max of -inf, a sum of 0, a dot with a
0 operand: found by evaluating c forward through the elementwise ops, all other
values taken as finite), and whose cond is an affine compare between index (iota)
expressions over X and the program's own labels, bounds the loop per program:
tiles where c is taken everywhere are skipped, and tiles where x is taken
everywhere run without the mask. A causal mask `j <= i` is one instance. The
compare may also read integers the loop does not vary over, loaded per program (a
CSR range `indptr[b] <= j < indptr[b+1]`, a length `j < seq_lens[b]`), or per row
of the program's tile (each row's request bounds, gathered through its segment id:
program_values.py reduces the compare's bound over the rows), and cond may be a
conjunction: each compare of it bounds the loop, since c is taken wherever one of
them fails (a disjunction does not). Several such wheres bound it together (a
sliding window's start, the causal end): a tile runs where each may keep a lane.
A compare may also read the page of a token, floor(token / page_size) (64-token
pages flattened into tokens): it bounds the token loop at page_size times the page;
or a value that never decreases along the loop (a segment id, `seg_q == seg_kv`:
monotone.py).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import sympy
from sympy.core.function import AppliedUndef

from cleave.ir import dims as D

from .index_bounds import provable
from .loop_bounds import Call, Tiles, free_symbols, maximum, minimum, nest, render, symbol, tid, value as bound_value
from .monotone import monotone_bounds
from .program_values import ProgramValues, index_expr
from .tile_order import trip_directions

FIN = "finite"  # any finite value
_UNKNOWN = None


@dataclass
class Segment:
    lo: object  # first start of the loop (a bound: loop_bounds.py)
    hi: object  # bound of the loop
    keep: dict = field(default_factory=dict)  # id(where instance) -> the branch taken everywhere
    fraction: float = 1.0  # mean share of the loop's tiles this segment runs
    defs: list = field(default_factory=list)  # (symbol, bound): the bounds defined before the loop, in order
    full: bool = False  # every tile lies inside the extent: the loop label needs no mask
    loaded: dict = field(default_factory=dict)  # "lo"/"hi" -> graph inputs the loop's bound is loaded from


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


def _exp(a, base=math.e):
    if a in (FIN, _UNKNOWN):
        return a
    return 0.0 if a == -math.inf else base ** min(a, 700.0)


_SAME = {"cast", "broadcast", "permute", "reshape", "slice"}


def _either(x, y):
    """The abstract value of a select between x and y."""
    if x == y:
        return x
    known = x is not _UNKNOWN and y is not _UNKNOWN
    return FIN if known and all(v == FIN or not math.isinf(v) for v in (x, y)) else _UNKNOWN


def value(inst, consts: dict, memo) -> object:
    """Abstract value of `inst` when each where instance in `consts` (by id) yields its
    constant everywhere."""
    key = id(inst)
    if key in memo:
        return memo[key]
    if key in consts:
        out = consts[key]
    elif inst.reduced is not None or inst.leaf:  # loads; reductions (running values are guarded finite)
        out = FIN
    elif inst.op == "const":
        out = float(inst.node.attrs["value"])
    elif inst.op in _SAME:
        out = value(inst.inputs[0], consts, memo)
    elif inst.op == "inf_to_zero":  # an empty chunk's max read as 0
        v = value(inst.inputs[0], consts, memo)
        out = 0.0 if v not in (FIN, _UNKNOWN) and math.isinf(v) else v
    elif inst.op == "split":  # a chunk's padding lanes hold the pad
        v, pad = value(inst.inputs[0], consts, memo), inst.node.attrs["pad"]
        out = v if pad is None else _either(v, pad)
    elif inst.op in ("add", "sub", "mul", "max", "min", "neg", "exp", "exp2", "where"):
        args = [value(i, consts, memo) for i in inst.inputs]
        if inst.op == "add":
            out = _add(*args)
        elif inst.op == "sub":
            out = _add(args[0], _neg(args[1]))
        elif inst.op == "mul":
            out = _mul(*args)
        elif inst.op == "neg":
            out = _neg(args[0])
        elif inst.op in ("exp", "exp2"):
            out = _exp(args[0], math.e if inst.op == "exp" else 2.0)
        elif inst.op == "where":
            out = _either(args[1], args[2])
        else:  # max / min with the op's own identity passes the other side through
            a, b = args
            ident = -math.inf if inst.op == "max" else math.inf
            out = b if a == ident else a if b == ident else (
                FIN if _UNKNOWN not in args and all(v == FIN or not math.isinf(v) for v in args) else _UNKNOWN)
    elif _depends(inst, consts):
        out = _UNKNOWN
    else:
        out = FIN
    memo[key] = out
    return out


def _depends(inst, targets) -> bool:
    """Whether inst's inputs reach an instance whose id is in targets."""
    stack, seen = list(inst.inputs), set()
    while stack:
        i = stack.pop()
        if id(i) in targets:
            return True
        if id(i) not in seen:
            seen.add(id(i))
            stack.extend(i.inputs)
    return False


def absorbed(acc, consts: dict) -> bool:
    """Whether `acc` (a loop accumulator) is unchanged by a tile where each where
    instance in consts yields its constant."""
    memo: dict = {}
    if acc.op == "matmul":
        vals = [value(i, consts, memo) for i in acc.inputs]
        return any(v == 0 for v in vals) and all(v is not _UNKNOWN and (v == FIN or not math.isinf(v)) for v in vals)
    ident = {"sum": 0.0, "max": -math.inf, "min": math.inf, "prod": 1.0}[acc.node.attrs["op"]]
    return value(acc.inputs[0], consts, memo) == ident


# cond -> an expression that is <= 0 exactly where cond holds (integers)
_LE0 = {"le": lambda l, r: l - r, "lt": lambda l, r: l - r + 1,
        "ge": lambda l, r: r - l, "gt": lambda l, r: r - l + 1}
_NOT = {"le": "gt", "lt": "ge", "ge": "lt", "gt": "le"}


def _const_value(inst):
    while inst.op in _SAME:
        inst = inst.inputs[0]
    return float(inst.node.attrs["value"]) if inst.op == "const" else None


def _and_operands(inst):
    """(a, b) when inst is `a and b` (captured as where(a, b, False)), else None."""
    if inst.op == "where" and inst.node.dtype.value == "bool" and _const_value(inst.inputs[2]) == 0.0:
        return inst.inputs[0], inst.inputs[1]
    return None


def conjuncts(cond) -> list:
    """The terms of a conjunction, through reshapes and broadcasts."""
    while cond.op in _SAME and not cond.leaf:
        cond = cond.inputs[0]
    ab = _and_operands(cond)
    return conjuncts(ab[0]) + conjuncts(ab[1]) if ab else [cond]


def holds(cond, known: set, keep: dict) -> bool:
    """Whether cond holds given that the conjuncts in `known` do; an `and` of which one
    side is known reads as its other side (recorded in keep)."""
    if id(cond) in known:
        return True
    if cond.op in _SAME and not cond.leaf:
        return holds(cond.inputs[0], known, keep)
    ab = _and_operands(cond)
    if ab is None:
        return False
    a, b = (holds(i, known, keep) for i in ab)
    if a and not b:
        keep[id(cond)] = ab[1]
    elif b and not a:
        keep[id(cond)] = ab[0]
    return a and b


def segments(em, h, x: int, order, trips: int) -> list[Segment]:
    """The loop over label x (emitted in block h) as segments: skipped tiles left out,
    unmasked ones separated from masked ones. Without a qualifying mask, the whole tiles
    and the ragged last one (when the extent is not a known multiple of the tile)."""
    bx = em.t.block[x]
    extent = em.labels[x].extent
    static = em.t.static.get(x)
    divides = static is not None and static % bx == 0
    # A split's chunk keeps its tail mask (merged index < N) on whole tiles too:
    # peeling it only doubled the loop (measured no faster on the H200).
    chunk = bool(em.labels[x].extent.free_symbols & em.views.graph.split_counts())
    if divides or chunk:
        plain = [Segment(sympy.Integer(0), extent)]
    else:  # peeled: the body over whole tiles carries no bounds mask for x
        whole = symbol(f"whole{x}")
        plain = [Segment(sympy.Integer(0), whole, defs=[(whole, Tiles(extent, bx))], full=True),
                 Segment(whole, extent)]
        _fractions(em, plain, trips, bx)
    program = ProgramValues(em, h, x)
    masks, keep = [], {}
    for group in _where_groups(em, x, order):
        for branch in (2, 1):  # the constant on the false side (a mask), or on the true side
            const = _const_value(group[0].inputs[branch])
            if const is None or not all(absorbed(a, {id(w): const for w in group}) for a in order):
                continue
            # Skipping a tile is exact when every where of the group takes c on all of it, so
            # that the tile adds only the accumulators' neutral element: when one conjunct
            # of each where's cond is false on all of it. A negated cond is a disjunction:
            # only a lone compare bounds it.
            spans, kept = [], {}
            for w in group:
                terms = conjuncts(w.inputs[0]) if branch == 2 else [w.inputs[0]]
                found = [(t, b) for t in terms for b in _term_bounds(em, x, t, branch == 1, program)]
                if not found:
                    break
                if holds(w.inputs[0], {id(t) for t, _ in found}, kept):
                    kept[id(w)] = w.inputs[3 - branch]
                spans.append([b for _, b in found])
            else:
                masks.append(spans)
                keep.update(kept)
                break
    if not masks:
        em.stats.loops.append(loop_record(em, x, plain))
        return plain
    window = _window(em, x, masks, program) if chunk else None
    if window is not None:
        em.windows[x] = window
        masks = window.masks
    segs, edges = _bounds(em, x, masks, keep, program.defs, divides, chunk, window and window.length)
    loaded = {side: program.inputs(free_symbols(edge)) for side, edge in edges.items()}
    for seg in segs:
        seg.loaded = {side: names for side, names in loaded.items() if names}
    share = _loaded_share(em, segs[0].loaded)
    if "lo" in segs[0].loaded:  # a tile of k requests' rows runs the union of their ranges
        csr = segs[0].loaded["lo"] & segs[0].loaded.get("hi", frozenset())
        share = min(1.0, share * _entries_per_program(em, program, csr))
        if chunk and window is None:
            em.stats.active = min(em.stats.active, _active_share(em, x, share))
    _fractions(em, segs, trips, bx, program, share)
    em.stats.loops.append(loop_record(em, x, segs))
    return segs


def loop_record(em, x: int, segs: list[Segment]) -> dict:
    """The loop over label x as plain data (a Kernel's `loops`): its extent, first start and
    last stop (code), the graph inputs each side's bound is loaded from, the share of the
    extent's tiles a program is expected to run (what the cost model counts), whether it
    runs a relative split chunk (Window), and how its trip count moves with each grid
    tile id its bounds read (tile_order.py)."""
    defs = [d for seg in segs for d in seg.defs]
    return {"label": f"X{x}", "extent": render(em.labels[x].extent), "lo": render(segs[0].lo),
            "hi": render(segs[-1].hi),
            "loaded": {side: sorted(names) for side, names in segs[0].loaded.items()},
            "fraction": round(sum(seg.fraction for seg in segs), 4), "relative": x in em.windows,
            "trips": trip_directions(em, segs[0].lo, segs[-1].hi, defs)}


def _where_groups(em, x, order) -> list[list]:
    """The float where instances inside the loop over x that feed its accumulators,
    grouped by node: one mask under several tile maps (a MatMul's two layouts) bounds
    the loop only together."""
    groups: dict = {}
    for w in em.views.memo.values():
        if w.op == "where" and w.node.dtype.is_float and x in w.labels and \
                any(w is a or _depends(a, {id(w)}) for a in order):
            groups.setdefault(w.node.id, []).append(w)
    return list(groups.values())


def _term_bounds(em, x, term, negated, program) -> list:
    """For a compare that is linear in x with a unit step, or that reads a value never
    decreasing in x (monotone.py): its bounds, each ("lo", first index where it holds on
    some lane of the program's tile, first where it holds on all) or ("hi", end of where
    it holds on some lane, end of where on all)."""
    if term.op not in (*_LE0, "eq") or term.node.inputs[0].dtype.is_float:
        return []
    found = monotone_bounds(em, x, term, negated, program)
    if found is not None or term.op == "eq":
        return found or []
    lhs, rhs = (index_expr(i, program) for i in term.inputs)
    if lhs is None or rhs is None:
        return []
    le0 = sympy.expand(_LE0[_NOT[term.op] if negated else term.op](lhs, rhs))
    xs = em.labels[x].sym
    below = _below(em)
    le0 = _undivided(le0, xs, below)
    if le0 is None:
        return []
    a = le0.coeff(xs)
    if a not in (1, -1) or sympy.diff(le0, xs, 2) != 0:  # unit steps: bounds need no division
        return []
    rest = sympy.expand(le0 - a * xs)
    # A grid row's request through a division (GQA's rows merged with their heads, row
    # i = floor(r / group) % rows): the floor is monotone in r, so its least and greatest
    # over the program's tile are those of r divided (the % dropped as in _undivided).
    rest = rest.replace(lambda e: isinstance(e, sympy.Mod), lambda e: _unmod(e, below))
    ends = program.extremes(rest)
    if ends is None:
        return []
    rmin, rmax = ends
    if a > 0:  # holds where x <= -rest
        return [("hi", 1 - rmin, 1 - rmax)]
    return [("lo", rmin, rmax)]  # holds where x >= rest


def _below(em) -> dict:
    """Index expressions with the extent they stay below on every lane that reaches an
    accumulator: a label (a loop's lanes past its extent are masked) and a split's merged
    index (a chunk's lanes past the split axis hold the pad)."""
    out = {lab.sym: lab.extent for lab in em.views.labels}
    for inst in em.views.memo.values():
        if inst.op == "split":
            axis = inst.node.attrs["axis"]
            out[sympy.expand(inst.inputs[0].view[axis])] = inst.node.inputs[0].shape[axis]
    return out


def _undivided(le0, xs, below: dict):
    """le0 (an integer expression that is <= 0 where a compare holds) with a page index
    floor(u / P) of the loop's token u (P positive, constant per launch) traded for u
    itself, so that the bounds need no division: for an integer r, floor(u/P) <= r iff
    u <= P*r + P - 1, and floor(u/P) >= r iff u >= P*r. A reshape indexes the page as
    floor(u/P) % m (pages [m, P] flattened into tokens): the % is the identity on the
    lanes that matter when u stays below P*m there (`below`, _unmod), else the compare
    is left unbounded. le0 unchanged when it divides no index of x; None when it does
    so otherwise."""
    mods = [f for f in le0.atoms(sympy.Mod) if xs in f.free_symbols]
    floors = [f for f in le0.atoms(sympy.floor) if xs in f.free_symbols and not any(f in m.args for m in mods)]
    if not mods and not floors:
        return le0
    if len(mods) + len(floors) != 1:
        return None
    (f,) = mods + floors
    page = f.args[0] if mods else f
    if not isinstance(page, sympy.floor):
        return None
    num, den = sympy.fraction(sympy.together(page.args[0]))
    u = sympy.expand(num)
    if den.free_symbols & set(below) or not provable(den - 1) or sympy.diff(u, xs, 2) != 0:
        return None
    if mods and _unmod(f, below) is f:
        return None
    a = le0.coeff(f)
    rest = sympy.expand(le0 - a * f)
    if a not in (1, -1) or xs in rest.free_symbols:
        return None
    return sympy.expand(u + den * rest - (den - 1) if a == 1 else den * rest - u)


def _unmod(e, below: dict):
    """floor(u/P) for e = floor(u/P) % m when u stays below P*m on the lanes that matter
    (`below`): the % is then the identity; else e itself."""
    page = e.args[0]
    if not isinstance(page, sympy.floor):
        return e
    num, den = sympy.fraction(sympy.together(page.args[0]))
    u = sympy.expand(num)
    return page if u in below and provable(den * e.args[1] - below[u]) else e


def _sides(masks) -> dict:
    """Per side, per mask, per instance: the (any, all) bounds of its conjuncts."""
    return {side: [[[(a, b) for s, a, b in span if s == side] for span in spans] for spans in masks]
            for side in ("lo", "hi")}


def _reach(sides, side, loose, tight) -> list:
    """Per mask whose every instance has a bound on this side, the bound of the lanes it
    may keep: `tight` over an instance's conjuncts, `loose` over the instances."""
    return [nest(loose, [nest(tight, [a for a, _ in w]) for w in m]) for m in sides[side] if all(m)]


def _bounds(em, x, masks, keep, defs, divides, chunk, window=None):
    """Segments from the masks' bounds: [lo, full_lo) masked, [full_lo, full_hi) whole
    tiles on which every mask holds everywhere (run without them), [full_hi, hi) masked.
    Each mask (a where node: per instance, its conjuncts' (side, any, all) bounds) may
    keep a lane of a tile between its instances' least start and greatest end; a tile
    runs where every mask may (a sliding window's start and the causal end). Also the
    loop's own bounds, lo and hi, by side, where a mask gives one. `window`: the loop's
    length when it runs a relative chunk (_window), in place of the label's extent."""
    bx, extent = em.t.block[x], (em.labels[x].extent if window is None else window)
    sides = _sides(masks)
    defs = list(defs)

    def define(name: str, bound):
        sym = symbol(f"{name}{x}")
        defs.append((sym, bound))
        return sym

    def reach(side, loose, tight):
        return _reach(sides, side, loose, tight)

    def alls(side):
        return [b for m in sides[side] for w in m for _, b in w]

    def down(e):  # clamped at 0 before dividing: Triton's integer // truncates toward 0
        return Tiles(maximum(e, 0), bx)

    # Per side, the loop's bound (lo: the first tile that may keep a lane, rounded down;
    # hi: the end of what may be kept) and the edge of the whole tiles on which every
    # lane holds (lo: rounded up; hi: rounded down, inside the loop).
    bound, full, edges = {"lo": sympy.Integer(0), "hi": extent}, {"lo": sympy.Integer(0)}, {}
    edge = {"lo": down, "hi": lambda t: minimum(extent, t)}
    run = {"lo": lambda t: maximum(Tiles(maximum(t, 0), bx, up=True), bound["lo"]),
           "hi": lambda t: maximum(minimum(down(t), down(bound["hi"])), full["lo"])}
    for side, tight, loose in (("lo", "maximum", "minimum"), ("hi", "minimum", "maximum")):
        if not alls(side):
            continue
        if reach(side, loose, tight):
            edges[side] = edge[side](nest(tight, reach(side, loose, tight)))
            bound[side] = define(side, edges[side])
        full[side] = define(f"full_{side}", run[side](nest(tight, alls(side))))
    if "hi" not in full:  # no upper bound: the unmasked run ends at the extent, or at its last whole tile
        full["hi"] = extent if divides or chunk else define("full_hi", maximum(Tiles(extent, bx), full["lo"]))
    segs = []
    if alls("lo"):  # a masked run, cut at hi, past which nothing is kept (full_lo may lie beyond it)
        segs.append(Segment(bound["lo"], define("first_hi", minimum(full["lo"], bound["hi"]))))
    segs.append(Segment(full["lo"], full["hi"], keep, full=not (chunk and not alls("hi"))))
    if full["hi"] != extent:
        segs.append(Segment(full["hi"], bound["hi"]))
    segs[0].defs = defs
    return segs, edges


@dataclass(frozen=True)
class Window:
    """A split chunk run relative to the program's own range (FlashDecoding's split):
    chunk c of s covers [lo + c*L, lo + (c+1)*L) of the merged index, where [lo, hi) is
    the union of the program's rows' ranges and L = ceil((hi - lo) / s) rounded up to
    whole tiles, instead of the fixed [c*n, (c+1)*n) of the split's layout, which
    holds a short request's pages in one chunk (the others idle). The loop runs t in
    [0, L) with the label's index j = t + off (off = lo + c*L - c*n), so that every
    index c*n + j the kernel reads is the merged one it stands for."""
    off: sympy.Symbol
    length: sympy.Symbol
    end: sympy.Symbol  # off + length: where the label's lanes end
    masks: list  # the masks' bounds in t, the loop's own coordinates


def _window(em, x, masks, program) -> Window | None:
    """The relative chunk of loop x (Window), when x is a split's inner axis whose chunk
    is one grid index of the program, the masks bound both of its sides, and every index
    the kernel reads through x is the merged index c*n + x: then the chunks of one row
    tile partition its range however they are placed (what lies outside holds the
    accumulators' neutral element, which is why the masks bound the loop). Else None."""
    c = _chunk_label(em, x)
    if c is None or not all(isinstance(v, sympy.Basic) for spans in masks for span in spans
                            for _, a, b in span for v in (a, b)):
        return None
    sides, ends = _sides(masks), {}
    for side, tight, loose in (("lo", "maximum", "minimum"), ("hi", "minimum", "maximum")):
        reached = _reach(sides, side, loose, tight)
        if not reached:
            return None
        ends[side] = nest(tight, reached)
    base = tid(c) * em.labels[x].extent  # j-space bounds plus c*n: the merged index's, the same in every chunk

    def define(name, bound):
        return program.define(f"{name}{x}", bound, free_symbols(bound))

    # the merged index starts at 0: a mask's bound below it (a sliding window's first
    # rows, i - w + 1 < 0) must not start the range there, where no lane masks the load
    lo = define("range_lo", maximum(_shifted(ends["lo"], base), 0))
    hi = define("range_hi", _shifted(ends["hi"], base))
    span = define("span", maximum(hi - lo, 0))
    length = define("window", Tiles(sympy.ceiling(span / em.labels[c].extent), em.t.block[x], up=True))
    off = define("off", lo + tid(c) * length - base)
    end = define("window_end", off + length)
    shifted = [[[(side, a - off, b - off) for side, a, b in span] for span in spans] for spans in masks]
    return Window(off, length, end, shifted)


def _shifted(b, k):
    """Bound b (maximum/minimum of expressions) plus k."""
    if isinstance(b, Call):
        return Call(b.fn, tuple(_shifted(a, k) for a in b.args))
    return b + k


def _chunk_label(em, x) -> int | None:
    """The grid label c of the chunk when loop x runs a split's inner axis, one chunk per
    program, and every index a load or an iota computes from x is the split's merged
    index c*n + x (a bare x would read another element once x leaves [0, n))."""
    xs, n = em.labels[x].sym, em.labels[x].extent
    chunks = {sympy.sympify(i.view[i.node.attrs["axis"]]) for i in em.views.memo.values()
              if i.op == "split" and sympy.sympify(i.view[i.node.attrs["axis"] + 1]) == xs}
    if len(chunks) != 1:
        return None
    c = chunks.pop()
    lab = em.views.by_sym().get(c)
    if lab is None or em.t.role[lab.id] != "grid" or em.t.block[lab.id] != 1:
        return None
    at = {xs: sympy.Dummy("merged", integer=True) - c * n}
    for inst in em.views.memo.values():
        if inst.leaf or inst.op == "iota":
            for e in map(sympy.sympify, inst.view):
                if xs in e.free_symbols and c in sympy.expand(e.xreplace(at)).free_symbols:
                    return None
    return lab.id


def _loaded_share(em, loaded: dict) -> float:
    """Expected share of the loop's extent that one program's loaded range covers. A
    range whose start is loaded is a CSR segment: R requests partition the extent (packed
    tokens, or a split chunk of them: summed over the chunks, a request's pieces cover its
    tokens once), so a range covers 1/R of it on average; R is the length of the starts'
    1-d tensor, less one when the same tensor gives the ends (an indptr). A length alone
    (`pos < seq_lens[b]`) runs against an extent padded to the longest request (a block
    table's): taken as half of it."""
    if "lo" in loaded:
        inputs = em.views.graph.inputs
        indptr = bool(loaded["lo"] & loaded.get("hi", frozenset()))
        counts = [D.evaluate(inputs[n].shape[0], em.env) - indptr for n in loaded["lo"] if len(inputs[n].shape) == 1]
        return 1 / max(1, max(counts, default=1))
    return 0.5 if "hi" in loaded else 1.0


def _active_share(em, x: int, share: float) -> float:
    """Share of the (row tile, chunk) programs whose loop runs: T row tiles, each covering
    `share` of the packed extent, against s equal chunks of it. Both partition the
    extent, so they overlap in at most T + s - 1 pieces: most chunks hold none of a
    tile's pages, and the pieces are the work."""
    counts = [em.env[s.name] for s in em.labels[x].extent.free_symbols & em.views.graph.split_counts()
              if s.name in em.env]
    tiles = max(1.0, 1 / share)
    chunks = math.prod(counts) if counts else 1
    return min(1.0, (tiles + chunks - 1) / (tiles * chunks))


def _entries_per_program(em, program, names) -> int:
    """The most entries of the indptrs `names` one program loads for its bounds: a row
    tile holding the rows of k requests (merged (request, head) rows) reads k of them,
    counted over the lanes of the first program's tile."""
    most, seen = 1, set()
    stack = [i for insts in program.insts.values() for i in insts]
    while stack:
        inst = stack.pop()
        if id(inst) in seen:
            continue
        seen.add(id(inst))
        if inst.leaf and inst.node.op == "input" and inst.node.attrs["name"] in names and len(inst.view) == 1:
            most = max(most, _distinct_lanes(em, inst.view[0]))
        elif not inst.leaf:
            stack.extend(inst.inputs)
    return most


def _distinct_lanes(em, e, limit: int = 4096) -> int:
    """How many values integer index e takes over the lanes of the first program's tile
    (1 where that is unknown here or no row tile's: e reads a label other than the grid's,
    another tensor (a gathered index), or the tile has more than `limit` lanes)."""
    labels = [lab for lab in em.views.labels if lab.sym in e.free_symbols]
    if any(em.t.role[lab.id] != "grid" for lab in labels) or e.atoms(AppliedUndef):
        return 1
    ranges = [range(min(em.t.rows(lab.id), D.evaluate(lab.extent, em.env))) for lab in labels]
    if math.prod(len(r) for r in ranges) > limit:
        return 1
    e = e.xreplace({s: em.env[s.name] for s in e.free_symbols if s.name in em.env})
    if e.free_symbols - {lab.sym for lab in labels}:
        return 1
    f = sympy.lambdify([lab.sym for lab in labels], e, modules="math")
    return len({f(*lanes) for lanes in itertools.product(*ranges)})


def _fractions(em, segs, trips, bx, program=None, share=1.0):
    """Mean share of the full loop's tiles each segment runs, over the programs
    (evaluated at the scheduled shapes; the cost model reads it: a segment's loads and
    flops count `fraction` of the loop's trips). Bounds loaded at run time are unknown
    here: their masked runs are taken as one tile each, the unmasked run as the rest of
    the expected range (`share` of the extent, _loaded_share), so that a decode program
    costs its own request's pages, not the whole batch's (which made a split-KV plan look
    necessary at every batch size)."""
    if program is not None and program.loaded:
        edges = len(segs) - 1
        for seg in segs:
            seg.fraction = 1 / max(trips, 1) if not seg.full else max(0.0, share - edges / max(trips, 1))
        return
    defs = [d for seg in segs for d in seg.defs]
    read = set().union(*(free_symbols(b) for _, b in defs))
    tids = [lid for lid in sorted(em.labels) if tid(lid) in read]
    counts = [-(-D.evaluate(em.labels[t].extent, em.env) // em.t.period(t)) for t in tids]
    total = math.prod(counts) if counts else 1
    stride = max(1, total // 512)
    sums, n = [0.0] * len(segs), 0
    scope = dict(em.env)
    for k in range(0, total, stride):
        rem = k
        for t, c in zip(tids, counts):
            scope[f"tid{t}"] = rem % c
            rem //= c
        for sym, b in defs:
            scope[sym.name] = bound_value(b, scope)
        bounds = [(bound_value(s.lo, scope), bound_value(s.hi, scope)) for s in segs]
        for i, (lo, hi) in enumerate(bounds):
            sums[i] += max(0, -(-(hi - lo) // bx))
        n += 1
    for seg, s in zip(segs, sums):
        seg.fraction = s / max(n, 1) / max(trips, 1)
