"""TMA tensor descriptors for a kernel's dense operand tiles (Hopper's bulk copies).

A load is read through a descriptor, `desc.load([offsets])`, when it is one block of
its buffer at tile offsets: each tiled label of the value indexes its own buffer axis
as `label + offset` (the offset constant over the tile), every other axis a single
index, the last axis is tiled (a TMA box's inner row is at least 16 bytes), and each
mask the pointer path would apply is the buffer's own bound, which the descriptor's
zero fill provides. The kernel keeps the pointer path too, behind a `TMA` constexpr:
the launcher takes it when a call's tensors break TMA's alignment rules.

Which kernels: those that accumulate a MatMul tile of 64+ by 64+ over a `loop` label
and whose grid fills the target's SMs at the scheduled shape, or may at another shape
of a dynamic axis (`wants_tma`; the launcher then applies the same rule per call).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from .exprs import code
from .index_bounds import provable
from .views import gathers

MAX_BOX = 256  # elements per descriptor box dim (a TMA limit)
MIN_ROW_BYTES = 16  # a box's inner row (a TMA limit)


@dataclass(frozen=True)
class TileLoad:
    """One load through a descriptor: the descriptor's block (in buffer axis order),
    the offset code per axis, and the order of the value's labels in memory."""
    block: tuple
    offsets: tuple
    order: tuple  # label ids, in buffer axis order


def wants_tma(em, target) -> bool:
    """The rule: descriptors for kernels with a tiled-contraction loop whose grid fills
    the SMs; a decode-sized launch would spend more building descriptors per call. A
    grid over a dynamic extent may fill the SMs at some shapes: the launcher decides per
    call (the same rule at the call's shape)."""
    if target.sms <= 0 or not any(a.op == "matmul" and _large_tile(em, a, target) for a in em.accs):
        return False
    if any(s.name in em.dynamic for lab in em.spec.root_labels for s in lab.extent.free_symbols):
        return True
    tiles = 1
    for lab in em.spec.root_labels:
        extent = em.eval_extent(lab.extent)
        tiles *= -(-extent // em.t.period(lab.id))
    return tiles >= target.sms


def _large_tile(em, acc, target) -> bool:
    """An accumulator tile of target.tma_min_tile (64) or more on both sides (prefill,
    GEMMs). A decode step's 16 padded query rows stream K/V as fast through pointers,
    and its short launch pays for the descriptors (H200: GQA decode at b8 went from
    0.081 to 0.104 ms with one)."""
    blocks = sorted(em.t.block[lid] for lid in acc.labels)
    return len(blocks) >= 2 and blocks[-2] >= target.tma_min_tile


def tile_load(em, inst, dims, itemsize: int) -> TileLoad | None:
    """The descriptor load that reads what the pointer path's masked load reads, where
    a label's lanes past its extent may differ only where no result depends on them."""
    shape, view = inst.node.shape, inst.view
    if not dims or len(shape) > 5 or any(gathers(e) for e in view) or any(d in em.t.step for d in dims):
        return None  # a box is a run of rows, not rows repeated over the lanes
    syms = {em.labels[d].sym: d for d in dims}
    starts = em.names(dims)
    for sym, lid in syms.items():
        role, b = em.t.role[lid], em.t.block[lid]
        starts[sym] = f"tid{lid} * {em.t.period(lid)}" if role == "grid" else (f"start{lid}" if role == "loop" else "0")
    block, offsets, order, axis_of = [], [], [], {}
    for k, e in enumerate(view):
        e = sympy.sympify(e)
        tiled = e.free_symbols & set(syms)
        lo, _ = em.bounds(e)
        if lo is None or not provable(lo):  # a negative coordinate: keep the pointer path's mask
            return None
        if len(tiled) > 1:
            return None
        if tiled:
            sym = tiled.pop()
            lid = syms[sym]
            if lid in axis_of or (sympy.expand(e - sym).free_symbols & set(syms)):
                return None
            axis_of[lid] = k
            block.append(em.t.block[lid])
            order.append(lid)
        else:
            block.append(1)
        offset = code(e, starts)  # TMA coordinates are int32 (tile indices are int64 in wide kernels)
        offsets.append(offset if offset == "0" else f"tl.cast({offset}, tl.int32)")
    if set(axis_of) != set(dims) or block[-1] == 1 or block[-1] * itemsize < MIN_ROW_BYTES \
            or max(block) > MAX_BOX:
        return None
    for lid in inst.labels:
        if em.valid(lid, dims) is None or lid in em.free_lanes:
            continue  # no mask, or lanes that are never stored nor reduced over
        if lid not in axis_of or not _bound_is_buffer(em, lid, view[axis_of[lid]], shape[axis_of[lid]]):
            return None
    return TileLoad(tuple(block), tuple(offsets), tuple(order))


def _bound_is_buffer(em, lid: int, e, dim) -> bool:
    """Whether label lid's mask `index < extent` is the buffer axis's bound `e < dim`:
    e is the label itself (single-index labels at 0) and its extent is the dim."""
    lab = em.labels[lid]
    zero = {em.labels[i].sym: 0 for i in em.labels if em.t.block[i] == 1 and em.t.role[i] != "grid"}
    return sympy.expand(sympy.sympify(e).xreplace(zero) - lab.sym) == 0 and \
        sympy.expand(em.fix_static(lab.extent) - em.fix_static(dim)) == 0


def emit(em, b, name: str, desc: str, tl_load: TileLoad, dims, pointer_load: str) -> str | None:
    """The lines of a load through descriptor `desc` or, without TMA, the pointer
    path; returns the name of the tile in memory order when that is its transpose."""
    loaded = f"{desc}.load([{', '.join(tl_load.offsets)}])"
    mem = [em.t.block[d] for d in tl_load.order]
    if len(mem) != len(tl_load.block):
        loaded += f".reshape({mem})"
    b.lines.append("if TMA:")
    trans = None
    if list(tl_load.order) == list(dims):
        b.lines += [f"    {name} = {loaded}", "else:", f"    {name} = {pointer_load}"]
    elif len(dims) == 2:  # a transposed operand: the dot reads the memory-order tile
        trans = f"{name}t"
        b.lines += [f"    {trans} = {loaded}", f"    {name} = tl.trans({trans})",
                    "else:", f"    {name} = {pointer_load}", f"    {trans} = tl.trans({name})"]
    else:
        perm = [list(tl_load.order).index(d) for d in dims]
        b.lines += [f"    {name} = tl.permute({loaded}, {perm})", "else:", f"    {name} = {pointer_load}"]
    return trans
