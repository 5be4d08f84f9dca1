"""Fuse with recompute, or materialise: the partitioner's cost comparison for a MatMul
operand that its kernel computes (a normalised row, rotated keys, silu(gate)·up).

A MatMul program computes its operand's tile once per tile of the other side's grid
dim, so a fused operand is computed about extent/128 times over (a gate projection
renormalises its rows once per 128 of 14336 columns; attention rotates each key once
per query tile). Materialised, it costs one write and one read in its own dtype and a
launch. Recomputing costs, for every extra pass, the bytes its loads move (from L2,
they were read before) and its vector arithmetic, which on a GPU of this compute to
bandwidth ratio is what makes the fused RoPE or norm slow, not its bytes.
"""
from __future__ import annotations

import math

from cleave.ir import dims as D

from .tiles import unit_label
from .views import Instance

# ops that only re-index or re-type a value: an operand built of these and loads is read, not
# computed (a Split's chunks, a gather of pages through an index tensor)
LAYOUT = ("reshape", "permute", "cast", "slice", "broadcast", "concat", "split", "take", "gather")
NOT_COMPUTED = ("const", "size", "iota")
# the single-input ops a stored operand may be taken below
REINDEX = ("reshape", "permute", "broadcast", "cast")
# the other side's tile the operand is recomputed for (the largest dot tile the enumeration offers
# below 256, so the count is not understated)
OTHER_TILE = 128


def operand_cuts(spec, cuttable: list[Instance], env: dict, target, long, dynamic=frozenset()) -> set[int]:
    """Node ids to materialise for the kernel's MatMul operands, from its roots down: an
    operand it had better store than recompute; else, in an operand it computes once
    per program (the other side is a loop: attention's queries), the projections it
    would run as a second long loop before its own (`long(label)`), leaving their cheap
    epilogue (the query's rotation) to run once, at load. Nothing below a cut is looked
    at: that is its own kernel's to decide when it is built."""
    table = spec.views.by_sym()
    allowed = {id(i) for i in cuttable}
    out, seen, stack = set(), set(), list(spec.views.roots)
    while stack:
        inst = stack.pop()
        if id(inst) in seen or inst.leaf:
            continue
        seen.add(id(inst))
        if inst.op != "matmul":
            stack.extend(inst.inputs)
            continue
        for operand, other in zip(inst.inputs, (inst.view[-1], inst.view[-2])):
            if id(operand) in allowed and computes(operand):
                lab = unit_label(other, table)
                passes = _passes(lab, spec, env, target, dynamic)
                if passes > 1 and target.recompute_weight * (passes - 1) \
                        * recompute_seconds(operand, spec.views, env, target) \
                        > round_trip_seconds(operand, spec.views, env, target):
                    out.add(_smallest_in_chain(operand, allowed, env).node.id)
                    continue
                inner = [i for i in _outer_matmuls(operand) if long(i.reduced) and id(i) in allowed]
                out |= {i.node.id for i in inner}
                seen |= {id(i) for i in inner}
            stack.append(operand)
    return out


def _passes(lab, spec, env: dict, target, dynamic) -> int:
    """How many times the programs along the other side's grid dim `lab` compute the
    operand over: once per OTHER_TILE of it, or once where the tile enumeration offers
    it whole (the output's last dim, static and up to `target.hold_matmul`: a head dim)."""
    if lab is None or lab.id not in {r.id for r in spec.root_labels}:
        return 1
    n = D.evaluate(lab.extent, env)
    static = not any(s.name in dynamic for s in lab.extent.free_symbols)
    if lab.id == spec.root_labels[-1].id and static and n <= target.hold_matmul:
        return 1
    return math.ceil(n / OTHER_TILE)


def _smallest_in_chain(inst: Instance, allowed: set, env: dict) -> Instance:
    """The value to store for an operand: the one of fewest bytes along its chain of
    re-indexing ops and casts (GQA's keys before repeat_kv's expand, not one copy per
    query head); of equal sizes the outermost, whose layout the consumer reads."""
    best, size = inst, _bytes(inst, env)
    while not inst.leaf and inst.op in REINDEX and not inst.inputs[0].leaf:
        inst = inst.inputs[0]
        if id(inst) in allowed and _bytes(inst, env) < size:
            best, size = inst, _bytes(inst, env)
    return best


def _bytes(inst: Instance, env: dict) -> int:
    return math.prod(D.evaluate(d, env) for d in inst.node.shape) * inst.node.dtype.itemsize


def _outer_matmuls(inst: Instance) -> list[Instance]:
    """The MatMuls an instance computes that no other MatMul below it contains."""
    found, seen, stack = [], set(), [inst]
    while stack:
        i = stack.pop()
        if id(i) in seen or i.leaf:
            continue
        seen.add(id(i))
        if i.op == "matmul" and i is not inst:
            found.append(i)
            continue
        stack.extend(i.inputs)
    return found


def computes(inst: Instance) -> bool:
    """Whether an instance does arithmetic below its layout ops (not only loads)."""
    if inst.leaf or inst.op in NOT_COMPUTED:
        return False
    return inst.op not in LAYOUT or any(computes(i) for i in inst.inputs)


def _elems(labels, views, env) -> int:
    return math.prod(D.evaluate(views.labels[i].extent, env) for i in labels)


def recompute_seconds(operand: Instance, views, env: dict, target) -> float:
    """One more computation of the whole operand: its loads' bytes from L2, its
    element-wise and reduction work on the vector units, its MatMuls' on tensor cores."""
    loaded, work, mma, seen, stack = 0.0, 0.0, 0.0, set(), [operand]
    while stack:
        inst = stack.pop()
        if id(inst) in seen:
            continue
        seen.add(id(inst))
        if inst.leaf:
            loaded += _elems(inst.labels, views, env) * inst.node.dtype.itemsize
            continue
        if inst.op == "matmul":
            mma += 2 * _elems(inst.labels | {inst.reduced.id}, views, env)
        elif inst.op not in LAYOUT + NOT_COMPUTED:
            reduced = {inst.reduced.id} if inst.reduced is not None else set()
            work += _elems(inst.labels | reduced, views, env)
        stack.extend(inst.inputs)
    return loaded / target.l2_bandwidth + work / target.vector_flops + mma / target.matmul_flops


def round_trip_seconds(operand: Instance, views, env: dict, target) -> float:
    """Storing the operand once and reading it back, in its own dtype, plus a launch."""
    return 2 * _elems(operand.labels, views, env) * operand.node.dtype.itemsize / target.bandwidth \
        + target.launch_overhead
