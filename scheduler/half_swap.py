"""Half swaps: an instance that is another instance's tile rolled by half a period.

A node reached under two tile maps that differ along one dim by a constant is two
instances (views.py), computed twice: RoPE's rotate_half reads its operand at the
head index j + c and j - c beside j (c = half the head dim), so a projection
feeding RoPE ran its tl.dot three times. When the base instance's index along that
dim is a label L alone, L's tile is all of L (one tile from 0) and both L and the
node's dim have extent 2c, the shifted instance (index L +- c) equals, wherever
its index is inside the node's dim, the base tile with its halves swapped:
x[(j + c) mod 2c]. The kernel then computes the base once and swaps it in
registers.

Where the shifted index leaves the node's dim, the swap holds other values. No
consumer reads those lanes: an index leaves a node's domain at valid label lanes
only below a concat (an operand's index is the concat's minus its offset) or a
split (the merged index past the unpadded extent), and both select those lanes
away with a tl.where on the index (codegen: "concat", "split"). The loads the old
path emitted there were masked by the buffer's bounds, not by the slice's domain
(a safe address, not a defined value), and a dot of them was no more defined.
The one exception is a split padding with zero over a masked load, which reads
the load's zeros instead of selecting: an instance feeding one is not swapped.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy


@dataclass(frozen=True)
class Swap:
    base: object  # the instance whose tile is rolled
    label: int  # the label L along which it is rolled
    half: int  # c: the roll is by half of L's 2c lanes


def find_swaps(em) -> dict:
    """id(shifted instance) -> Swap, for the instances of emitter `em` (its views, tiling
    and bound symbols) whose value is a half swap of another instance it computes."""
    insts = list(em.views.memo.values())
    by_at = {(i.node.id, i.at): i for i in insts if i.at is not None}
    zero_read = _zero_padded_loads(insts)
    table = em.views.by_sym()
    found = {}
    for inst in insts:
        if inst.at is None or id(inst) in zero_read:
            continue
        swap = _swap_of(em, inst, by_at, table)
        if swap is not None:
            found[id(inst)] = swap
    # A swap replaces the shifted instance's work by its base's: keep it only where the
    # base is computed anyway, or stands for two shifted instances (both halves).
    while True:
        live = _live(em, found, through=False)
        bases: dict = {}
        for key, s in found.items():
            if key in live:
                bases[id(s.base)] = bases.get(id(s.base), 0) + 1
        keep = {k: s for k, s in found.items() if id(s.base) in live or bases.get(id(s.base), 0) >= 2}
        if len(keep) == len(found):
            return found
        found = keep


def live_instances(em, swaps: dict) -> set:
    """ids of the instances the kernel computes when the swaps are taken."""
    return _live(em, swaps, through=True)


def _live(em, swaps: dict, through: bool) -> set:
    """Instances reached from the stores (and gathers); a swapped instance reaches its
    base when `through`, nothing otherwise."""
    stack = [st.inst for st in em.spec.stores] + list(em.views.gathers.values())
    seen: set = set()
    while stack:
        inst = stack.pop()
        if id(inst) in seen:
            continue
        seen.add(id(inst))
        if id(inst) in swaps:
            if through:
                stack.append(swaps[id(inst)].base)
            continue
        stack.extend(inst.inputs)
    return seen


def _swap_of(em, inst, by_at: dict, table: dict) -> Swap | None:
    at = tuple(sympy.sympify(e) for e in inst.at)
    shape = inst.node.shape
    for a, e in enumerate(at):
        for sym in e.free_symbols & set(table):
            shift = em.fix_static(e - sym)
            if not (shift.is_Integer and shift != 0):
                continue
            c = abs(int(shift))
            lab = table[sym]
            base = by_at.get((inst.node.id, at[:a] + (sym,) + at[a + 1:]))
            if base is None or base is inst or not _one_period(em, lab.id, c):
                continue
            if em.fix_static(shape[a]) != 2 * c:
                continue
            return Swap(base, lab.id, c)
    return None


def _one_period(em, lid: int, c: int) -> bool:
    """Label lid's tile is all of it, from 0, and it holds exactly 2c lanes."""
    t = em.t
    return t.role[lid] in ("grid", "full") and t.static.get(lid) == 2 * c and t.block[lid] == 2 * c


def _zero_padded_loads(insts) -> set:
    """ids of the loads (and the casts over them) a split pads with zero by reading
    their masked lanes (codegen's split: a zero pad over a masked load)."""
    out = set()
    for i in insts:
        if i.op == "split" and i.node.attrs["pad"] == 0.0:
            x = i.inputs[0]
            chain = [x]
            while x.op == "cast":
                x = x.inputs[0]
                chain.append(x)
            if x.op == "load":
                out |= {id(y) for y in chain}
    return out


def lines(name: str, v, shape: list, p: int, c: int) -> list[str]:
    """Lines that set `name` to value v (a tile of `shape`) rolled by c along its axis p
    of 2c lanes: the axis is split into [2, c], the 2-axis moved last and split into
    its halves, which are joined the other way round and moved back."""
    halves = shape[:p] + [2, c] + shape[p + 1:]
    n = len(halves)
    last = [i for i in range(n) if i != p] + [p]  # the 2-axis last
    back = [0] * n
    for i, k in enumerate(last):
        back[k] = i
    out = [f"{name} = tl.reshape({v}, {halves})"]
    if last != list(range(n)):
        out.append(f"{name} = tl.permute({name}, {last})")
    out += [f"{name}_lo, {name}_hi = tl.split({name})", f"{name} = tl.join({name}_hi, {name}_lo)"]
    if back != list(range(n)):
        out.append(f"{name} = tl.permute({name}, {back})")
    out.append(f"{name} = tl.reshape({name}, {shape})")
    return out
