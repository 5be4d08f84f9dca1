"""A split's combine run by its partial kernel: one launch instead of two.

A Split bound above 1 makes a partial kernel, whose grid includes the chunks, and a
combine kernel that reduces the partials over them (partition.py). Launched apart, the
combine waits for the whole partial grid to drain, and the second launch costs its own
gap: at decode sizes these were 15 us of an 80 us step (GQA decode at b=8 on the H200,
RESULTS.md session 12).

Fused, the programs of the partial kernel that write one tile of the combine's inputs
form a group. Each program stores its partials, then counts its arrival in the group's
slot of an int32 buffer (`tl.atomic_add`, acquire-release at GPU scope, after a barrier
that orders every warp's stores before it). The program that arrives last runs the
combine over the group's tiles, reading the partials past L1 (`.cg`: another program on
its SM may have cached a neighbouring group's line before it was written), and puts the
slot back to 0 for the next launch. The result does not depend on the order of arrival:
the combine reads every chunk, in order, as the combine kernel did.

The partial tile must hold a whole number of combine tiles along every label they share,
and the combine may read a partial only within its own tile, or across the chunks
(`tile_map`); otherwise the two kernels stay apart.
"""
from __future__ import annotations

import math

from cleave.ir import dims as D

from .codegen import Emitter, module
from .cost import kernel_time, registers
from .exprs import evaluate
from .partition import KernelSpec, buffer_name
from .plan import Kernel
from .tiles import Tiling, is_full


def tile_map(p: KernelSpec, pt: Tiling, c: KernelSpec, ct: Tiling) -> dict | None:
    """{combine grid label: (partial label, combine tiles per partial tile, whether they
    start at the partial tile's own start: False where each partial program holds the
    label whole)} when the combine can run in the partial kernel, else None. Both specs
    as emitted (labels fused)."""
    written = {st.buffer: st.view for st in p.stores}
    p_syms, c_syms = p.views.by_sym(), c.views.by_sym()
    p_grid, c_grid = {lab.id for lab in p.root_labels}, {lab.id for lab in c.root_labels}
    pair, across = {}, set()
    for inst in c.views.memo.values():
        name = buffer_name(c.views.graph, inst.node) if inst.leaf else None
        if name not in written:
            continue
        for pe, ce in zip(written[name], inst.view):
            if pe == 0 and ce == 0:
                continue
            plab, clab = p_syms.get(pe), c_syms.get(ce)
            if plab is None or clab is None or not (plab.id in p_grid or is_full(pt, plab.id)):
                return None  # a partial read at an offset, or through an expression
            if clab.id in c_grid:
                if pair.setdefault(clab.id, plab.id) != plab.id:
                    return None
            elif plab.id in p_grid:
                across.add(plab.id)  # reduced over by the combine (a loop or a whole tile)
    chunks = p.views.graph.split_counts()
    if not across or any(not (p.views.labels[pl].extent.free_symbols & chunks) for pl in across):
        return None  # only a split's combine: the partial grid's chunks, read across
    if set(pair) != c_grid or len(set(pair.values())) != len(pair) or set(pair.values()) & across:
        return None
    out = {}
    for cl, pl in pair.items():
        rc, rp = ct.rows(cl), pt.rows(pl)
        if pl in p_grid and rp % rc == 0:
            out[cl] = (pl, rp // rc, True)
        elif is_full(pt, pl):  # every partial program holds it whole: the combine's tiles from 0
            out[cl] = (pl, -(-pt.block[pl] // rc), False)
        else:
            return None
    return out


def arrivals_name(graph) -> str:
    """The counter buffer's name: one no graph buffer has."""
    taken = {buffer_name(graph, n) for n in graph.live_nodes()} | set(graph.inputs)
    name = "arrivals"
    while name in taken:
        name += "_"
    return name


def fuse(p: KernelSpec, pt: Tiling, pk: Kernel, c: KernelSpec, ct: Tiling, ck: Kernel, facts, env, dynamic,
         symbols, target, c_stats=None, limit: float | None = None, p_stats=None) -> Kernel | None:
    """The partial kernel `pk` running the combine `ck` in its last program of each group,
    or None where the tilings do not allow it (`tile_map`), the combine cannot be called
    for given tiles, or its serialized tail (with `c_stats`, the combine's per-program
    work) would cost `limit` seconds or more."""
    tiles = tile_map(p, pt, c, ct)
    if tiles is None:
        return None
    paired = {pl for pl, _, aligned in tiles.values() if aligned}
    p_order = [lab.id for lab in p.root_labels]
    if c_stats is not None and limit is not None:  # before any code is emitted: most options stop here
        groups_here = math.prod(-(-D.evaluate(p.views.labels[pl].extent, env) // pt.rows(pl)) for pl in paired)
        tail = serial_tail(c_stats, evaluate(ck.grid[0], env), groups_here, pk.num_warps, ck.num_stages, target,
                           p_stats)
        if tail is None or tail >= limit:
            return None
    cem = Emitter(c, ct, facts, env, dynamic)  # no TMA: the combine reads a few small tiles
    if cem.one_tile_at_least:  # it writes where the partial kernel may have no program
        return None
    cem.uncached = {st.buffer for st in p.stores}
    cname = f"{pk.name}_combine"
    cfn = cem.function(cname, symbols, dynamic, tile_args=True)
    pem = Emitter(p, pt, facts, env, dynamic, target=target)
    arrivals = arrivals_name(p.views.graph)
    group, stride = [], []
    for pl in p_order:
        if pl in paired:
            group.append(f"tid{pl}" + "".join(f" * {s}" for s in stride))
            stride.append(pem.grid_tiles(pl))
    groups = " * ".join(stride) or "1"
    chunks = " * ".join(pem.grid_tiles(pl) for pl in p_order if pl not in paired) or "1"
    epilogue = [
        "# the last program of this group to arrive combines its partials",
        "tl.debug_barrier()  # every warp's partial stores are made before the arrival",
        f"arrived = tl.atomic_add({arrivals}_ptr + {' + '.join(group) or '0'}, 1, sem=\"acq_rel\", scope=\"gpu\")",
        f"if arrived == {chunks} - 1:",
        f"    tl.store({arrivals}_ptr + {' + '.join(group) or '0'}, 0)  # ready for the next launch",
    ]
    indent, guards, args = "    ", [], {}
    for cl in c.root_labels:
        pl, k, aligned = tiles[cl.id]
        if k == 1:
            args[cl.id] = f"tid{pl}" if aligned else "0"
            continue
        start = f"tid{pl} * {k} + " if aligned else ""
        epilogue.append(f"{indent}for sub{cl.id} in range({k}):")
        indent += "    "
        epilogue.append(f"{indent}ctid{cl.id} = {start}sub{cl.id}")
        args[cl.id] = f"ctid{cl.id}"
        guards.append(f"ctid{cl.id} < {cem.grid_tiles(cl.id)}")
    if guards:
        epilogue.append(f"{indent}if {' and '.join(f'({g})' for g in guards)}:")
        indent += "    "
    call = [f"{b}_ptr" for b in cfn.bufs] + list(symbols) + [args[lab.id] for lab in c.root_labels]
    epilogue.append(f"{indent}{cname}({', '.join(call)})")
    pfn = pem.function(pk.name, symbols, dynamic, extra_bufs=tuple(cfn.bufs) + (arrivals,), epilogue=epilogue)
    if pem.persistent != (pk.programs_per_sm > 0) or pfn.grid != pk.grid:
        return None  # emitted otherwise than the kernel it stands for
    args_out = pfn.bufs + [d[0] for d in pem.descriptor_args()] + list(symbols)
    limits = [x for x in (pk.max_pipelined_warps, ck.max_pipelined_warps) if x]
    return Kernel(pk.name, module([cfn, pfn]), pfn.grid, args_out, pk.num_warps, pk.num_stages,
                  pem.descriptor_args(), pk.programs_per_sm, loops=pk.loops,
                  max_pipelined_warps=min(limits) if limits else 0, arrivals=[arrivals, groups],
                  pipelined=pk.pipelined, stage_choices=pk.stage_choices)


def serial_tail(stats, programs: int, groups: int, warps: int, stages: int, target, p_stats=None) -> float | None:
    """Seconds the last program of a group adds to the partial kernel by running the
    group's combine tiles one after another (each a program's work, with its latency),
    or None where the combine's tile does not fit at the partial kernel's warp count.
    On the H200, 4 combine tiles of 17 to 66 chunks each added 6 us to GQA decode's
    partial kernel (b = 8 and 1; RESULTS.md, 2026-12-02 session 13), and 32 of 264
    chunks 0.55 ms to MQA's: the cost model fuses only where this is under the
    combine kernel's own time. A combine whose registers and the partial kernel's
    (`p_stats`) together pass the 255 a thread has: None. Triton allocates a kernel's
    registers for its largest need, and does not always reuse the partial's for the
    combine: GQA decode at 8 warps (224 estimated for each part) ran 19 us slower fused,
    same run."""
    one = kernel_time(stats, 1, warps, stages, target)
    if one is None or (p_stats is not None and registers(stats, warps) + registers(p_stats, warps) - 32 > 255):
        return None
    return -(-programs // max(groups, 1)) * (one - target.launch_overhead)


def fuse_combines(options: list, facts, env, dynamic, symbols, target) -> tuple[list, list]:
    """options: per kernel in launch order, its options as `api._kernel_options` gives
    them, the chosen one first. Each partial kernel is fused with the combine that
    follows it where the model finds it faster (`serial_tail`), in the first of the
    combine's options whose tiles fit the partial's at the partial's warp count.
    Returns the option each kernel now takes, and the kernels to launch."""
    chosen, out, i = [opts[0] for opts in options], [], 0
    while i < len(options):
        _, kernel, _, (spec, t), p_stats = chosen[i]
        found = None
        if i + 1 < len(options):
            limit = chosen[i + 1][0]
            found = next(((fused, option) for option in options[i + 1]
                          if option[1].num_warps == kernel.num_warps
                          and (fused := fuse(spec, t, kernel, *option[3], option[1], facts, env, dynamic, symbols,
                                             target, option[4], limit, p_stats)) is not None), None)
        if found is None:
            out.append(kernel)
            i += 1
            continue
        out.append(found[0])
        chosen[i + 1] = found[1]
        i += 2
    return chosen, out
