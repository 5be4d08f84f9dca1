"""Row halves: a program that holds two row tiles of a kernel side by side.

A loop step of attention runs two dependent MMAs (S = q·Kᵀ, then P·V) with the
softmax between them. One row tile per program leaves the tensor cores idle while
its softmax runs; two row tiles in one program, each with its own accumulators,
let one tile's softmax overlap the other's MMA, and each K and V tile loaded serves
both. On the H200 a hand-written kernel so (two 128-row tiles, 64-key steps, 8
warps, 3 stages) ran full attention 8% faster than one 128-row tile per program,
causal attention 14% slower (RESULTS.md, 2026-12-02 session 15). The runtime's
profiling picks between them; this module only offers the option.

The second tile is the kernel's outputs stored a second time, at the row label plus
the tile's block: the tile maps (views.py) derive its instances, the ones that do
not vary over the rows (K and V tiles) are the first tile's once their loop labels
are aliased (tiles.aliases), and the program's lanes of the row label step by two
tiles (Tiling.unroll, period). Kernels with a Split's partial results are left as
they are: their combine pairs a tile of rows with a tile of chunks (combine.py).
"""
from __future__ import annotations

import sympy

from .partition import KernelSpec, Store
from .tiles import Tiling, unit_label
from .views import Views

FACTOR = 2
MIN_ROWS = 64  # a row tile of fewer rows has little MMA to overlap (a decode's 16)


def chained_rows(views: Views, t: Tiling) -> set:
    """Row labels of the loop MatMuls whose left operand a MatMul computes in the same
    loop step (P·V after S = q·Kᵀ): grid labels of one run of rows per tile, 64 or more."""
    table, out = views.by_sym(), set()
    for acc in views.memo.values():
        if acc.op != "matmul" or acc.reduced is None or t.role[acc.reduced.id] != "loop":
            continue
        if not _computed_by_dot(acc.inputs[0], acc.reduced.id, t):
            continue
        lab = unit_label(acc.view[-2], table)
        if lab is not None and t.role[lab.id] == "grid" and t.block[lab.id] >= MIN_ROWS and lab.id not in t.step:
            out.add(lab.id)
    return out


def _computed_by_dot(inst, loop: int, t: Tiling) -> bool:
    """Whether inst, varying over loop label `loop`, is computed from a MatMul within
    one step of that loop (a whole contraction, not another accumulator)."""
    seen, stack = set(), [inst]
    while stack:
        x = stack.pop()
        if id(x) in seen or x.leaf or loop not in x.labels:
            continue
        seen.add(id(x))
        if x.op == "matmul" and t.role[x.reduced.id] != "loop":
            return True
        if x.reduced is not None and t.role[x.reduced.id] == "loop":
            continue  # another loop's running value
        stack.extend(x.inputs)
    return False


def options(spec: KernelSpec, t: Tiling) -> list[tuple[KernelSpec, Tiling]]:
    """The kernel with two row tiles per program, for each row label that may take them
    (none where the extent has one tile, or the kernel holds a Split's partials)."""
    views = spec.views
    if any(i.op == "split" for i in views.memo.values()):
        return []
    out = []
    for lid in sorted(chained_rows(views, t)):
        static = t.static.get(lid)
        if static is not None and static <= t.block[lid]:
            continue
        built = _side_by_side(spec, t, lid)
        if built is not None:
            out.append(built)
    return out


def _side_by_side(spec: KernelSpec, t: Tiling, lid: int):
    old = spec.views
    views = Views(old.graph, old.leaves, labels=list(old.labels), budget=old.budget)
    views.memo = dict(old.memo)
    views.gathers, views.gather_extents = dict(old.gathers), dict(old.gather_extents)
    views.index_extents = {k: list(v) for k, v in old.index_extents.items()}
    sym = old.labels[lid].sym
    stores, same = list(spec.stores), {}
    for k in range(1, FACTOR):
        shift = {sym: sym + k * t.block[lid]}
        for st in spec.stores:
            at = tuple(sympy.sympify(e).xreplace(shift) for e in st.inst.at)
            inst = views.get(st.inst.node, at)
            if not _pair(st.inst, inst, same):
                return None
            stores.append(Store(inst, st.buffer, tuple(sympy.sympify(e).xreplace(shift) for e in st.view), st.node))
    views.roots = [s.inst for s in stores]
    role, block, static, step = dict(t.role), dict(t.block), dict(t.static), dict(t.step)
    for new, first in same.items():  # a later tile's reduced labels are tiled as the first tile's
        role[new], block[new] = t.role[first], t.block[first]
        if first in t.static:
            static[new] = t.static[first]
        if first in t.step:
            step[new] = t.step[first]
    tiling = Tiling(role, block, static=static, step=step, unroll={lid: FACTOR})
    return KernelSpec(spec.name, views, stores, spec.root_labels), tiling


def _pair(first, later, same: dict) -> bool:
    """Match the instances of the first tile's walk with a later tile's (the same nodes,
    in the same order), recording each label the later one reduces against the first's."""
    seen, stack = set(), [(first, later)]
    while stack:
        a, b = stack.pop()
        if (id(a), id(b)) in seen:
            continue
        seen.add((id(a), id(b)))
        if a.node is not b.node or len(a.inputs) != len(b.inputs) or (a.reduced is None) != (b.reduced is None):
            return False
        if b.reduced is not None and b.reduced.id != a.reduced.id:
            if same.setdefault(b.reduced.id, a.reduced.id) != a.reduced.id:
                return False
        stack.extend(zip(a.inputs, b.inputs))
    return True
