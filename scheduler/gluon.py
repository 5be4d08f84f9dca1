"""Gluon back end: a loop that chains two MatMuls (attention) as a warp-specialised
Hopper kernel with ping-pong between consumer warpgroups.

Triton's `tl` path issues no producer warps and no turn-taking between warpgroups; on
an H100 a hand-written Gluon kernel that does (benchmarks/gluon_attention.py, `pp2`)
ran causal attention at 0.95x cuDNN where the `tl` kernels run 0.82-0.85x (RESULTS.md,
session 40). This module renders the scheduler's own nest in that form: the row-halves
option (row_halves.py: two 64-row tiles per program sharing each K and V tile) with
one consumer warpgroup per row tile and a loader warpgroup streaming K and V through
TMA into rings of shared-memory stages. Each step a consumer, on its turn, issues the
next tile's S = q·Kᵀ and this tile's P·V, hands the turn over, and runs the next
tile's softmax while the other warpgroup's MMAs run.

Only the schedule is fixed here. What a step computes between the two MatMuls (masks,
score modifiers, the online softmax's rescaling), what the program computes before
the loop (q's prologue) and after it (the epilogue and its stores), and which tiles a
program runs (bounds.py, the union of its two row tiles' ranges: each masks its own)
are rendered by the Emitter from the instances, as for the `tl` kernel; tensors made
from nothing get the layout of the wgmma accumulator their labels index (`arange`,
`filled`, `scalar`). A nest this does not render (another loop, a gathered or
transposed operand, widths that differ) gets no Gluon variant: `variant` returns None
and says why in `last_refusal`.

The runtime serves a Gluon kernel only on an sm_90 GPU whose Triton has Gluon, and
only after its output matched the `tl` plan's at the exact launch configuration
(runtime/operator.py); everywhere else, the interpreter included, the `tl` kernels
serve.
"""
from __future__ import annotations

import contextlib
import dataclasses

from cleave.ir import ShapeError

from .bounds import segments
from .codegen import (COMBINE, NEUTRAL, ROUND_BF16, SCALED_REDUCE, Block, Emitter, Val, _acc_kind, convert,
                      math_helpers, step_dots)
from .fexpr import Y_NEW, Y_OLD, fcode
from .loop_bounds import Search, render
from .partition import KernelSpec, buffer_name
from .plan import Kernel
from .row_halves import _side_by_side, chained_rows
from .tile_order import descending
from .tiles import Tiling
from .tma import tile_load

ROWS = 64  # rows of a consumer warpgroup's tile: a wgmma's M at 4 warps
CONSUMERS, CONSUMER_WARPS = 2, 4  # warpgroups; the first is the kernel's own warps
STAGES = 2  # K and V tiles in flight per ring
CONSUMER_REGS = 240  # registers a consumer thread may hold (the loader gives its own back)
LOADER_WARPS, LOADER_REGS = 4, 24
WIDTHS = (64, 128)  # the output's width
KEYS = 128  # keys a step: wgmma instructions as wide as the output's width tile S = q·Kᵀ too
LOW_TYPES = {"tl.bfloat16": "gl.bfloat16", "tl.float16": "gl.float16"}

last_refusal: str | None = None  # why the last `variant` call returned None


class Ineligible(Exception):
    """The nest is not one this back end renders."""


@dataclasses.dataclass
class Step:
    """The loop that the schedule is built around: label x, whose steps compute
    S = q·Kᵀ (qk) and accumulate P·V (pv), with the row and width labels."""
    x: int
    row: int
    width: int
    depth: int  # q·Kᵀ's contraction label
    qk: object
    pv: object
    k_load: object
    v_load: object


def variant(spec: KernelSpec, t: Tiling, facts: dict, env: dict, dynamic: set, symbols: list,
            tl_kernel: Kernel) -> Kernel | None:
    """The Gluon form of kernel `spec` (any of its tilings `t`), taking the launch arguments
    of its `tl` kernel `tl_kernel` (so that either may stand in a plan for the other), or None."""
    global last_refusal
    try:
        kernel = _variant(spec, t, facts, env, dynamic, symbols, tl_kernel)
        last_refusal = None
        return kernel
    except Ineligible as why:
        last_refusal = f"{spec.name}: {why}"
        return None
    except (ShapeError, ValueError, KeyError) as why:  # the Emitter's own refusal, or a case missed here
        last_refusal = f"{spec.name}: {type(why).__name__}: {why}"
        return None


def _variant(spec, t, facts, env, dynamic, symbols, tl_kernel) -> Kernel:
    from .api import fuse_labels  # api imports this module

    rows = chained_rows(spec.views, t)
    if len(rows) != 1 or any(i.op == "split" for i in spec.views.memo.values()):
        raise Ineligible("not one row label whose loop chains two MatMuls")
    row = rows.pop()
    loops = {lid for lid, role in t.role.items() if role == "loop"}
    role, block = dict(t.role), dict(t.block)
    block[row] = ROWS
    halves = _side_by_side(spec, Tiling(role, block, static=dict(t.static), step=dict(t.step)), row)
    if halves is None:
        raise Ineligible("the row tiles do not pair")
    paired, th = halves
    paired = fuse_labels(paired, th)
    first = GluonEmitter(paired, th, facts, env, dynamic, 0)
    width = first.step.width
    if th.static.get(width) not in WIDTHS:
        raise Ineligible(f"output width {th.static.get(width)} (Gluon: {WIDTHS})")
    for lid in loops:  # a head dim of 64 steps 128 keys too: 64-key steps halve each wgmma (GPT-2)
        th.block[lid] = KEYS
    wgs = [GluonEmitter(paired, th, facts, env, dynamic, w) for w in range(CONSUMERS)]
    return _assemble(spec.name, wgs, symbols, tl_kernel)


class GluonEmitter(Emitter):
    """The Emitter for one consumer warpgroup: its row tile's stores (the row-halves
    kernel's first or second half), the loop rendered as the ping-pong schedule."""

    def __init__(self, spec: KernelSpec, t: Tiling, facts, env, dynamic, wg: int):
        super().__init__(spec, t, facts, env, dynamic, target=None)  # pointer loads: the rings are TMA's
        self.wg = wg
        half = len(spec.stores) // CONSUMERS
        self.stores = spec.stores[wg * half:(wg + 1) * half]
        self.mine = _reachable(st.inst for st in self.stores)
        self.step = self._find_step()
        self.range_lines: list[str] = []  # the loop's bounds, for the loader
        self.boxes: dict = {}  # id(K or V load) -> its TMA box (tma.TileLoad)
        self.io = False  # rendering a load or store through the coalesced layout (io_tile)
        self.io_names: set = set()

    # -- what the nest must be ---------------------------------------------
    def _find_step(self) -> Step:
        mine = [a for a in self.accs if id(a) in self.mine]
        labels = {a.reduced.id for a in mine}
        if len(labels) != 1:
            raise Ineligible(f"{len(labels)} loop labels (Gluon: one)")
        x = labels.pop()
        pv = [a for a in mine if a.op == "matmul"]
        if len(pv) != 1 or any(a.node.dtype.is_int for a in mine):
            raise Ineligible("not one MatMul accumulated in the loop, beside float accumulators")
        pv = pv[0]
        loop = next(lp for lps in self.nest.loops.values() for lp in lps if pv in lp.accs)
        if loop.chain:
            raise Ineligible("the loop is nested in another")
        qk = [d for d in step_dots(loop, self.t) if id(d) in self.mine]
        if len(qk) != 1:
            raise Ineligible(f"{len(qk)} MatMuls computed whole per step (Gluon: one)")
        qk = qk[0]
        row_dims, pv_dims = self.dims(qk.labels), self.dims(pv.labels)
        if len(row_dims) != 2 or row_dims[1] != x or len(pv_dims) != 2 or pv_dims[0] != row_dims[0]:
            raise Ineligible(f"tiles {row_dims} and {pv_dims} are not [rows, keys] and [rows, width]")
        row, width, depth = row_dims[0], pv_dims[1], qk.reduced.id
        if self.t.role[width] == "loop" or self.t.block[width] != self.t.static.get(width):
            raise Ineligible("the output's width is not one whole tile")
        k_load, v_load = _through_views(qk.inputs[1]), _through_views(pv.inputs[1])
        for inst, dims in ((k_load, (x, depth)), (v_load, (x, width))):
            if inst.op != "load" or not inst.node.dtype.is_float or set(self.dims(inst.labels)) != set(dims):
                raise Ineligible(f"%{inst.node.id} ({inst.op} over {self.dims(inst.labels)}) is not a load of a "
                                 f"[keys, width] tile")
        types = {self.buffer_dtype(inst.node) for inst in (k_load, v_load)}
        if len(types) != 1 or not types <= set(LOW_TYPES):
            raise Ineligible(f"K and V are {sorted(types)} (Gluon: both bf16 or both fp16)")
        return Step(x, row, width, depth, qk, pv, k_load, v_load)

    # -- layouts: a tensor made from nothing takes its labels' layout ---------
    def layout(self, dims) -> str:
        s = self.step
        dims = tuple(dims)
        if self.io:  # a tile read or written once per program: coalesced (`io_tile`)
            if len(dims) == 2:
                return "IO"
            return f"gl.SliceLayout({1 if dims == (s.row,) else 0}, IO)"
        if len(dims) == 2 and dims[0] == s.row and dims[1] in (s.x, s.width, s.depth):
            return "MMA"
        if dims == (s.row,):
            return "ROWS"
        if len(dims) == 1 and dims[0] in (s.x, s.width, s.depth):
            return "COLS"
        raise Ineligible(f"a tensor over labels {dims} has no layout here")

    def idx(self, lid: int, dims) -> str:
        out = super().idx(lid, dims)
        if not self.io or lid not in dims or not out.startswith(f"idx{lid}"):
            return out
        name = f"idx{lid}_io"
        if name not in self.io_names:  # the label's lanes in the coalesced layout, once per program
            self.io_names.add(name)
            axis = 1 if lid == self.step.row else 0
            self.top.lines.append(f"{name} = gl.convert_layout(idx{lid}, gl.SliceLayout({axis}, IO))")
        return name + out[len(f"idx{lid}"):]

    def load(self, b: Block, inst, dims) -> Val:
        if b.chain or len(dims) != 2:
            return super().load(b, inst, dims)
        if self.io:  # q's prologue computes in the coalesced layout (_q_operand)
            return super().load(b, inst, dims)
        with self.io_tile():
            v = super().load(b, inst, dims)
        return self.var(b, f"gl.convert_layout({v.name}, {self.layout(dims)})", v.dims, v.ty)

    def store(self, b: Block, st, v: Val):
        dims = self.dims(self.views.labels_of(st.view))
        if len(dims) != 2 or v.dims != tuple(dims):
            return super().store(b, st, v)
        with self.io_tile():
            out = self.var(b, f"gl.convert_layout({convert(v.name, self.buffer_dtype(st.node))}, IO)", v.dims,
                           self.buffer_dtype(st.node))
            super().store(b, st, out)

    @contextlib.contextmanager
    def io_tile(self):
        """A tile loaded before the loop or stored after it, through the coalesced layout
        IO (16 bytes a thread) instead of the wgmma accumulator's (4): a program's q tile
        and its output. On an H100 it took causal attention from 0.905x cuDNN to 0.959x
        and full attention from 0.937x to 0.981x (RESULTS.md, session 41)."""
        before, self.io = self.io, True
        try:
            yield
        finally:
            self.io = before

    def arange(self, lid: int) -> str:
        return f"gl.arange(0, {self.t.block[lid]}, layout={self.layout((lid,))})"

    def filled(self, dims, value: str, ty: str) -> str:
        return f"gl.full({[self.t.block[d] for d in dims]}, {value}, {ty}, layout={self.layout(dims)})"

    def scalar(self, value: str, ty: str) -> str:
        return f"gl.to_tensor({value}).to({ty})"

    def relayout(self, name: str, dims) -> list[str]:  # a half swap's reshapes leave a linear layout
        return [f"{name} = gl.convert_layout({name}, {self.layout(dims)})"]

    # -- the loop ------------------------------------------------------------
    def value(self, block: Block, inst) -> Val:
        s = self.step
        if inst is s.qk and block.chain:  # S of the step: the skeleton's wgmma result
            v = Val("s_tile", self.dims(inst.labels), "tl.float32")
            if id(inst) in self.scaled:
                v.scale = self.scale_factor(self.scaled[id(inst)][2])
            block.cache[id(inst)] = v
            return v
        return super().value(block, inst)

    def emit_loop(self, h: Block, loop):
        s = self.step
        if loop.label != s.x or s.pv not in loop.accs:
            raise Ineligible(f"a second loop (over X{loop.label})")
        self.emitting.add(loop)
        x, bx = s.x, self.t.block[s.x]
        mine = [a for a in loop.accs if id(a) in self.mine]
        accs = {}
        for a in mine:
            dims = self.dims(a.labels)
            kind = _acc_kind(a)
            init = self.filled(dims, "0.0" if kind == "sum" else NEUTRAL[kind], "tl.float32")
            accs[id(a)] = self.var(h, init, dims, "tl.float32", prefix="acc")
        # Both warpgroups run every tile either one's rows need: their union (the row-halves
        # kernel's bounds), each masking its own. Tiles of the segment on which every mask
        # holds for both (bounds.py) run a step rendered without the masks.
        trips = -(-self.eval_extent(self.labels[x].extent) // bx)
        segs = segments(self, h, x, loop.accs, trips)
        if self.windows:
            raise Ineligible("a split's relative chunk")
        defs = [d for seg in segs for d in seg.defs]
        if any(isinstance(b, Search) for _, b in defs) or any(seg.loaded for seg in segs):
            raise Ineligible("loop bounds loaded or searched per program")
        self.range_lines = [f"{sym} = {render(b)}" for sym, b in defs] + \
            [f"lo{x} = {render(segs[0].lo)}", f"hi{x} = {render(segs[-1].hi)}",
             # int32 steps: a ring's stage index is one
             f"n{x} = ((tl.maximum(hi{x} - lo{x}, 0) + {bx - 1}) // {bx}).to(tl.int32)"]
        h.lines += self.range_lines
        q = self._q_operand(h)
        k_tile = self._ring_operand(s.k_load, (s.depth, x))  # B of S = q·Kᵀ: [depth, keys]
        v_tile = self._ring_operand(s.v_load, (x, s.width))  # B of P·V: [keys, width]
        masked = self._step(h, loop, mine, accs, trips, {}, None)
        whole = [seg for seg in segs if seg.keep or seg.full]
        runs = [(f"n{x} - 1", masked)]
        if len(whole) == 1:
            runs = self._whole_tiles(h, x, bx, whole[0], whole[0] is segs[0], masked,
                                     self._step(h, loop, mine, accs, trips, whole[0].keep,
                                                x if whole[0].full else None))
        h.lines += ["q_smem.store(" + q + ")", "fence_async_shared()"] + \
            _ping_pong(x, bx, self.wg, masked, runs, accs[id(s.pv)].name, k_tile, v_tile)
        for a in mine:
            h.cache[id(a)] = accs[id(a)]
        self.emitting.discard(loop)

    def _step(self, h: Block, loop, mine: list, accs: dict, trips: int, keep: dict, whole: int | None) -> tuple:
        """One step's softmax (lines ending with P's operand in `p_tile`) and the output's
        rescale, rendered with the masks `keep` leaves out (tiles of a segment on which
        they hold) and without the extent's mask where `whole` is the loop label."""
        s, x = self.step, self.step.x
        body = Block(h, (x,), trips=trips)
        self.keep, self.whole = keep, whole
        body.lines.append(f"idx{x} = start{x} + {self.arange(x)}")
        alphas = self._softmax_step(body, loop, mine, accs)
        p = self.ensure(body, s.pv.inputs[0])
        valid = self.valid(x, p.dims)
        if valid:  # a padded key's P is 0: its V row is TMA's zero fill, and inf * 0 is not 0
            p = self.var(body, f"tl.where({valid}, {p.name}, 0.0).to({p.ty})", p.dims, p.ty)
        if p.dims != (s.row, x):
            raise Ineligible("P is not a [rows, keys] tile")
        body.lines.append(f"p_tile = {self.operand(p, s.pv.node.inputs[0], (s.row, x), True)}")
        o = accs[id(s.pv)]
        scale = [alphas[c] for c in loop.scaled[s.pv]]
        rescale = [f"{o.name} = {o.name} * " + " * ".join(self.align(a, o.dims) for a in scale)] if scale else []
        self.keep, self.whole = {}, None
        return body.lines, rescale

    def _whole_tiles(self, h: Block, x: int, bx: int, seg, leading: bool, masked: tuple, whole: tuple) -> list:
        """The steady steps as runs of (end step, step rendering): the tiles of segment
        `seg` run `whole`, the rest `masked`. Step j scores tile j + 1; tile 0 (the first
        step, before the loop) is scored masked. The segment's first tile is rounded up
        and its end down, so that a tile partly outside it keeps its masks."""
        first = "1" if leading else \
            f"tl.minimum(tl.maximum((tl.maximum({render(seg.lo)} - lo{x}, 0) + {bx - 1}) // {bx}, 1), n{x}).to(tl.int32)"
        h.lines += [f"whole_lo{x} = {first}",  # int32 steps (the bounds are int64 where a dim is dynamic)
                    f"whole_hi{x} = tl.minimum(tl.maximum(tl.maximum({render(seg.hi)} - lo{x}, 0) // {bx}, "
                    f"whole_lo{x}), n{x}).to(tl.int32)"]
        runs = [] if leading else [(f"whole_lo{x} - 1", masked)]
        return runs + [(f"whole_hi{x} - 1", whole), (f"n{x} - 1", masked)]

    def _ring_operand(self, inst, order: tuple) -> str:
        """The MMA operand that a ring stage holds of the tile `inst` loads, in `order`
        ([K, N] of the wgmma), as a format string of the stage; the TMA box it is loaded as
        is kept for the loader (`self.boxes`)."""
        tile = tile_load(self, inst, self.dims(inst.labels), 2)
        if tile is None:
            raise Ineligible(f"{_buffer(self, inst)} is not one TMA box of rows at tile offsets")
        self.boxes[id(inst)] = tile
        ring = "k_ring" if inst is self.step.k_load else "v_ring"
        if tuple(tile.order) == order:
            return f"ring_tile({ring}, {{stage}})"
        if tuple(tile.order) == order[::-1]:
            return f"ring_tile({ring}, {{stage}}).permute((1, 0))"
        raise Ineligible(f"{_buffer(self, inst)}'s box is not a [{order}] tile")

    def _q_operand(self, h: Block) -> str:
        """q·Kᵀ's left operand (q with its prologue), computed once, as the wgmma reads it.
        The prologue computes in the coalesced layout its loads come in, and its result
        goes to shared memory from there: no layout conversion per operand (RoPE's cos and
        sin, q itself). Tensors it cached are forgotten after it, so that the loop computes
        its own in the MMA layouts."""
        s = self.step
        src = self.scaled[id(s.qk)][1] if id(s.qk) in self.scaled else s.qk.inputs[0]
        blocks = list(_outward(h))
        before = [set(b.cache) for b in blocks]
        with self.io_tile():
            q = self.ensure(h, src)
            if q.dims != (s.row, s.depth):
                raise Ineligible("q is not a [rows, depth] tile")
            if self.dot_type(q, s.qk.node.inputs[0]) != self.buffer_dtype(s.k_load.node):
                raise Ineligible("q and K differ in type")
            operand = self.operand(q, s.qk.node.inputs[0], (s.row, s.depth), True)
        for b, keys in zip(blocks, before):
            for key in set(b.cache) - keys:
                if b.cache[key].dims:
                    del b.cache[key]
        return operand

    def swap_source(self, base: Val) -> str:
        # tl.split needs two lanes a thread along the halves' axis: the MMA layout has them
        return f"gl.convert_layout({base.name}, MMA)" if self.io and len(base.dims) == 2 else base.name

    def _softmax_step(self, body: Block, loop, mine: list, accs: dict) -> dict:
        """A step's updates of the accumulators other than P·V (Emitter.loop_body's, each
        reduced within its tile): returns each factor's rescale."""
        alphas = {}
        for a in mine:
            if a is self.step.pv:
                continue
            acc = accs[id(a)]
            scale = [alphas[c] for c in loop.scaled[a]]
            if scale:
                body.lines.append(f"{acc.name} = {acc.name} * " + " * ".join(self.align(v, acc.dims) for v in scale))
            kind = a.node.attrs["op"]
            x = self.value(body, a.inputs[0])
            x = x if kind in SCALED_REDUCE else self.unscaled(body, x)
            part = self.partial_reduce(body, a, x)
            if a not in loop.factors:
                body.lines.append(f"{acc.name} = " + COMBINE[kind].format(a=acc.name, b=self.align(part, acc.dims)))
                continue
            old = self.var(body, acc.name, acc.dims, acc.ty, prefix="old")
            body.lines.append(f"{acc.name} = " + COMBINE[kind].format(a=acc.name, b=self.align(part, acc.dims)))
            if a in loop.rescale:
                r = fcode(loop.rescale[a], {Y_OLD: old.name, Y_NEW: acc.name})
                alphas[a] = self.var(body, f"tl.where({old.name} == {acc.name}, 1.0, {r})", acc.dims, "tl.float32",
                                     prefix="alpha")
            if kind in ("max", "min"):  # as Emitter.loop_body: an empty prefix reads as 0
                neutral = "-" if kind == "max" else ""
                body.cache[id(a)] = self.var(body, f"tl.where({acc.name} == float(\"{neutral}inf\"), 0.0, {acc.name})",
                                             acc.dims, "tl.float32", prefix="run")
            else:
                body.cache[id(a)] = acc
        return alphas

    # -- the consumer's function ----------------------------------------------
    def consumer(self, name: str, params: list) -> tuple[list[str], list[str]]:
        """This warpgroup's function, and the program decode (lines) the loader repeats."""
        top = self.top = Block(None, ())
        top.lines += self.full_lanes()
        for st in self.stores:
            self.store(top, st, self.ensure(top, st.inst))
        order, tiles, grouped = self.grid_order()
        pid = "gl.program_id(0).to(tl.int64)" if self.wide() else "gl.program_id(0)"
        decode = [f"pid = {pid}"] + self.decode(order, tiles, grouped, descending(self.stats.loops))
        lines = decode + top.lines
        text = "\n".join(lines)
        for made in ("tl.arange(", "tl.full(", "tl.zeros(", "tl.broadcast_to(", "tl.dot(", ".load(["):
            if made in text:
                raise Ineligible(f"the consumer's code makes a tensor without a layout ({made})")
        fn = [f"@gluon.jit", f"def {name}_wg{self.wg}({', '.join(params)}):"] + ["    " + ln for ln in lines]
        return fn, [ln for ln in decode if not ln.startswith("idx")]



def _ping_pong(x: int, bx: int, wg: int, first: tuple, runs: list, o: str, k_tile: str, v_tile: str) -> list[str]:
    """A consumer's loop over the n<x> tiles from lo<x>, as FlashAttention-3 schedules it:
    the first tile's S and softmax; then each step, on this warpgroup's turn, the next
    tile's S and this tile's P·V issued together, the turn handed over, the next
    softmax run while the other warpgroup's MMAs run, P·V awaited and the output
    rescaled; then the last tile's P·V. The loader fills the K and V rings. `first` is
    the first tile's step rendering ((softmax lines, rescale lines)); the steady steps run
    in `runs` of (end step, rendering), each from where the last ended."""
    lines = [f"s_zero = gl.zeros([{ROWS}, {bx}], gl.float32, layout=MMA)",
             f"turn_phase = {1 - wg}",  # warpgroup 0 first: a fresh barrier's previous phase is done
             f"if n{x} > 0:"]
    score, rescale = first
    head = ["mbarrier.wait(k_ready.index(0), 0)",
            f"s_tok = warpgroup_mma(q_smem, {k_tile.format(stage='0')}, s_zero, use_acc=False, is_async=True)",
            "s_tile = warpgroup_mma_wait(0, deps=(s_tok,))",
            "mbarrier.arrive(k_empty.index(0), count=1)",
            f"start{x} = lo{x}"] + score + rescale
    lines += ["    " + ln for ln in head]
    begin = "0"
    for end, (score, rescale) in runs:
        steady = [f"stage = j{x} % {STAGES}", f"nxt = (j{x} + 1) % {STAGES}",
                  "p_op = gl.convert_layout(p_tile, P_OPERAND)",
                  f"mbarrier.wait(k_ready.index(nxt), ((j{x} + 1) // {STAGES}) & 1)",
                  f"mbarrier.wait(v_ready.index(stage), (j{x} // {STAGES}) & 1)",
                  "mbarrier.wait(my_turn, turn_phase)",
                  "turn_phase ^= 1",
                  f"s_tok = warpgroup_mma(q_smem, {k_tile.format(stage='nxt')}, s_zero, use_acc=False, is_async=True)",
                  f"o_tok = warpgroup_mma(p_op, {v_tile.format(stage='stage')}, {o}, is_async=True)",
                  "mbarrier.arrive(other_turn, count=1)",
                  "s_tile = warpgroup_mma_wait(1, deps=(s_tok,))",
                  "mbarrier.arrive(k_empty.index(nxt), count=1)",
                  f"start{x} = lo{x} + (j{x} + 1) * {bx}"] + score + \
                 [f"{o} = warpgroup_mma_wait(0, deps=(o_tok,))",
                  "mbarrier.arrive(v_empty.index(stage), count=1)"] + rescale
        lines += [f"    for j{x} in range({begin}, {end}):"] + ["        " + ln for ln in steady]
        begin = end
    last = [f"last = n{x} - 1",
            "p_op = gl.convert_layout(p_tile, P_OPERAND)",
            f"mbarrier.wait(v_ready.index(last % {STAGES}), (last // {STAGES}) & 1)",
            "mbarrier.wait(my_turn, turn_phase)",
            f"o_tok = warpgroup_mma(p_op, {v_tile.format(stage=f'last % {STAGES}')}, {o}, is_async=True)",
            "mbarrier.arrive(other_turn, count=1)",
            f"{o} = warpgroup_mma_wait(0, deps=(o_tok,))"]
    return lines + ["    " + ln for ln in last]


def _outward(block: Block):
    while block is not None:
        yield block
        block = block.parent


def _through_views(inst):
    """The instance whose value a view instance passes on (codegen.VIEW_OPS, gathers aside)."""
    while inst.op in ("broadcast", "permute", "reshape", "slice") and inst.inputs:
        inst = inst.inputs[0]
    return inst


def _reachable(roots) -> set:
    seen, stack = set(), list(roots)
    while stack:
        x = stack.pop()
        if id(x) not in seen:
            seen.add(id(x))
            stack.extend(x.inputs)
    return seen


SHARED = ["q_smem", "k_ring", "v_ring", "k_ready", "v_ready", "k_empty", "v_empty"]


def _assemble(name: str, wgs: list, symbols: list, tl_kernel: Kernel) -> Kernel:
    """The module: each consumer, the loader, and the kernel that allocates the rings and
    barriers and starts the three partitions. Its parameters are the `tl` kernel's."""
    em = wgs[0]
    s = em.step
    descriptors = tl_kernel.descriptors
    tl_descs = {buf: arg for arg, buf, _ in descriptors}
    k_buf, v_buf = (_buffer(em, s.k_load), _buffer(em, s.v_load))
    bufs = [a for a in tl_kernel.args if a not in tl_descs.values() and a not in symbols]
    # The `tl` kernel's descriptors of K and V where it has them (at a grid that fills the
    # GPU: tma.wants_tma): the two kernels then share their arguments, and a plan's tuning
    # may take either for the slot. Else descriptors of its own, after the `tl` kernel's.
    extra = [f"{buf}_gdesc" for buf in dict.fromkeys((k_buf, v_buf)) if buf not in tl_descs]
    tl_descs.update({buf: f"{buf}_gdesc" for buf in (k_buf, v_buf) if buf not in tl_descs})
    args = bufs + [d[0] for d in descriptors] + extra + list(symbols)
    if not extra and args != list(tl_kernel.args):
        raise Ineligible(f"the tl kernel's arguments {tl_kernel.args} are not buffers, descriptors, symbols")
    ptr_params = [f"{b}_ptr" for b in bufs]
    sym_params = [a if a in em.dynamic else f"{a}: gl.constexpr" for a in symbols]
    own = ptr_params + sym_params
    consumer_params = own + SHARED + ["my_turn", "other_turn"]
    lines = []
    decode = None
    for em_w in wgs:
        fn, dec = em_w.consumer(name, consumer_params)
        decode = decode or dec
        lines += fn + ["", ""]
    loads = {k_buf: em.boxes[id(s.k_load)], v_buf: em.boxes[id(s.v_load)]}
    x, bx = s.x, em.t.block[s.x]
    k_arg, v_arg = tl_descs[k_buf], tl_descs[v_buf]
    loader = [f"@gluon.jit", f"def {name}_loader({', '.join([k_arg, v_arg] + SHARED[1:] + sym_params)}):"]
    steps = [f"for j{x} in range(n{x}):",
             f"    start{x} = lo{x} + j{x} * {bx}",
             f"    stage = j{x} % {STAGES}",
             f"    phase = (j{x} // {STAGES}) & 1"]
    for ring, ready, empty, arg, buf in (("k_ring", "k_ready", "k_empty", k_arg, k_buf),
                                        ("v_ring", "v_ready", "v_empty", v_arg, v_buf)):
        steps += [f"    mbarrier.wait({empty}.index(stage), phase ^ 1)",
                  f"    mbarrier.expect({ready}.index(stage), {arg}.block_type.nbytes)",
                  f"    tma_load({arg}, [{', '.join(loads[buf].offsets)}], {ready}.index(stage), {ring}.index(stage))"]
    loader += ["    " + ln for ln in decode + em.range_lines + steps]
    q_type = LOW_TYPES[em.buffer_dtype(s.k_load.node)]
    depth = em.t.block[s.depth]
    kernel_params = [f"{b}_ptr" for b in bufs] + [d[0] for d in descriptors] + extra + sym_params + \
        ["TMA: gl.constexpr"]
    call = ", ".join(ptr_params + symbols)
    rings = ", ".join(SHARED[1:])
    main = [f"@gluon.jit", f"def {name}({', '.join(kernel_params)}):",
            "    gl.static_assert(TMA, \"the Gluon kernel reads K and V through TMA descriptors only\")"] + \
        [f"    {q} = gl.allocate_shared_memory({q_type}, [{ROWS}, {depth}], "
         f"gl.NVMMASharedLayout.get_default_for([{ROWS}, {depth}], {q_type}))" for q in ("q_smem", "q_smem1")] + [
            f"    k_ring = gl.allocate_shared_memory({k_arg}.dtype, [{STAGES}] + {k_arg}.block_type.shape, {k_arg}.layout)",
            f"    v_ring = gl.allocate_shared_memory({v_arg}.dtype, [{STAGES}] + {v_arg}.block_type.shape, {v_arg}.layout)"]
    for bar in ("k_ready", "v_ready", "k_empty", "v_empty"):
        main.append(f"    {bar} = gl.allocate_shared_memory(gl.int64, [{STAGES}, 1], mbarrier.MBarrierLayout())")
    main += ["    turn0 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
             "    turn1 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
             f"    for i in gl.static_range({STAGES}):",
             "        mbarrier.init(k_ready.index(i), count=1)",
             "        mbarrier.init(v_ready.index(i), count=1)",
             f"        mbarrier.init(k_empty.index(i), count={CONSUMERS})",
             f"        mbarrier.init(v_empty.index(i), count={CONSUMERS})",
             "    mbarrier.init(turn0, count=1)",
             "    mbarrier.init(turn1, count=1)",
             "    fence_async_shared()",
             "    gl.warp_specialize([",
             f"        ({name}_wg0, ({call}, q_smem, {rings}, turn0, turn1)),",
             f"        ({name}_wg1, ({call}, q_smem1, {rings}, turn1, turn0)),",
             f"        ({name}_loader, ({k_arg}, {v_arg}, {rings}, {', '.join(symbols)})),",
             f"    ], [{CONSUMER_WARPS}, {LOADER_WARPS}], [{CONSUMER_REGS}, {LOADER_REGS}])"]
    source = "\n".join(_header(em) + math_helpers("\n".join(lines)) + lines + loader + ["", ""] + main) + "\n"
    gluon_descs = [[arg, buf, list(loads[buf].block)] for buf, arg in ((k_buf, k_arg), (v_buf, v_arg))]
    grid = em.grid()
    return Kernel(name, source, [grid], list(args), num_warps=CONSUMER_WARPS, num_stages=1, descriptors=gluon_descs,
                  loops=tl_kernel.loops, pipelined=False, dialect="gluon", fallback=tl_kernel)


def _buffer(em, inst) -> str:
    return buffer_name(em.views.graph, inst.node)


def _header(em) -> list[str]:
    bn, width = em.t.block[em.step.x], em.t.block[em.step.width]
    return [
        "import triton",
        "import triton.language as tl",
        "from triton.experimental import gluon",
        "from triton.experimental.gluon import language as gl",
        "from triton.experimental.gluon.language.nvidia.hopper import (",
        "    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)",
        "",
        "# Triton after 3.6 renamed the TMA copy (async_load); the device has 3.6.",
        "tma_load = getattr(tma, \"async_load\", None) or tma.async_copy_global_to_shared",
        "INTERPRETED = tl.constexpr(False)  # Gluon kernels run on the GPU only",
        "DOT_BF16 = tl.constexpr(tl.bfloat16)",
        f"# a consumer warpgroup's wgmma accumulators, S [64 rows, {bn}] and O [64, {width}] in\n"
        f"# instructions {width} wide, their rows and their columns",
        f"_MMA = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[{CONSUMER_WARPS}, 1], "
        f"instr_shape=[16, {width}, 16])",
        "MMA = gl.constexpr(_MMA)",
        "ROWS = gl.constexpr(gl.SliceLayout(1, _MMA))",
        "COLS = gl.constexpr(gl.SliceLayout(0, _MMA))",
        "P_OPERAND = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_MMA, k_width=2))",
        "# tiles read or written once a program: 8 contiguous elements a thread",
        f"IO = gl.constexpr(gl.BlockedLayout([1, 8], [{32 // min(32, width // 8)}, {min(32, width // 8)}], "
        f"[{CONSUMER_WARPS}, 1], [1, 0]))",
        "",
    ] + ROUND_BF16 + ["", "", "@gluon.jit", "def ring_tile(ring, stage):",
                               "    tile = ring.index(stage)",
                               "    return tile.reshape([tile.shape[-2], tile.shape[-1]])", "", ""]
