"""Integer values a loop's bounds read, fixed within one program (bounds.py).

An index compare that bounds a loop over x may read, besides the program's own tile
indices, integers the loop does not vary over, computed before it: a length or an
indptr entry loaded per program, or per row of the program's tile (a row tile's
requests). A bound over the tile is the least or greatest of the compare's per-row
value, so the whole expression is reduced over the tile's lanes (tl.min / tl.max of
`kv_end[r] - q_end[r] + i` over the rows, not max(kv_end) - min(q_end), which spans
from one request to the next when a tile holds several). Lanes past a label's extent
(a last tile's padding) compute nothing that is stored, so they are left out.
"""
from __future__ import annotations

import sympy

from .exprs import code
from .index_bounds import provable
from .loop_bounds import Call, symbol, tid

_SAME = {"cast", "broadcast", "permute", "reshape", "slice"}


def index_expr(inst, program=None):
    """The integer index an iota-derived value holds, as a sympy expression over labels.
    With `program` (a ProgramValues), an integer value the loop does not vary over (a
    bound loaded from an index tensor: an indptr, a sequence length) stands as one
    symbol per program."""
    if inst.op == "iota":
        return sympy.sympify(inst.view[inst.node.attrs["axis"]])
    if inst.op == "const" and not inst.node.dtype.is_float:
        return sympy.Integer(int(inst.node.attrs["value"]))
    if inst.op in _SAME and not inst.node.inputs[0].dtype.is_float:
        found = index_expr(inst.inputs[0], program)
        if found is not None:
            return found
    if inst.op in ("add", "sub"):
        a, b = (index_expr(i, program) for i in inst.inputs)
        if a is None or b is None:
            return program.symbol(inst) if program else None
        return a + b if inst.op == "add" else a - b
    return program.symbol(inst) if program else None


def label_range(em, lid: int):
    """Least and greatest index of label lid within one program."""
    b = em.t.rows(lid)
    if em.t.role[lid] == "grid":
        t = tid(lid)
        p = em.t.period(lid)  # a program's tiles side by side: this is its first (row_halves.py)
        return (t, t) if p == 1 else (t * p, t * p + b - 1)
    if em.t.role[lid] == "full":
        return sympy.Integer(0), sympy.Integer(b - 1)
    return None


class ProgramValues:
    """Integer values constant along loop x within one program, computed before the loop
    (block h), each a symbol named as its value; the bounds defined from them (`defs`)
    and the instances each symbol is computed from (`insts`)."""

    def __init__(self, em, h, x: int):
        self.em, self.h, self.x = em, h, x
        self.scalars: set = set()  # symbols of one value per program
        self.tiles: dict = {}  # symbol -> Val: a value per lane of the program's tile
        self.defs: list = []  # (symbol, bound), in order
        self.insts: dict = {}  # symbol -> the instances its value is computed from

    @property
    def loaded(self) -> bool:
        return bool(self.insts)

    def symbol(self, inst):
        em = self.em
        if inst.node.dtype.is_float or self.x in inst.labels or _reads_loop(inst, self.x) or any(
                em.t.role[i] == "loop" and i not in self.h.chain for i in inst.labels):
            return None
        val = em.ensure(self.h, inst)
        sym = symbol(val.name)
        if val.dims:
            self.tiles[sym] = val
        else:
            self.scalars.add(sym)
        self.insts[sym] = {inst}
        return sym

    def define(self, name: str, bound, reads) -> sympy.Symbol:
        """A symbol for `bound`, computed from the values of the symbols in `reads`."""
        sym = symbol(name)
        self.defs.append((sym, bound))
        self.insts[sym] = set().union(*(self.insts.get(s, set()) for s in reads))
        return sym

    def extremes(self, e):
        """(least, greatest) of integer expression e over the lanes of the program's tile,
        or None when e reads a label it cannot bound (another loop's)."""
        if not e.free_symbols & set(self.tiles):
            return self._intervals(e)
        em, labels = self.em, _labels(self.em, e)
        if any(em.t.role[lid] == "loop" for lid in labels):
            return None
        key = ("lanes", e)  # the same expression in the program's next loop: its lanes are there
        if key not in self.h.cache:
            dims = em.dims(set(labels) | {d for s in e.free_symbols & set(self.tiles) for d in self.tiles[s].dims})
            names = {**em.names(dims), **{s: em.align(v, dims) for s, v in self.tiles.items()}}
            lanes = self.tiles[e] if e in self.tiles else em.var(self.h, code(e, names), dims, "tl.int64")
            valid = [m for m in (em.valid(lid, dims) for lid in dims) if m]
            low = high = lanes
            if valid:  # a padding lane reads as a kept one: the min and max of all lanes are kept lanes'
                mask = " & ".join(valid)
                low = em.var(self.h, f"tl.where({mask}, {lanes.name}, tl.max({lanes.name}))", dims, "tl.int64")
                high = em.var(self.h, f"tl.where({mask}, {lanes.name}, tl.min({lanes.name}))", dims, "tl.int64")
            self.h.cache[key] = (lanes.name, low.name, high.name)
        name, low, high = self.h.cache[key]
        reads = e.free_symbols
        return (self.define(f"{name}_min", Call("min", (symbol(low),)), reads),
                self.define(f"{name}_max", Call("max", (symbol(high),)), reads))

    def _intervals(self, e):
        """extremes of e without per-lane values: each label, per-program value or division
        of a label ranges on its own (exact: e is affine in each, and they are independent)."""
        em = self.em
        table = em.views.by_sym()
        divided = {}
        for f in e.atoms(sympy.floor):
            if not f.free_symbols & (set(table) | self.scalars):  # of kernel arguments only
                continue
            num, den = sympy.fraction(sympy.together(f.args[0]))
            lab = table.get(num)
            rng = lab and label_range(em, lab.id)
            if not rng or den.free_symbols & set(table) or not provable(den - 1):
                return None
            divided[sympy.Dummy(integer=True)] = (f, tuple(sympy.floor(r / den) for r in rng))
        e = e.xreplace({f: d for d, (f, _) in divided.items()})
        ranges = {**{lab.sym: label_range(em, lab.id) for lab in em.views.labels if lab.sym in e.free_symbols},
                  **{s: (s, s) for s in self.scalars}, **{d: rng for d, (_, rng) in divided.items()}}
        lo_sub, hi_sub = {}, {}
        for sym in e.free_symbols:
            if sym not in ranges:  # a graph symbol: a kernel argument, constant per launch
                continue
            rng, c = ranges[sym], e.coeff(sym)
            if rng is None or c.free_symbols & set(ranges) or sympy.diff(e, sym, 2) != 0:
                return None
            if provable(c):
                lo_sub[sym], hi_sub[sym] = rng
            elif provable(-c):
                lo_sub[sym], hi_sub[sym] = rng[::-1]
            else:
                return None
        return e.xreplace(lo_sub), e.xreplace(hi_sub)

    def inputs(self, symbols) -> frozenset:
        """Names of the graph inputs that the values among `symbols` are computed from."""
        stack = [i.node for s in symbols for i in self.insts.get(s, ())]
        seen, out = set(), set()
        while stack:
            n = stack.pop()
            if n.id not in seen:
                seen.add(n.id)
                out |= {n.attrs["name"]} if n.op == "input" else set()
                stack.extend(n.inputs)
        return frozenset(out)


def _labels(em, e) -> list:
    """Ids of the kernel's labels that expression e reads."""
    table = em.views.by_sym()
    return [table[s].id for s in e.free_symbols if s in table]


def _reads_loop(inst, x) -> bool:
    """Whether inst depends on a reduction over x (its value is known only after the loop)."""
    stack, seen = [inst], set()
    while stack:
        i = stack.pop()
        if i.reduced is not None and i.reduced.id == x:
            return True
        if id(i) not in seen:
            seen.add(id(i))
            stack.extend(i.inputs)
    return False
