"""Tile enumeration: a role and a block size for every label of a kernel.

Roles: "grid" (an output dim; one program per tile), "full" (one block covers the
whole extent: small reduced dims such as the head dim, or a whole row) and "loop"
(a reduced dim iterated tile by tile inside the program: iterative tiling). Blocks
are powers of two (tl.arange) and at least 16 on every dim a tl.dot touches, padded
and masked (4 q heads per kv head become 16 rows).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import sympy

from cleave.ir import BindingError
from cleave.ir import dims as D

from .views import Instance, Label, Views

DOT_MIN = 16
LONG_REDUCTION = 256  # a reduced extent past this beside a whole row of up to 256 loops


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass
class Tiling:
    role: dict[int, str]  # label id -> grid | full | loop
    block: dict[int, int]  # lanes: the tile's extent along the label in Triton
    static: dict[int, int] = field(default_factory=dict)  # label id -> extent when not dynamic
    # Grid labels whose tile covers fewer indices than it has lanes: lane l holds index
    # tid * step + l % step. A decode's 4 query heads per kv head fill a tl.dot's 16
    # rows four times over instead of taking 4 requests, whose pages differ.
    step: dict[int, int] = field(default_factory=dict)
    # Grid labels whose program holds `unroll` tiles of them side by side (row_halves.py):
    # the tile at lanes tid * period + l, its copies k * block further on.
    unroll: dict[int, int] = field(default_factory=dict)
    # A loop step's scaled q·Kᵀ computed as (q·Kᵀ)·c, its operand straight from its load
    # (scale_after.py).
    scale_after: bool = False

    def rows(self, lid: int) -> int:
        """How many indices of label lid one tile covers."""
        return self.step.get(lid, self.block[lid])

    def period(self, lid: int) -> int:
        """How many indices of label lid one program covers: its tile's, times the tiles
        it holds side by side."""
        return self.rows(lid) * self.unroll.get(lid, 1)


def dot_labels(views: Views) -> set:
    table, out = views.by_sym(), set()
    for inst in views.memo.values():
        if inst.op == "matmul":
            out.add(inst.reduced.id)
            for e in inst.view[-2:]:
                lab = unit_label(e, table)
                if lab is not None:
                    out.add(lab.id)
    return out


def unit_label(e, table):
    """The label a matmul side tiles along: the side's index itself, or the one label
    with coefficient 1 in an affine index (rows b*s + s' of a (b, s) output: s' tiles,
    b stays one per program)."""
    if e in table:
        return table[e]
    terms = sympy.Add.make_args(sympy.expand(e))
    unit = [t for t in terms if t in table]
    return table[unit[0]] if len(unit) == 1 and all(t.is_polynomial() for t in terms) else None


def merged_rows(views: Views, env: dict) -> list[tuple[int, int]]:
    """(outer, inner) label pairs of a tl.dot side whose index is outer·G + inner, inner of
    a static extent G below the dot minimum: GQA's queries merged with their group of 4
    heads (rows 4i + g). The inner label pads to 16 rows, or goes to the grid (one head
    per program) while the outer one tiles the rows, strided by G."""
    table, out = views.by_sym(), []
    for inst in views.memo.values():
        if inst.op != "matmul":
            continue
        for e in inst.view[-2:]:
            inner = None if e in table else unit_label(e, table)
            if inner is None or inner.extent.free_symbols or D.evaluate(inner.extent, env) >= DOT_MIN:
                continue
            for term in sympy.Add.make_args(sympy.expand(e)):
                labs = [table[x] for x in term.free_symbols if x in table]
                if len(labs) == 1 and labs[0] is not inner and sympy.expand(term - inner.extent * labs[0].sym) == 0 \
                        and (labs[0].id, inner.id) not in out:
                    out.append((labs[0].id, inner.id))
    return out


def _grouped_rows(lab: Label) -> bool:
    """Rows merged from a symbolic count and a static group of at most a dot's rows (GQA's
    requests times the query heads of a kv head, 4*batch_size; MLA's 16 heads per request
    or query), as the layout sink leaves them."""
    coeff, rest = lab.extent.as_coeff_Mul()
    return bool(rest.free_symbols) and coeff.is_Integer and 1 < coeff <= DOT_MIN


def _is_dynamic(lab: Label, dynamic: set) -> bool:
    return any(s.name in dynamic for s in lab.extent.free_symbols)


def choices(views: Views, root_labels: list, env: dict, dynamic: set, target, relaxed: bool = False) -> list[dict]:
    """Per label, the (role, block) options to enumerate. `relaxed`: also the smaller
    tiles of the labels held whole by default (a dot's inner output label, a short
    reduction), for a graph no partition of which fits otherwise (api._partition)."""
    dots = dot_labels(views)
    inner = {lab.id for lab in root_labels[-1:]}
    roots = {lab.id for lab in root_labels}
    # Without tl.dot, the grid label next to the row may take several rows per program
    # when a row is small: many tiny programs cost more in latency than in work.
    small = all(D.evaluate(lab.extent, env) <= 1024 for lab in views.labels if lab.id not in roots)
    rows = {lab.id for lab in root_labels[-2:-1]} if not dots and small else set()
    # Without tl.dot, a reduction too long to hold whole beside a whole short row loops,
    # and such a loop runs step by step (Stats.pipelined): the row may then take
    # narrower tiles, over more programs, so that the reduction fits one tile (a split's
    # combine over 264 chunks: 2.5 us with 32 of its 128 columns per program, 7-18 us
    # looping over the chunks with all 128; RESULTS.md session 14).
    reduced = [next_pow2(D.evaluate(lab.extent, env)) for lab in views.labels
               if lab.id not in roots and not _is_dynamic(lab, dynamic)]
    long_reduction = not dots and max(reduced, default=0) > LONG_REDUCTION
    out = {}
    for lab in views.labels:
        n = D.evaluate(lab.extent, env)
        dyn = _is_dynamic(lab, dynamic)
        floor = DOT_MIN if lab.id in dots else 1
        full = max(next_pow2(n), floor)
        if lab.id in roots:
            if lab.id in dots:  # a tl.dot side: wgmma wants 64+ rows; small extents pad to 16
                opts = [b for b in (64, 128, 256) if b < full and b >= floor] + ([full] if full <= 256 else [])
                if _grouped_rows(lab):  # a decode's rows: a few requests per program spread it over the SMs
                    opts = sorted(set(opts + [b for b in (DOT_MIN, 2 * DOT_MIN) if b < full]))
                    group = int(lab.extent.as_coeff_Mul()[0])
                    if group < DOT_MIN:  # or one request per program, its heads replicated over the lanes
                        out[lab.id] = [("grid", b) for b in opts] + [("grid", DOT_MIN, group)]
                        continue
                if lab.id in inner and not dyn and full <= 256 and not relaxed:
                    opts = [full]  # the head dim: splitting it recomputes the scores per part
                elif lab.id in inner and not dyn and full <= target.hold_matmul:
                    opts.append(full)  # a wide head dim (MLA's 512) whole, where the registers allow
                opts = opts or [floor]
            elif lab.id in inner:
                opts = [b for b in (16, 32, 64, 128) if b >= floor and (b < full or dyn)]
                if not dyn and full <= 16384:
                    opts = [full] if full <= 256 and not (long_reduction or relaxed) else sorted(set(opts[-2:] + [full]))
            elif lab.id in rows and not dyn:  # several small rows per program
                opts = [b for b in (1, 4, 16, 64) if b <= full]
            else:
                opts = [1]
            out[lab.id] = [("grid", b) for b in opts]
            continue
        loops = [("loop", b) for b in (32, 64, 128) if (b < full or dyn) and b >= floor] or [("loop", DOT_MIN)]
        if lab.origin == "topk" and dyn:
            # topk keeps the whole axis in one tile: a tile sized at this binding would
            # drop the elements past it at a longer one
            raise BindingError(f"scheduler: topk over an axis of dynamic extent {D.fmt(lab.extent)} "
                               f"(it needs the whole axis in one tile)")
        if lab.origin == "topk" or (not dyn and full <= target.full_matmul and not (relaxed and loops[0][1] < full)):
            out[lab.id] = [("full", full)]
        elif not dyn and full <= target.full_reduce:  # a whole row, or a loop: the cost model picks
            out[lab.id] = [("full", full)] + loops[-2:]
        else:
            out[lab.id] = loops
    for outer, inner in merged_rows(views, env):  # the inner label to the grid, the outer one tiling the rows
        if outer in roots and inner in roots:
            n = D.evaluate(views.labels[outer].extent, env)
            full = max(next_pow2(n), DOT_MIN)
            tiled = [b for b in (64, 128) if b < full] + ([full] if full <= 128 else [])
            out[outer] = list(dict.fromkeys(out[outer] + [("grid", b) for b in tiled]))
            out[inner] = list(dict.fromkeys(out[inner] + [("grid", 1)]))
    return out


def enumerate_tilings(views: Views, root_labels: list, env: dict, dynamic: set, target, limit: int = 64,
                      relaxed: bool = False):
    opts = choices(views, root_labels, env, dynamic, target, relaxed)
    static = {lab.id: D.evaluate(lab.extent, env) for lab in views.labels if not _is_dynamic(lab, dynamic)}
    # Labels of one extent and the same options share one choice: reductions over one
    # axis then get one block, so they can share one loop.
    groups: dict = {}
    for lab in views.labels:
        groups.setdefault((str(lab.extent), tuple(opts[lab.id])), []).append(lab.id)
    keys = list(groups)
    merged = merged_rows(views, env)
    tilings = (_tiling(keys, groups, combo, static) for combo in itertools.product(*(k[1] for k in keys)))
    # merged rows: exactly one of the two labels tiles them (both would make a 3-d dot operand)
    tilings = (t for t in tilings if all((t.block[o] > 1) != (t.block[i] > 1) for o, i in merged))
    yield from itertools.islice(tilings, limit)


def _tiling(keys, groups, combo, static) -> Tiling:
    role, block, step = {}, {}, {}
    for key, option in zip(keys, combo):
        for i in groups[key]:
            role[i], block[i] = option[:2]
            if len(option) > 2:
                step[i] = option[2]
    return Tiling(role, block, static=static, step=step)


def launch_options(t: Tiling, stage_choices: tuple = ()):
    """num_warps and num_stages to cost for one tiling (they do not change the code).
    A loop also gets one stage (no multi-buffering): a loop that loads many tiles
    (RoPE's rotated k) only fits shared memory that way. Two warps suit a loop that
    streams K/V past a small accumulator (GQA decode on the H200: 1-4% faster than four
    at b=40-64, RESULTS.md session 3 diagnostics); ties keep four, listed first. A
    kernel without a tl.dot launches with one stage only (Kernel.launches); one that
    gathers, with its `stage_choices` (kernel_stats.Stats.stage_choices)."""
    looped = "loop" in t.role.values()
    for warps in ((4, 2, 8) if looped else (4, 8)):
        for stages in ((stage_choices or (1, 2, 3, 4)) if looped else (1,)):
            yield warps, stages


def is_full(t: Tiling, lid: int) -> bool:
    """One block covers the whole extent (a full label, or a grid label of one tile)."""
    return t.role[lid] == "full" or (lid in t.static and t.block[lid] >= t.static[lid])


def aliases(views: Views, t: Tiling) -> dict[int, int]:
    """Labels that may share one index variable: same role, block and extent, never
    together in one value or one index. Full labels then read one tile once
    (LayerNorm's row), and loop labels of one axis share one loop (horizontal fusion).
    A value need not vary over every label of its index: x @ broadcast(1) is constant
    along its columns, yet its rows and columns index two axes of the stored result."""
    together: dict[int, set] = {lab.id: set() for lab in views.labels}
    for inst in views.memo.values():
        labs = set(inst.labels) | ({inst.reduced.id} if inst.reduced else set()) | views.labels_of(inst.view)
        for inp in inst.inputs:
            labs |= inp.labels
        for a in labs:
            together[a] |= labs - {a}
    classes: list[list[int]] = []
    out = {}
    for lab in views.labels:
        kind = "full" if is_full(t, lab.id) else t.role[lab.id]
        if kind == "grid":
            continue
        for cls in classes:
            rep = views.labels[cls[0]]
            if (("full" if is_full(t, rep.id) else t.role[rep.id]) == kind and t.block[rep.id] == t.block[lab.id]
                    and sympy.expand(rep.extent - lab.extent) == 0 and not any(m in together[lab.id] for m in cls)):
                cls.append(lab.id)
                out[lab.id] = rep.id
                break
        else:
            classes.append([lab.id])
    return out


def remap(views: Views, alias: dict[int, int]) -> Views:
    """The same instances with aliased labels replaced by their representative."""
    subs = {views.labels[a].sym: views.labels[b].sym for a, b in alias.items()}
    new = Views(views.graph, views.leaves, labels=views.labels)
    done: dict[int, Instance] = {}

    def go(inst: Instance) -> Instance:
        if id(inst) in done:
            return done[id(inst)]
        view = tuple(sympy.sympify(e).xreplace(subs) for e in inst.view)
        key = (inst.node.id, view)
        at = None if inst.at is None else tuple(sympy.sympify(e).xreplace(subs) for e in inst.at)
        if key not in new.memo:
            reduced = views.labels[alias.get(inst.reduced.id, inst.reduced.id)] if inst.reduced else None
            labels = frozenset(alias.get(x, x) for x in inst.labels)
            new.memo[key] = Instance(inst.node, view, [go(i) for i in inst.inputs], labels, reduced, inst.leaf, at)
        elif new.memo[key].at != at:  # two own indices read one operand index: neither is known
            new.memo[key].at = None
        done[id(inst)] = new.memo[key]
        return new.memo[key]

    new.roots = [go(r) for r in views.roots]
    new.gathers = {f.xreplace(subs): go(i) for f, i in views.gathers.items()}
    new.gather_extents = {f.xreplace(subs): extent for f, extent in views.gather_extents.items()}
    new.index_extents = views.index_extents
    return new
