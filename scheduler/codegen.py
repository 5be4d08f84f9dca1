"""Triton codegen from a kernel's instances, its tiling and its loop nest.

The program is a tree of blocks: the top block (the program's output tile) and the
body of each `for` loop over a label's tiles. Which reductions share which loop is
decided before any code is emitted (loops.py: horizontal fusion, passes, Separable
rescaling); the Emitter renders that nest. Values are emitted on demand, each in its
*home*: the innermost enclosing block whose loop labels it varies over (so the q
tile is loaded before the kv loop: loop-invariant hoisting). A loop is rendered where
one of its accumulators is first needed, as one `for` per segment of its tiles
(bounds.py: tiles skipped by masks, whole tiles run unmasked).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import sympy

from cleave.ir import ShapeError
from cleave.ir import dims as D
from cleave.ir.dtypes import DType, promote
from cleave.ir.ops import BITWISE, COMPARE, half_read, per_op, reads_half_rounded

from . import half_swap, scale_after
from .bounds import segments
from .exprs import code
from .fexpr import EXP, Y_NEW, Y_OLD, fcode, parse_rescale
from .index_bounds import index_bounds, provable
from .kernel_stats import Stats, mma_efficiency
from .loop_bounds import Search, render
from .loops import Loop, accumulators, loop_nest, through_units
from .monotone import FIRST_AT_LEAST
from .partition import KernelSpec, buffer_name, stored_dtype
from .tile_order import descending
from .tiles import Tiling, dot_labels, is_full, unit_label
from .target import H200
from .tma import emit as emit_tma, tile_load, wants_tma
from .views import gathers, merged_offset

TL = {d: d.triton_name for d in DType}
_ITEMSIZE = {d.triton_name: d.itemsize for d in DType}
LOW = ("tl.bfloat16", "tl.float16")
INTS = tuple(TL[d] for d in DType if d.is_int)
# Triton combines integers C's way (uint8 with int8 is uint8); torch computes in the
# promoted type (int16), so a narrow operand is converted to it first.
NARROW = ("tl.int8", "tl.uint8", "tl.int16")
BF16_MAX = 3.3895313892515355e38  # bf16's largest finite value, (2 - 2**-7) * 2**127
VIEW_OPS = ("broadcast", "permute", "reshape", "slice", "take", "gather")  # emitted as their operand's value
GROUP = 8  # row tiles per group in the grouped program order of a tiled MatMul
MAX_TENSOR_NUMEL = 1 << 20  # triton.language.TRITON_MAX_TENSOR_NUMEL
def float_literal(value) -> str:
    """A float as Python source: NaN and the infinities have no literal (repr gives `nan`)."""
    value = float(value)
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(value)


NEUTRAL = per_op({"sum": "0.0", "max": 'float("-inf")', "min": 'float("inf")', "prod": "1.0"}, "reduce",
                 where="codegen")
def int_literal(value: int) -> str:
    """An integer as kernel source: the type's minimum as (min + 1) - 1, since the literal
    2**63 in -9223372036854775808 does not fit an int64."""
    return f"({value + 1} - 1)" if value < 0 else str(value)


def int_neutral(op: str, dtype: DType) -> str:
    """The neutral element of an integer reduction in its own type (an int64 max or sum
    through f32 rounds past 2^24)."""
    lo, hi = dtype.int_range
    return {"sum": "0", "prod": "1", "max": int_literal(lo), "min": str(hi)}[op]


# max and min propagate NaN, as torch's do (Triton's default, like fmax, drops it; the
# GPU's max.NaN is as fast).
NAN_MAX, NAN_MIN = "tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)", \
    "tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"
COMBINE = per_op({"sum": "{a} + {b}", "max": NAN_MAX, "min": NAN_MIN, "prod": "{a} * {b}"}, "reduce",
                 where="codegen")
REDUCE_IN_TILE = per_op({"sum": "tl.sum({x}, axis={axis})", "max": "reduce_max({x}, {axis})",
                         "prod": "tl.reduce({x}, {axis}, mul)",
                         "min": "reduce_min({x}, {axis})"}, "reduce", where="codegen")
UNARY = per_op({"exp": EXP, "exp2": "tl.exp2({x})", "log": "tl.log({x})", "sqrt": "tl.sqrt({x})",
                "rsqrt": "tl.rsqrt({x})", "neg": "-{x}", "recip": "1.0 / {x}", "silu": "{x} * tl.sigmoid({x})",
                "sigmoid": "tl.sigmoid({x})",
                # near 0, 2 sigmoid(2x) - 1 cancels (tanh(1e-6) 7% off, tanh(3e-10) 0): its series there
                "tanh": "tl.where(tl.abs({x}) < 0.0625, {x} * (1.0 - {x} * {x} * (0.3333333333333333 - {x} * {x} * "
                        "0.13333333333333333)), 2.0 * tl.sigmoid(2.0 * {x}) - 1.0)", "square": "{x} * {x}", "cos": "tl.cos({x})",
                "sin": "tl.sin({x})", "abs": "tl.abs({x})", "erf": "tl.erf({x})",
                "inf_to_zero": "tl.where(tl.abs({x}) == float(\"inf\"), 0.0, {x})",
                # near 0, 1 + x and exp(x) - 1 lose x's low bits: Kahan's forms keep them (libdevice's
                # log1p/expm1 do not run in Triton's CPU interpreter)
                "log1p": "tl.where(tl.abs({x}) < 0.5, tl.where(1.0 + {x} == 1.0, {x}, tl.log(1.0 + {x}) * {x} / "
                         "(1.0 + {x} - 1.0)), tl.log(1.0 + {x}))",
                "expm1": "tl.where(tl.abs({x}) < 0.5, tl.where(tl.exp({x}) == 1.0, {x}, (tl.exp({x}) - 1.0) * {x} / "
                         "tl.log(tl.exp({x}))), tl.exp({x}) - 1.0)",
                "floor": "tl.floor({x})", "ceil": "tl.ceil({x})",
                "trunc": "tl.where({x} < 0.0, tl.ceil({x}), tl.floor({x}))",
                # torch.round: halves to even (floor(x) + 1 past a half, at a half when floor(x) is odd),
                # and a zero keeps x's sign (round(-0.3) is -0.0)
                "round": "tl.where({x} - tl.floor({x}) < 0.5, tl.floor({x}), tl.where({x} - tl.floor({x}) > 0.5, "
                         "tl.where(tl.floor({x}) == -1.0, {x} * 0.0, tl.floor({x}) + 1.0), "
                         "tl.where(tl.floor(tl.floor({x}) * 0.5) * 2.0 == tl.floor({x}), tl.floor({x}), "
                         "tl.where(tl.floor({x}) == -1.0, {x} * 0.0, tl.floor({x}) + 1.0))))",
                # (0 < x) - (x < 0), as torch computes it: 0 for NaN and for either zero
                "sign": "tl.where({x} > 0.0, 1.0, tl.where({x} < 0.0, -1.0, 0.0))",
                "erfinv": "erfinv_f32({x})", "erfc": "erfc_f32({x})", "bit_not": "~{x}"}, "unary", where="codegen")
# Unary ops torch computes in an integer dtype on integers (the rest make floats):
# through f32 they would round past 2^24 and could not index (reflect padding's
# `9 - |9 - |j - 2||` addressed a load with a float).
# Integer ops whose int64 result an int32 tile (an iota) overflows: computed in int64
# (46341 * 46341, arange(n) ** 2). An add or sub of two overflows only past 2**30
# elements along an axis, and stays int32 (attention's masks compare such differences).
INT_GROWS = ("mul", "square")
INT_UNARY = {"abs": "tl.abs({x})", "neg": "-{x}", "square": "{x} * {x}", "floor": "{x}", "ceil": "{x}",
             "trunc": "{x}", "round": "{x}", "sign": "tl.where({x} > 0, 1, tl.where({x} < 0, -1, 0))",
             "bit_not": "~{x}"}
POW = "pow_f32({a}, {b})"  # torch.pow (C's pow): MATH below
BINARY = per_op({"add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "div": "{a} / {b}",
                 "max": "tl.maximum({a}, {b})", "min": "tl.minimum({a}, {b})", "pow": POW,
                 # Triton's % is C's fmod on floats (frem, exact) and truncating on integers
                 "fmod": "{a} % {b}",
                 "idiv": "{a} // {b}",  # Triton's // truncates integers toward 0, as C's division
                 "atan2": "atan2_f32({a}, {b})", "hypot": "hypot_f32({a}, {b})",
                 "copysign": "tl.where(negative({b}), -tl.abs({a}), tl.abs({a}))",
                 "lt": "{a} < {b}", "le": "{a} <= {b}", "gt": "{a} > {b}", "ge": "{a} >= {b}", "eq": "{a} == {b}",
                 "ne": "{a} != {b}", "bit_and": "{a} & {b}", "bit_or": "{a} | {b}", "bit_xor": "{a} ^ {b}",
                 "shl": "{a} << {b}", "shr": "{a} >> {b}"}, "binary", "compare", where="codegen")

# torch's shifts by an amount outside [0, bits): 0 to the left; the sign to the right
# (0 for uint8). A shift by `bits` or more is undefined on the GPU; a constant amount
# folds the selects away.
SHIFTS = {("shl", True): "tl.where({b} < 0, 0, tl.where({b} < {bits}, {a} << {b}, 0))",
          ("shl", False): "tl.where({b} < {bits}, {a} << {b}, 0)",
          ("shr", True): "{a} >> tl.where({b} < 0, {bits} - 1, tl.minimum({b}, {bits} - 1))",
          ("shr", False): "tl.where({b} < {bits}, {a} >> {b}, 0)"}


@dataclass
class Val:
    name: str
    dims: tuple  # label ids, in canonical order
    ty: str
    zero: bool = False  # a masked load: exactly 0 outside the valid indices
    trans: str | None = None  # the same 2-D tile in the other order (a TMA load's memory order)
    read: "Val | None" = None  # a masked index load: the lanes that read the tensor (bool tile)
    scale: "Val | None" = None  # a scaled dot's product: the value is name * scale (scale_after.py)


@dataclass
class Block:
    parent: "Block | None"
    chain: tuple  # loop label ids, outermost first
    lines: list = field(default_factory=list)
    cache: dict = field(default_factory=dict)
    trips: float = 1.0  # iterations of this block per program


def step_dots(loop: Loop, t: Tiling) -> list:
    """The MatMuls each step of `loop` computes whole (their contraction not a loop)
    before its accumulators read them, in accumulator order; none that reads a running
    value of another accumulator."""
    found, seen = [], set()
    for acc in loop.accs:
        stack = list(reversed(acc.inputs))
        while stack:
            x = stack.pop()
            if id(x) in seen or x.leaf or loop.label not in x.labels:
                continue
            seen.add(id(x))
            if x.reduced is not None and t.role[x.reduced.id] == "loop":
                continue  # a running value: what reads it waits for the update
            if x.op == "matmul" and _reads_no_accumulator(x, loop.label, t):
                found.append(x)
                continue
            stack.extend(reversed(x.inputs))
    return found


def _reads_no_accumulator(inst, label: int, t: Tiling) -> bool:
    seen, stack = set(), list(inst.inputs)
    while stack:
        x = stack.pop()
        if id(x) in seen or x.leaf:
            continue
        seen.add(id(x))
        if x.reduced is not None and t.role[x.reduced.id] == "loop":
            return False
        stack.extend(x.inputs)
    return True


SCALED_REDUCE = ("max", "min", "sum")  # reductions a positive factor commutes with


def _acc_kind(a) -> str:
    """How a loop accumulator combines its steps: a MatMul's sums."""
    return "sum" if a.op == "matmul" else a.node.attrs["op"]


def takes_scaled(inst, k: int) -> bool:
    """Whether inst reads input k as a scaled product with its factor beside it (the
    factor is positive and finite: scale_after.py): an f32 cast, a where filling 0 or
    +-inf, the left side of an add or sub (one fused multiply-add), a max, min or sum."""
    op = inst.op
    if op == "cast":
        return inst.node.dtype is DType.f32
    if op == "where":
        fill = inst.inputs[2]
        return k == 1 and fill.op == "const" and float(fill.node.attrs["value"]) in (0.0, math.inf, -math.inf)
    if op in ("add", "sub"):
        return k == 0 and inst.node.dtype is DType.f32
    return op == "reduce" and inst.node.attrs["op"] in SCALED_REDUCE


def _computes_matmul(inst) -> bool:
    """Whether a tile instance is, or is computed from, a MatMul (a tl.dot)."""
    stack, seen = [inst], set()
    while stack:
        i = stack.pop()
        if i.op == "matmul":
            return True
        if id(i) not in seen:
            seen.add(id(i))
            stack += i.inputs
    return False


class Emitter:
    def __init__(self, spec: KernelSpec, t: Tiling, facts: dict, env: dict, dynamic: set, target=None):
        self.spec, self.t, self.env, self.dynamic = spec, t, env, dynamic
        self.views = spec.views
        self.chunk_symbols = self.views.graph.split_counts()
        self.labels = {lab.id: lab for lab in self.views.labels}
        self.n = 0
        self.stats = Stats()
        used = set()
        for inst in self.views.memo.values():
            used |= inst.labels | ({inst.reduced.id} if inst.reduced else set())
        grid = [lab.id for lab in spec.root_labels]
        loops = [i for i in used if t.role[i] == "loop"]
        full = [i for i in used if i not in grid and i not in loops]
        self.canon = [i for i in grid if not is_full(t, i)] + sorted(loops) + [i for i in grid if is_full(t, i)] + sorted(full)
        self.accs = accumulators(self.views, t.role)
        # Instances that are another's tile with its halves swapped (RoPE's rotated halves
        # of a projection): computed from it in registers; what only they read is not computed.
        self.swaps = half_swap.find_swaps(self)
        self.scaled = scale_after.scaled_dots(spec, t) if t.scale_after else {}
        if self.swaps:
            live = half_swap.live_instances(self, self.swaps)
            self.accs = [a for a in self.accs if id(a) in live]
        units = {i for i in used if t.role[i] == "full" and t.block[i] == 1}
        facts = through_units(facts, self.views.memo.values(), units)
        self.nest = loop_nest(self.accs, t.role, facts)  # facts: F node id -> (factor node id, rescale)
        self.keep: dict = {}
        self.whole: int | None = None  # the loop label whose current segment has whole tiles only
        self.windows: dict = {}  # loop label -> its relative split chunk (bounds.Window), set by bounds.segments
        # Lanes of a tiled grid label past its extent compute values that are never stored
        # (stores mask them) and never reduced over (a grid label is not reduced inside its
        # kernel): loads there read what the label's last lane reads instead of being
        # masked. A masked tl.dot operand (a dynamic prefill's q tile) made Triton spill
        # registers: 25% of that kernel's time on the H200.
        reduced = {i.reduced.id for i in self.views.memo.values() if i.reduced is not None}
        # A store that does not vary over a grid label (a row sum beside the rows) needs a
        # program even where that label's extent is 0, so the label keeps one tile there.
        # Its lanes may then all be invalid: they are masked, never clamped to a last lane.
        stored = [self.views.labels_of(st.view) for st in spec.stores]
        self.one_tile_at_least = {i for i in grid if t.static.get(i, 0) == 0 and any(i not in s for s in stored)}
        self.free_lanes = {i for i in grid if t.block[i] > 1 and i not in reduced} - self.one_tile_at_least
        self.target = target or H200
        self.tma = target is not None and wants_tma(self, target)
        self.consumers = self._consumers(set())
        # An f32 cast of a half value that only MatMuls read (`q.float() @ k.float().T`)
        # stays the half tile: the dot takes it exactly, on the tensor cores, and no f32
        # copy of it is held in registers (MLA's 64 x 512 f32 V tile left no plan of 32
        # rows) or keeps its load off TMA.
        self.dot_upcasts = {id(inst) for inst in self.views.memo.values()
                            if inst.op == "cast" and inst.node.dtype == DType.f32 and self._low(inst.node.inputs[0])
                            and self.consumers.get(id(inst), {"none"}) <= {"matmul", *VIEW_OPS}}
        if self.dot_upcasts:
            self.consumers = self._consumers(self.dot_upcasts)
        # Gathered loads whose masked lanes must read 0 (a split's zero pad over them is
        # left out): only these also take their index load's mask, since the extra
        # predicate slowed a pipelined gather that needs none (MLA decode's unsplit plan,
        # 0.27 -> 0.37 ms on the H200). A count above 1 may run relative windows, whose
        # last tile can pass the extent even where the count divides it (bounds.py).
        self.masked_gathers = {id(found[0]) for inst in self.views.memo.values()
                               if inst.op == "split" and inst.node.attrs["pad"] == 0.0
                               and (self.pad_reached(inst) or self.fix_static(inst.node.shape[inst.node.attrs["axis"]]) != 1)
                               and (found := zero_padded_load(inst)) and found[1]}
        self.persistent = False  # a tile loop in each program (tiled MatMuls): set by program()
        self.descriptors: dict = {}  # (buffer, block) -> descriptor argument name
        self.searched = False  # a loop bound searches a never-decreasing buffer (monotone.py)
        self.uncached: set = set()  # buffers read past L1: other programs of this launch write them (combine.py)
        # (loop chain, trips per program, bytes of one step's tile) of each load inside a loop
        self.load_steps: list = []
        self.loop_chains: set = set()  # the loop chain of each loop body emitted
        self.loop_runs: dict = {}  # id(instance) -> whether computing it runs a loop (runs_loop)
        self.emitting: set = set()  # the loops whose bodies are being emitted (emit_loop)
        self.bodies: dict = {}  # id(loop body Block) -> its loop label, while emit_loop fills it
        self.prefetches: dict = {}  # id(loop body Block) -> its index loads carried a step ahead

    # -- small helpers ----------------------------------------------------
    def within_numel(self, dims) -> None:
        """Triton rejects a tensor of more than 2**20 elements when it compiles the kernel
        (on the GPU, not in its CPU interpreter): such a tiling is no option."""
        n = _prod([self.t.block[d] for d in dims])
        if n > MAX_TENSOR_NUMEL:
            raise ShapeError(f"scheduler: a tile of {[self.t.block[d] for d in dims]} ({n} elements) exceeds "
                             f"Triton's {MAX_TENSOR_NUMEL} per tensor")

    def var(self, block: Block, expr: str, dims, ty: str, prefix="v") -> Val:
        self.within_numel(dims)
        name = f"{prefix}{self.n}"
        self.n += 1
        # Registers: in a loop, dot operands sit in shared memory and dot results in the
        # accumulator; any other value (and, outside loops, every value) is held in registers.
        if not (block.chain and expr.startswith(("tl.load", "tl.dot"))):
            self.stats.tile_elems = max(self.stats.tile_elems, _prod([self.t.block[d] for d in dims]))
            if block.chain:  # live beside the accumulators (values outside loops are not)
                self.stats.loop_elems = max(self.stats.loop_elems, _prod([self.t.block[d] for d in dims]))
        block.lines.append(f"{name} = {expr}")
        return Val(name, tuple(dims), ty)

    def eval_extent(self, e) -> int:
        return D.evaluate(e, self.env)

    def pad_reached(self, inst) -> bool:
        """Whether a lane of split instance inst may index past its input's extent."""
        axis = inst.node.attrs["axis"]
        merged = inst.view[axis] * inst.node.shape[axis + 1] + inst.view[axis + 1]
        _, hi = self.bounds(merged)
        return hi is None or not provable(self.fix_static(inst.node.inputs[0].shape[axis] - 1 - hi))

    def fix_static(self, e):
        """e with the symbols that are fixed at schedule time (not dynamic) bound."""
        e = sympy.sympify(e)
        return e.xreplace({s: self.env[s.name] for s in e.free_symbols
                           if s.name in self.env and s.name not in self.dynamic})

    def distinct(self, dims) -> int:
        """Elements of a tile over dims that differ (replicated lanes read one address)."""
        return _prod([self.t.rows(d) for d in dims])

    def lanes(self, lid: int) -> str:
        """Grid label lid's indices in its tile (tid{lid} decoded): a run of `block`, or
        `step` indices repeated over the block's lanes (Tiling.step)."""
        rows, bx = self.t.rows(lid), self.t.block[lid]
        return f"tid{lid} * {self.t.period(lid)} + {self.arange(lid)}" + (f" % {rows}" if rows != bx else "")

    # -- tensors made from nothing: the one place a dialect's layouts enter (gluon.py) --
    def arange(self, lid: int) -> str:
        """The lanes 0 .. block - 1 of label lid."""
        return f"tl.arange(0, {self.t.block[lid]})"

    def filled(self, dims, value: str, ty: str) -> str:
        """A tile over dims holding `value` in every lane."""
        return f"tl.full({[self.t.block[d] for d in dims]}, {value}, {ty})"

    def relayout(self, name: str, dims) -> list[str]:
        """Lines that give tile `name`, just reshaped and permuted, back its dims' layout."""
        return []

    def scalar(self, value: str, ty: str) -> str:
        """A 0-d tensor of type ty holding `value` (a literal)."""
        return f"tl.zeros([], {ty})" if value == "0" else f"tl.full([], {value}, {ty})"

    def dims(self, labels) -> tuple:
        return tuple(i for i in self.canon if i in labels and self.t.block[i] > 1)

    def idx(self, lid: int, dims) -> str:
        if self.t.block[lid] == 1:
            return f"tid{lid}" if self.t.role[lid] == "grid" else "0"
        if list(dims) == [lid]:
            return f"idx{lid}"
        return f"idx{lid}[" + ", ".join(":" if d == lid else "None" for d in dims) + "]"

    def names(self, dims) -> dict:
        return {lab.sym: self.idx(lab.id, dims) for lab in self.views.labels}

    def index_names(self, b: Block, exprs, dims) -> dict:
        """names(dims), plus the loaded value of each index tensor the index expressions
        `exprs` read through (a take), computed in block b."""
        names = self.names(dims)
        for e in exprs:
            for f in gathers(e):
                names[f] = self.align(self.wrapped_index(b, f), dims)
        return names

    def wrapped_index(self, b: Block, f) -> Val:
        """The index tensor's value read through gathered application f, a negative index
        counted from the end of the axis it indexes (torch's x[index]: -1 is the last)."""
        inst = self.views.gathers[f]
        index = self.ensure(b, inst)
        home = b  # where the index's value is: the wrapped value goes beside it
        while home.parent is not None and home.cache.get(id(inst)) is not index:
            home = home.parent
        extent = self.views.gather_extents[f]
        key = ("wrapped", id(inst), str(extent))
        if key in home.cache:
            return home.cache[key]
        n = code(extent)
        # an offset added, not a select between two indices: the MLA paged decode's gathered
        # loads ran 3% faster so on the H200 (RESULTS.md, session 29)
        wrapped = self.var(home, f"{index.name} + tl.where({index.name} < 0, {n}, 0)", index.dims, index.ty)
        wrapped.read = index.read
        home.cache[key] = wrapped
        return wrapped

    def valid(self, lid: int, dims) -> str | None:
        lab, b = self.labels[lid], self.t.block[lid]
        static = self.t.static.get(lid)
        if lid in self.windows:  # a relative chunk's lanes end at its window, not at the extent
            return None if lid == self.whole else f"({self.idx(lid, dims)} < {self.windows[lid].end})"
        if lid in self.one_tile_at_least:
            return f"({self.idx(lid, dims)} < {code(lab.extent)})"
        # An empty extent is divided by every tile but has no valid index: it keeps its mask.
        if (b == 1 and self.t.role[lid] != "loop") or (static is not None and static > 0 and static % self.t.period(lid) == 0) \
                or lid == self.whole:
            return None  # a program's own grid index, tiles that divide the extent, or a whole-tile segment
        return f"({self.idx(lid, dims)} < {code(lab.extent)})"

    def align(self, v: Val, dims) -> str:
        if v.dims == tuple(dims) or not v.dims:
            return v.name
        missing = [d for d in v.dims if d not in dims]
        if missing:
            raise ShapeError(f"scheduler: internal: value {v.name} varies over labels {missing} not in {dims}")
        return f"{v.name}[" + ", ".join(":" if d in v.dims else "None" for d in dims) + "]"

    def f32(self, v: Val, dims=None) -> str:
        s = self.align(v, dims) if dims is not None else v.name
        return f"{s}.to(tl.float32)" if v.ty in LOW or v.ty in INTS or v.ty == "tl.int1" else s

    def rounded(self, b: Block, v: Val, dtype) -> Val:
        """v, a value of half type `dtype`, as that type holds it, for an op that reads it
        rounded (`reads_half_rounded`: a compare, a cast to an integer, a floor). A half
        MatMul's kernel holds its f32 accumulator: `(x @ w.t()).argmax(-1)` in bf16
        compared it with its rounded row max, found no maximum and returned 48 of 48, and
        its cast to int32 was one off where the bf16 product was a whole number."""
        if dtype not in (DType.bf16, DType.f16) or v.ty != "tl.float32":  # None: no half value
            return v
        v = self.unscaled(b, v)
        out = self.var(b, convert(v.name, TL[dtype]), v.dims, TL[dtype])
        out.zero = v.zero
        return out

    def as_int(self, v: Val, dims, ty: str) -> str:
        """v as an operand of an integer op computed in `ty` (see NARROW)."""
        s = self.align(v, dims)
        # a bool too: Triton refuses int1 % int64 (different signedness); torch computes in int64
        return s if v.ty == ty or (v.ty not in (*NARROW, "tl.int1") and ty not in NARROW) else convert(s, ty)

    @staticmethod
    def find(block: Block, inst) -> Val | None:
        while block is not None:
            if id(inst) in block.cache:
                return block.cache[id(inst)]
            block = block.parent
        return None

    @staticmethod
    def chain(block: Block, outer: Block) -> list[Block]:
        """The blocks from `block` out to `outer`, `outer` excluded, innermost first."""
        out = []
        while block is not None and block is not outer:
            out.append(block)
            block = block.parent
        return out

    def home(self, block: Block, labels) -> Block:
        depth = max([block.chain.index(i) + 1 for i in labels if self.t.role[i] == "loop" and i in block.chain],
                    default=0)
        while len(block.chain) > depth:
            block = block.parent
        return block

    def is_acc(self, inst) -> bool:
        return inst.reduced is not None and self.t.role[inst.reduced.id] == "loop" and not inst.leaf

    def runs_loop(self, inst) -> bool:
        """Whether computing inst runs a loop: it is, or reads, a loop's accumulator."""
        if id(inst) not in self.loop_runs:
            self.loop_runs[id(inst)] = self.is_acc(inst) or any(self.runs_loop(x) for x in inst.inputs)
        return self.loop_runs[id(inst)]

    # -- values -----------------------------------------------------------
    def ensure(self, block: Block, inst) -> Val:
        """inst's value, computed in block or found where an outer block holds it."""
        return self.unscaled(block, self.value(block, inst))

    def value(self, block: Block, inst) -> Val:
        """As ensure, except that a scaled dot's product, and what passes it on, may stay
        unscaled with its factor beside it (Val.scale)."""
        if id(inst) in self.keep:  # a mask that holds on every tile of this loop segment
            return self.ensure(block, self.keep[id(inst)])
        found = self.find(block, inst)
        if found is not None:
            return found
        if id(inst) in self.swaps:
            return self.rolled(block, inst, self.swaps[id(inst)])
        missing = [i for i in inst.labels if self.t.role[i] == "loop" and i not in block.chain]
        if missing:
            raise ShapeError(f"scheduler: node %{inst.node.id} ({inst.node.op}) varies over loop label "
                             f"X{missing[0]} outside its loop")
        h = self.home(block, inst.labels)
        if self.is_acc(inst):
            self.emit_loop(h, self.nest.loop(h.chain, inst))
            return self.find(h, inst)
        # A value of a running accumulator that this loop body holds (the guarded max of a
        # separated exp(x - g(m)), through any chain of ops) is computed in the body: outside,
        # it would wait for the loop. Each input lands in its own home first.
        # Operands that run a loop first: what the rest reads (a residual tile, a bias) is
        # then loaded after the loop, not held in registers through it beside the
        # accumulators (the register count the cost model assumes).
        order = sorted(range(len(inst.inputs)), key=lambda k: not self.runs_loop(inst.inputs[k]))
        got = {k: self.argument(block, inst, k) for k in order}
        args = [got[k] for k in range(len(inst.inputs))]
        inner = [b for b in self.chain(block, h) if any(id(x) in b.cache for x in inst.inputs)]
        h = inner[0] if inner else h
        val = self.compute(h, inst, args)
        if id(inst) in self.scaled:
            val.scale = self.scale_factor(self.scaled[id(inst)][2])
        h.cache[id(inst)] = val
        return val

    # -- scores scaled after the dot (scale_after.py) ---------------------------------
    def argument(self, block: Block, inst, k: int) -> Val:
        """Input k of inst as inst reads it: a scaled dot's operand straight from its load;
        a scaled product unscaled unless inst takes it as it is (takes_scaled)."""
        if id(inst) in self.scaled and self.scaled[id(inst)][0] == k:
            return self.ensure(block, self.scaled[id(inst)][1])
        v = self.value(block, inst.inputs[k])
        return v if v.scale is None or takes_scaled(inst, k) else self.unscaled(block, v)

    def scale_factor(self, c) -> Val:
        """The scale of a scaled dot, in the program's first block: 0 where it is inf (the
        reciprocal square root of an empty contraction, whose raw scores are 0)."""
        top = self.top  # the program's first block (function())
        key = ("scale", id(c))
        if key not in top.cache:
            v = self.ensure(top, c)
            top.cache[key] = self.var(top, f"tl.where({v.name} < float(\"inf\"), {v.name}, 0.0)", (), "tl.float32")
        return top.cache[key]

    def unscaled(self, block: Block, v: Val) -> Val:
        """v as its value: a scaled product multiplied by its factor (once per block chain)."""
        if v.scale is None:
            return v
        key = ("unscaled", v.name)
        b = block
        while b is not None:
            if key in b.cache:
                return b.cache[key]
            b = b.parent
        out = self.var(block, f"{v.name} * {v.scale.name}", v.dims, "tl.float32")
        block.cache[key] = out
        return out

    def swap_source(self, base: Val) -> str:
        """What a half swap reshapes: the base's value (a back end may relayout it first)."""
        return base.name

    def rolled(self, block: Block, inst, swap) -> Val:
        """A half-swapped instance: its base's tile with the halves along swap.label
        exchanged, emitted (and kept) where the base's value is."""
        base = self.ensure(block, swap.base)
        key = swap.base
        while id(key) in self.keep:
            key = self.keep[id(key)]
        h = block
        while h.parent is not None and id(key) not in h.cache:
            h = h.parent
        key = ("swap", id(key), swap.label)  # a roll by +c and by -c is the same roll
        if swap.label not in base.dims:  # constant along the label: nothing to swap
            out = base
        elif key in h.cache:
            out = h.cache[key]
        else:
            name = f"v{self.n}"
            self.n += 1
            shape = [self.t.block[d] for d in base.dims]
            h.lines += half_swap.lines(name, self.swap_source(base), shape, base.dims.index(swap.label),
                                       swap.half) + self.relayout(name, base.dims)
            self.stats.tile_elems = max(self.stats.tile_elems, _prod(shape))
            if h.chain:
                self.stats.loop_elems = max(self.stats.loop_elems, _prod(shape))
            out = Val(name, base.dims, base.ty, zero=base.zero)  # lanes of other labels stay where they were
            h.cache[key] = out
        h.cache[id(inst)] = out
        return out

    def compute(self, b: Block, inst, args) -> Val:
        n, op = inst.node, inst.op
        dims = self.dims(inst.labels)
        if reads_half_rounded(op, n.dtype):
            args = [self.rounded(b, x, half_read(node)) for x, node in zip(args, n.inputs)]
        if op == "load":
            return self.load(b, inst, dims)
        if op == "const":
            # a half const is the Python number torch computes with in f32, not rounded
            # (x_bf16 * 1.004 is not x); one a comparison reads comes rounded (frontends)
            ty = "tl.float32" if n.dtype in (DType.bf16, DType.f16) else TL[n.dtype]
            value = n.attrs["value"]
            lit = float_literal(value) if n.dtype.is_float else str(int(value))
            return self.var(b, self.scalar(lit, ty), (), ty)
        if op == "size":  # an integer size stays one: it may index a load (flip over a dynamic axis)
            if n.dtype.is_float:
                return self.var(b, f"{self.scalar('0', 'tl.float32')} + {code(n.attrs['value'])}", (), "tl.float32")
            # computed wide, then wrapped into its type as torch wraps 300 beside an int8 (44)
            ty = TL[n.dtype]
            return self.var(b, f"({self.scalar('0', 'tl.int64')} + {code(n.attrs['value'])}).to({ty})", (), ty)
        if op == "iota":
            e = code(inst.view[n.attrs["axis"]], self.index_names(b, inst.view, dims))
            return self.var(b, e, dims, "tl.int32")
        if op in UNARY:
            if not n.dtype.is_float and op in INT_UNARY:  # an index's abs or neg stays an integer
                ty = TL[n.dtype]
                x = args[0].name
                if op in INT_GROWS and ty == "tl.int64" and args[0].ty == "tl.int32":
                    x = f"{x}.to(tl.int64)"
                return self.var(b, INT_UNARY[op].format(x=x), dims, ty)
            return self.var(b, UNARY[op].format(x=self.f32(args[0])), dims, "tl.float32")
        if op == "cast":
            if id(inst) in self.dot_upcasts:
                return args[0]
            ty = TL[n.dtype]
            out = self.var(b, convert(args[0].name, ty), args[0].dims, ty)
            out.zero, out.scale = args[0].zero, args[0].scale
            return out
        if op in BINARY:
            a, c = args
            ty = "tl.int1" if op in COMPARE else (
                "tl.float32" if n.dtype.is_float else TL[n.dtype])
            conv = self.f32 if n.dtype.is_float else lambda v, d: self.as_int(v, d, ty)  # noqa: E731
            if op in INT_GROWS and ty == "tl.int64" and a.ty == c.ty == "tl.int32":
                conv = lambda v, d: f"{self.align(v, d)}.to(tl.int64)"  # noqa: E731
            if op in COMPARE:
                if a.ty in INTS and c.ty in INTS:  # compared in their promoted type, exact
                    common = TL[promote(*(x.dtype for x in n.inputs))]
                    conv = lambda v, d: self.as_int(v, d, common)  # noqa: E731
                else:
                    conv = self.f32
            if op in BITWISE:  # in the result's type: Triton refuses bit ops across signedness (uint8 & int8)
                conv = lambda v, d: self.align(v, d) if v.ty == ty else convert(self.align(v, d), ty)  # noqa: E731
            form = {"max": NAN_MAX, "min": NAN_MIN}.get(op, BINARY[op]) if n.dtype.is_float else BINARY[op]
            if op in ("shl", "shr"):
                form = SHIFTS[op, n.dtype.int_range[0] < 0].replace("{bits}", str(8 * n.dtype.itemsize))
            left = conv(a, dims) if a.scale is None else f"{conv(a, dims)} * {a.scale.name}"  # one fma
            return self.var(b, form.format(a=left, b=conv(c, dims)), dims, ty)
        if op == "where":
            c, x, y = args
            ty = "tl.float32" if n.dtype.is_float else TL[n.dtype]
            conv = self.f32 if n.dtype.is_float else lambda v, d: self.as_int(v, d, ty)  # noqa: E731
            out = self.var(b, f"tl.where({self.align(c, dims)}, {conv(x, dims)}, {conv(y, dims)})", dims, ty)
            out.scale = x.scale  # a fill of 0 or +-inf is itself scaled by a positive factor
            return out
        if op in VIEW_OPS:  # take: its operand's loads gather
            return args[0]
        if op == "concat":
            axis, e = n.attrs["axis"], code(inst.view[n.attrs["axis"]], self.index_names(b, inst.view, dims))
            offset, expr = D.dim(0), None
            bounds = []
            for x in n.inputs:
                offset = offset + x.shape[axis]
                bounds.append(code(offset))
            # integers stay integers: through f32, int64 values past 2**24 would round
            conv = self.f32 if n.dtype.is_float else lambda v, d: f"{self.align(v, d)}.to({TL[n.dtype]})"
            expr = conv(args[-1], dims)
            for v, bound in zip(reversed(args[:-1]), reversed(bounds[:-1])):
                expr = f"tl.where({e} < {bound}, {conv(v, dims)}, {expr})"
            return self.var(b, expr, dims, "tl.float32" if n.dtype.is_float else TL[n.dtype])
        if op == "split":
            axis = n.attrs["axis"]
            merged = inst.view[axis] * n.shape[axis + 1] + inst.view[axis + 1]
            bound = code(n.inputs[0].shape[axis])
            pad = n.attrs["pad"]
            if pad is None or not self.pad_reached(inst):
                return args[0]  # no valid lane reaches the padding (a count of 1, or one that divides the axis)
            found = zero_padded_load(inst)
            if pad == 0.0 and found and (not found[1] or id(found[0]) in self.masked_gathers):
                # A zero pad over a masked load is already there: the load's mask holds
                # exactly where the merged index is in range (same tensor, same index).
                # Re-masking would also round-trip the tile through fp32.
                return args[0]
            at = code(merged, self.index_names(b, inst.view, dims))
            if n.dtype.is_int:  # the pad is a reduction's neutral element: that integer's
                ty = TL[n.dtype]
                lo, hi = n.dtype.int_range
                lit = int_literal(lo if pad == float("-inf") else hi if pad == float("inf") else int(pad))
                return self.var(b, f"tl.where({at} < {bound}, {self.align(args[0], dims)}.to({ty}), {lit})", dims, ty)
            lit = float_literal(pad)
            return self.var(b, f"tl.where({at} < {bound}, {self.f32(args[0], dims)}, {lit})", dims, "tl.float32")
        if op == "reduce":
            return self.partial_reduce(b, inst, args[0])
        if op == "matmul":
            return self.dot(b, inst, args[0], args[1], dims)
        if op == "topk":
            return self.topk(b, inst, args[0], dims)
        raise ShapeError(f"scheduler: no Triton lowering for op {op!r} (node %{n.id})")

    def load(self, b: Block, inst, dims) -> Val:
        node = inst.node
        shape = node.shape
        names = self.index_names(b, inst.view, dims)
        terms, mask = [], {}  # mask: term -> the labels it varies over
        # a mask is widened to the tile only where the address is one (a scalar load, as a
        # gather of one index per row broadcast over columns, takes a scalar mask)
        block = False
        clamped = set()
        for lid in inst.labels & self.free_lanes:
            if self.valid(lid, dims):  # lanes past the extent read the last valid lane's element
                sym = self.labels[lid].sym
                names[sym] = f"tl.minimum({names[sym]}, {code(self.labels[lid].extent - 1)})"
                clamped.add(lid)
        for k, e in enumerate(inst.view):
            stride = sympy.Mul(*shape[k + 1:]) if k + 1 < len(shape) else sympy.Integer(1)
            e = sympy.sympify(e)
            if e == 0:
                continue
            terms.append(f"{code(e, names)} * {code(stride)}" if stride != 1 else code(e, names))
            varies = self.varies(b, e)
            block |= bool(varies & set(dims))
            lo, hi = self.bounds(e)
            if hi is None or not provable(shape[k] - 1 - hi):
                mask[f"({code(e, names)} < {code(shape[k])})"] = varies
            if lo is None or not provable(lo):
                mask[f"({code(e, names)} >= 0)"] = varies
        for lid in inst.labels - clamped:
            v = self.valid(lid, dims)
            if v:
                mask[v] = {lid}
        # A lane whose index load was masked holds a stand-in index (0): where a split's
        # zero pad is left out over this gathered load, it is masked too, so that such
        # lanes read 0 like any other masked lane (`zero_padded_load`).
        for e in inst.view if id(inst) in self.masked_gathers else ():
            for f in gathers(e):
                read = self.wrapped_index(b, f).read
                if read is not None:
                    mask[self.align(read, dims)] = set(read.dims)
        if not block and any(set(labels) & set(dims) for labels in mask.values()):
            # one address for the tile (a gather at a constant index) under a mask that
            # varies over it (its rows' extent): tl.load takes a block mask with a block
            # pointer only, so the address is broadcast to the tile
            terms.append(self.filled(dims, "0", "tl.int32"))
            block = True
        ptr = f"{buffer_name(self.views.graph, node)}_ptr"
        addr = ptr + (" + " + " + ".join(terms) if terms else "")
        read = None
        raw_mask = None  # an index tile's mask as written, for its load a step ahead (prefetched)
        if mask and not node.dtype.is_float:  # an index tile: its mask is kept for the loads it addresses
            raw_mask = self.mask(mask, dims, block)[len(", mask="):]
            read = self.var(b, raw_mask, dims, "tl.int1")
            mask = {read.name: set(dims)}
        m = f"{self.mask(mask, dims, block)}, other=0" if mask else ""
        elems = _prod([self.t.block[d] for d in dims])
        ty = self.buffer_dtype(node)
        name = buffer_name(self.views.graph, node)
        self.stats.traffic(name, self.distinct(dims) * _ITEMSIZE[ty] * b.trips, self.numel(node) * _ITEMSIZE[ty])
        if b.chain:
            key = (node.id, tuple(inst.view))
            self.stats.stage_smem[key] = elems * _ITEMSIZE[ty]
            if any(set(b.chain) & self.views.labels_of(f.args) for e in inst.view for f in gathers(e)):
                self.stats.gathered.add(key)
            self.load_steps.append((b.chain, b.trips, elems * _ITEMSIZE[ty]))
        # In a pipelined loop, a descriptor tile read by anything but tl.dot came out wrong
        # on the H200 (triton 3.6: RMSNorm->MatMul's x tile squared beside its dot, 27%
        # relative error; RESULTS.md, 2026-12-01 session 3): such tiles keep the pointer path.
        dot_only = not b.chain or self.consumers.get(id(inst), set()) <= {"matmul", *VIEW_OPS}
        # An integer tile may address a gather (kv_indices): the pipeliner cannot predicate
        # a descriptor load whose values form the loop's addresses (triton 3.6, "Fatal
        # pipeliner error", session 5), also when the tile is loaded before the loop.
        dense = node.dtype.is_float
        tile = tile_load(self, inst, dims, _ITEMSIZE[ty]) if self.tma and dot_only and dense else None
        if tile is None:
            cg = ", cache_modifier=\".cg\"" if name in self.uncached else ""
            carried = self.prefetched(b, node, addr, raw_mask, cg, [self.t.block[d] for d in dims])
            out = self.var(b, carried or f"tl.load({addr}{m}{cg})", dims, ty)
        else:
            desc = self.descriptors.setdefault((name, tile.block), f"{name}_desc{len(self.descriptors)}")
            self.stats.tma_in_loop |= bool(b.chain)
            out = Val(f"v{self.n}", tuple(dims), ty)
            self.n += 1
            if not b.chain:  # held in registers, as `var` counts a pointer load outside loops
                self.stats.tile_elems = max(self.stats.tile_elems, elems)
            out.trans = emit_tma(self, b, out.name, desc, tile, dims, f"tl.load({addr}{m})")
        out.zero, out.read = True, read
        return out

    def varies(self, b: Block, e) -> frozenset:
        """The labels an index expression's code varies over: a gathered index as the value
        it loads (a constant index, expanded over rows, is one scalar)."""
        plain = self.views.labels_of([sympy.sympify(e).subs({f: 0 for f in gathers(e)})])
        return plain | {d for f in gathers(e) for d in self.wrapped_index(b, f).dims}

    def mask(self, terms: dict, dims, block: bool = True) -> str:
        """The `mask=` argument of a load or store of a tile over dims, from its terms
        (each mapped to the labels it varies over); `block`: the address is a tile."""
        # A term that holds for the whole tile (a grid index against an extent) is widened
        # to the tile: Triton's CPU interpreter broadcasts a scalar comparison with its
        # operands' integer dtype, and its load and store then reject the mask.
        uniform = block and bool(dims) and any(not set(labels) & set(dims) for labels in terms.values())
        head = [self.filled(dims, "1", "tl.int1")] if uniform else []
        return ", mask=" + " & ".join(head + list(terms))

    def numel(self, node) -> int:
        return _prod([D.evaluate(d, self.env) for d in node.shape])

    def buffer_dtype(self, node) -> str:
        return TL[stored_dtype(node, self.chunk_symbols)]

    def bounds(self, e):
        """Least and greatest value of an index over its labels' valid ranges."""
        return index_bounds(e, {sym: self.lane_extent(lab) for sym, lab in self.views.by_sym().items()
                                if lab.id not in self.windows})  # a window's index leaves [0, extent)

    def lane_extent(self, lab) -> sympy.Expr:
        """One past the greatest index label lab's lanes take where they are valid. A
        program holding tiles side by side (Tiling.unroll) over an extent its span
        divides reads its first tile up to a span before the end: the copies further on
        (the label plus an offset) then stay inside it too."""
        lid = lab.id
        static, span = self.t.static.get(lid), self.t.period(lid)
        if span > self.t.rows(lid) and static and static % span == 0:
            return lab.extent - (span - self.t.rows(lid))
        return lab.extent

    def masked(self, v: Val, lid: int, neutral: str, ty: str = "tl.float32") -> str:
        """v with the lanes of label lid past its extent set to `neutral`, in `ty`."""
        valid = self.valid(lid, v.dims)
        x = self.f32(v) if ty == "tl.float32" else (v.name if v.ty == ty else f"{v.name}.to({ty})")
        return f"tl.where({valid}, {x}, {neutral})" if valid else x

    def partial_reduce(self, b: Block, inst, x: Val) -> Val:
        """Reduce x over the instance's reduced label within one tile."""
        if x.scale is not None:  # a positive factor commutes with max, min and sum: once per row
            raw = self.partial_reduce(b, inst, Val(x.name, x.dims, x.ty, zero=x.zero))
            return self.var(b, f"{raw.name} * {x.scale.name}", raw.dims, "tl.float32")
        op, r = inst.node.attrs["op"], inst.reduced.id
        out = tuple(d for d in x.dims if d != r)
        if inst.node.dtype.is_int:  # in its own integer type, exact
            if op == "prod":  # the frontend refuses them (`aten_reduce._float_result`)
                raise ShapeError(f"scheduler: reduce %{inst.node.id} multiplies integers, which kernels do not")
            ty = TL[inst.node.dtype]
            # Triton reduces integers narrower than 32 bits in int32: cast back, so that the
            # ops after it wrap in the program's type (int8 x - x.amax() is 1, not -255)
            back = f".to({ty})" if inst.node.dtype.itemsize < 4 else ""
            if r not in x.dims:  # constant along r: a sum is x times the valid lanes, max and min x
                if op == "sum" and self.t.block[r] > 1:
                    valid = self.valid(r, (r,))
                    n = f"tl.sum(({valid}).to({ty}), axis=0)" if valid else str(self.t.block[r])
                    return self.var(b, f"({x.name}.to({ty}) * {n}){back}", out, ty)
                return x
            masked = self.masked(x, r, int_neutral(op, inst.node.dtype), ty)
            return self.var(b, f"tl.{op}({masked}, axis={x.dims.index(r)}){back}", out, ty)
        if r not in x.dims:  # constant along r (or a single element)
            if op == "sum" and self.t.block[r] > 1:
                return self.var(b, f"{self.f32(x)} * {self.count(r)}", out, "tl.float32")
            if op == "prod" and self.t.block[r] > 1:  # x times itself once per valid lane of r
                dims = tuple(d for d in self.canon if d in set(x.dims) | {r})
                tile = f"tl.broadcast_to({self.f32(x, dims)}, {[self.t.block[d] for d in dims]})"
                valid = self.valid(r, dims)
                tile = f"tl.where({valid}, {tile}, 1.0)" if valid else tile
                return self.var(b, f"tl.reduce({tile}, {dims.index(r)}, mul)", out, "tl.float32")
            return x
        expr = REDUCE_IN_TILE[op].format(x=self.masked(x, r, NEUTRAL[op]), axis=x.dims.index(r))
        return self.var(b, expr, out, "tl.float32")

    def count(self, lid: int) -> str:
        """How many valid indices of label lid the current tile holds."""
        valid = self.valid(lid, (lid,))
        return f"tl.sum(({valid}).to(tl.float32), axis=0)" if valid else f"{self.t.block[lid]}.0"

    def dot(self, b: Block, inst, a: Val, c: Val, dims, acc: str | None = None, tile_acc=None) -> Val | None:
        """The contraction of a and c over the instance's reduced label, plus `acc`. With
        `tile_acc` (the product's dims -> an accumulator of them, or None) a product off
        the tensor cores is added lane by lane to the accumulator it returns
        (deferred_tile), and None is returned."""
        k = inst.reduced.id
        m = self.dims(inst.labels)
        na, nc = inst.node.inputs
        # An operand constant along K (a unit K whose index is 0, or one broadcast along
        # it) is spread over K's lanes, so the contraction stays a tl.dot: as a broadcast
        # product its [M, N, K] tile, K padded to 16, held 16x the output in registers.
        if (k in a.dims) != (k in c.dims) and len(a.dims) + len(c.dims) == 3:
            a, c = (self.spread(b, v, k) for v in (a, c))
        mk = [d for d in a.dims if d != k]
        kn = [d for d in c.dims if d != k]
        blocks_ok = all(self.t.block[d] >= 16 for d in mk + kn + [k])
        shape_ok = len(mk) == 1 and len(kn) == 1 and mk != kn and k in a.dims and k in c.dims
        elems = 1
        for d in m:
            elems *= self.t.block[d]
        flops = 2 * elems * self.t.block[k] * b.trips
        self.stats.flops += flops
        if blocks_ok and shape_ok and tuple(m) in ((mk[0], kn[0]), (kn[0], mk[0])):
            # Padded contraction lanes must contribute exactly 0: a masked load is 0 there, a
            # computed operand is masked too, since a zero on the other side does not make
            # inf vanish (softmax's exp(0 - m) on a padded lane is inf when every score is
            # below -88, and over an empty axis, whose max m is -inf).
            def zero_padded(v: Val) -> Val:
                valid = self.valid(k, v.dims)
                if v.zero or not valid:
                    return v
                return self.var(b, f"tl.where({valid}, {v.name}, 0.0).to({v.ty})", v.dims, v.ty)

            a, c = zero_padded(a), zero_padded(c)
            ty_a, ty_c = self.dot_type(a, na), self.dot_type(c, nc)

            def product(a: Val, c: Val, low: bool, acc: str | None) -> str:
                if tuple(m) == (mk[0], kn[0]):
                    lo, hi = self.operand(a, na, (mk[0], k), low), self.operand(c, nc, (k, kn[0]), low)
                else:  # the result is laid out (N, M): compute (A B)^T = B^T A^T
                    lo, hi = self.operand(c, nc, (kn[0], k), low), self.operand(a, na, (k, mk[0]), low)
                prec = "" if low else ", input_precision=\"ieee\""
                return f"tl.dot({lo}, {hi}{', ' + acc if acc else ''}{prec})"

            mma = flops / mma_efficiency(self.t.block[mk[0]], self.t.block[kn[0]])
            precision = self.target.f32_matmul
            if ty_a and ty_a == ty_c:  # tl.dot takes two operands of one type
                expr = product(a, c, True, acc)
                self.stats.mma_flops += mma
            elif precision == "medium":
                # torch's "medium": f32 operands rounded to bf16 once, an upcast f16 one too
                a = a if ty_a == "tl.bfloat16" else self.var(b, f"to_bf16({a.name})", a.dims, "tl.bfloat16")
                c = c if ty_c == "tl.bfloat16" else self.var(b, f"to_bf16({c.name})", c.dims, "tl.bfloat16")
                expr = product(a, c, True, acc)
                self.stats.mma_flops += mma
            elif {ty_a, ty_c} == {"tl.bfloat16", None}:
                # An f32 operand against one that holds bf16 values (an upcast: P @ v.float()):
                # x = hi + lo, both bf16, leaves |x - hi - lo| <= 2^-16 |x|, and each product
                # with a bf16 value is exact in f32; two tensor-core dots instead of an `ieee`
                # one off the tensor cores (the paged decode's P.V ran 2.6x slower that way).
                hi, lo = self.two_bf16(b, c if ty_a else a)
                pair = [(a, hi), (a, lo)] if ty_a else [(hi, c), (lo, c)]
                expr = product(*pair[1], True, product(*pair[0], True, acc))
                self.stats.mma_flops += 2 * mma
            else:
                # f32 against f32, or against f16 values (p @ v.float() with v fp16): the bf16
                # halves' products with an f16 value are not exact, nor is a bf16 x f16 dot legal
                expr = product(a, c, False, acc)
                self.stats.vector_flops += flops
            for v, d in ((a, mk[0]), (c, kn[0])):  # an operand held across the loop sits in smem too
                if not any(self.t.role[i] == "loop" for i in v.dims):
                    self.stats.fixed_smem[v.name] = self.t.block[d] * self.t.block[k] * 2
            return self.var(b, expr, m, "tl.float32")
        full = self.dims(set(a.dims) | set(c.dims))
        self.within_numel(full)  # the product before its sum over K
        self.stats.vector_flops += flops
        # the product is held in registers before its sum: a [64, 16, 4, 128] one spilled
        # (the paged decode's split plans ran 79-105 ms on the H200)
        product = _prod([self.t.block[d] for d in full])
        self.stats.tile_elems = max(self.stats.tile_elems, product)
        if b.chain:
            self.stats.loop_elems = max(self.stats.loop_elems, product)
        prod = f"{self.f32(a, full)} * {self.f32(c, full)}"
        if k in full:
            valid = self.valid(k, full)
            if valid:
                prod = f"tl.where({valid}, {prod}, 0.0)"
            into = tile_acc(full) if tile_acc else None
            if into is not None:
                b.lines.append(f"{into.name} = {into.name} + {prod}")
                return None
            expr = f"tl.sum({prod}, axis={full.index(k)})"
        else:  # neither operand varies over K (a unit K, or broadcasts along it): one term per valid k
            expr = f"{prod} * {self.count(k)}" if self.t.block[k] > 1 else prod
        if acc:
            expr = f"{acc} + {expr}"
        return self.var(b, expr, m, "tl.float32")

    def spread(self, b: Block, v: Val, k: int) -> Val:
        """v broadcast along label k, unless it varies over k already."""
        if k in v.dims:
            return v
        dims = tuple(d for d in self.canon if d in set(v.dims) | {k})
        shape = [self.t.block[d] for d in dims]
        return self.var(b, f"tl.broadcast_to({self.align(v, dims)}, {shape})", dims, v.ty)

    def two_bf16(self, b: Block, x: Val) -> tuple[Val, Val]:
        """x (f32) as hi + lo in bf16: hi its rounding, lo the rounding of what is left.
        hi rounds x clamped to bf16's finite range, so that it is finite: an infinite x
        is then carried by lo (inf - hi is inf, where inf - inf was NaN), and so is an f32
        value above bf16's largest, which would round to inf."""
        clamped = f"tl.minimum(tl.maximum({x.name}, {-BF16_MAX!r}), {BF16_MAX!r})"
        hi = self.var(b, f"to_bf16({clamped})", x.dims, "tl.bfloat16")
        lo = self.var(b, f"to_bf16({x.name} - {hi.name}.to(tl.float32))", x.dims, "tl.bfloat16")
        return hi, lo

    @staticmethod
    def _low(node) -> bool:
        return node.dtype in (DType.bf16, DType.f16)

    def _consumers(self, transparent: set) -> dict[int, set]:
        """id(instance) -> the ops that read its value, seen through views and through the
        casts in `transparent` (ids), which pass their operand's value on as views do."""
        consumers: dict[int, set] = {}
        for inst in self.views.memo.values():
            if id(inst) in transparent:
                continue
            for k, x in enumerate(inst.inputs):
                # a take's second input addresses the gather: it is read as an index, not a value
                consumers.setdefault(id(x), set()).add("index" if inst.op in ("take", "gather") and k == 1
                                                       else inst.op)
                while (x.op in VIEW_OPS or id(x) in transparent) and x.inputs:  # a view passes its operand's value on
                    x = x.inputs[0]
                    consumers.setdefault(id(x), set()).add(inst.op)
        return consumers

    def dot_type(self, v: Val, node) -> str | None:
        """The low precision type whose values operand v holds exactly (its tile's, or its
        node's, or a half value's the code upcast: `q.float() @ k.float().T`, whose
        products are exact in f32 too), as a tensor-core dot takes it; None for f32 values."""
        if v.ty in LOW:
            return v.ty
        while node.op in VIEW_OPS and node.inputs:
            node = node.inputs[0]
        if node.op == "cast" and node.dtype == DType.f32 and self._low(node.inputs[0]):
            node = node.inputs[0]
        return TL[node.dtype] if self._low(node) else None

    def operand(self, v: Val, node, order, low: bool) -> str:
        """A tl.dot operand: in the graph's low precision (tensor cores) or fp32."""
        s, trans = v.name, v.dims != tuple(order)
        if trans and v.trans:  # the memory-order tile (TMA) is already the transpose
            s, trans = v.trans, False
        if low:
            ty = self.dot_type(v, node) or "tl.bfloat16"  # an f32 one was rounded to bf16 (to_bf16)
            s = f"{s}.to({'DOT_BF16' if ty == 'tl.bfloat16' else ty})"
        elif v.ty != "tl.float32":
            s = f"{s}.to(tl.float32)"
        return f"tl.trans({s})" if trans else s

    def topk(self, b: Block, inst, x: Val, dims) -> Val:
        node = inst.node
        key = ("topk", id(inst.inputs[0]), node.attrs["k"], tuple(inst.view))
        if key not in b.cache:
            r = inst.reduced.id
            # which of the k results each lane holds: a label's index, or a constant
            # where the k axis is a single index (argmax is topk with k = 1)
            kexpr = code(inst.view[node.attrs["axis"]], self.names(dims))
            dtype = node.inputs[0].dtype  # an integer topk compares in its own type (exact)
            ty = TL[dtype] if dtype.is_int else "tl.float32"
            blocks = [self.t.block[d] for d in dims]
            if r not in x.dims:  # an axis of one element (no lanes): k = 1 takes it, at index 0
                b.cache[key] = (self.var(b, f"{self.align(x, dims)}.to({ty}) + tl.zeros({blocks}, {ty})", dims, ty),
                                self.var(b, f"tl.zeros({blocks}, tl.int64)", dims, "tl.int64"))
                vals, idxs = b.cache[key]
                return vals if node.attrs["which"] == "values" else idxs
            pos = x.dims.index(r)
            lowest = int_neutral("max", dtype) if dtype.is_int else 'float("-inf")'
            work = self.var(b, self.masked(x, r, lowest, ty), x.dims, ty)
            vals = self.var(b, f"tl.zeros({[self.t.block[d] for d in dims]}, {ty})", dims, ty)
            idxs = self.var(b, f"tl.zeros({[self.t.block[d] for d in dims]}, tl.int64)", dims, "tl.int64")
            red = Val("", tuple(d for d in x.dims if d != r), "")
            ri, ki = self.idx(r, x.dims), kexpr
            best = self.align(Val("best", red.dims, ""), x.dims)
            # torch's order: NaN above everything (it propagates through the max and
            # matches itself), ties by index; a lane once taken is out, so that a row's
            # -inf entries, or its NaNs, each come once (overwriting the taken lane
            # with -inf let a later step take it again)
            # (selects, not & and |: Triton's interpreter refuses bit ops on some mask tiles)
            match = f"live == {best}" if dtype.is_int else f"tl.where(live != live, {best} != {best}, live == {best})"
            taken = self.var(b, f"tl.zeros({[self.t.block[d] for d in x.dims]}, tl.int32)", x.dims, "tl.int32")
            b.lines += [
                f"for kk in tl.static_range({node.attrs['k']}):",
                f"    live = tl.where({taken.name} != 0, {lowest}, {work.name})",
                f"    best = {'tl.max' if dtype.is_int else 'reduce_max'}(live, {pos})",
                f"    hit = tl.min(tl.where({taken.name} != 0, {self.t.block[r]}, tl.where({match}, {ri}, "
                f"{self.t.block[r]})), axis={pos})",
                f"    {vals.name} = tl.where({ki} == kk, {self.align(Val('best', red.dims, ''), dims)}, {vals.name})",
                f"    {idxs.name} = tl.where({ki} == kk, {self.align(Val('hit', red.dims, ''), dims)}, {idxs.name})",
                f"    {taken.name} = tl.where({ri} == {self.align(Val('hit', red.dims, ''), x.dims)}, 1, {taken.name})",
            ]
            b.cache[key] = (vals, idxs)
        vals, idxs = b.cache[key]
        return vals if node.attrs["which"] == "values" else idxs

    # -- loops ------------------------------------------------------------
    def prefetched(self, b: Block, node, addr: str, mask: str | None, cg: str, shape: list) -> str | None:
        """The name carrying an index tile loaded a step ahead (Target.index_prefetch), or
        None: only an integer tile in a loop body whose address and mask read no value of
        the body but the step's index, so that the next step's can be loaded in this one."""
        x = self.bodies.get(id(b))
        if not self.target.index_prefetch or x is None or node.dtype.is_float:
            return None
        assigned = {m.group(1) for line in b.lines if (m := re.match(r"(\w+) = ", line))} - {f"idx{x}"}
        if set(re.findall(r"[A-Za-z_]\w*", addr + (mask or ""))) & assigned:
            return None
        carried = f"pf{self.n}"
        self.n += 1
        self.prefetches.setdefault(id(b), []).append((carried, addr, mask, cg, shape))
        self.stats.index_prefetch = True
        return carried

    def prefetch_load(self, x, addr: str, mask: str | None, cg: str, shape: list, index: str, start: str,
                      hi: str) -> str:
        """An index tile's load at the step starting at `start` (`index` its idx), none
        where that step is past the segment's end `hi`. The guard is a tile of the load's
        shape: Triton's interpreter rejects a mask broadcast from a scalar compare."""
        at = lambda text: re.sub(rf"\bidx{x}\b", index, text)  # noqa: E731
        guard = f"(tl.full({shape}, 0, tl.int64) + {start} < {hi})"
        return f"tl.load({at(addr)}, mask=" + (f"({at(mask)}) & {guard}" if mask else guard) + f", other=0{cg})"

    def emit_loop(self, h: Block, loop: Loop):
        """Loop `loop` (decided by loops.py) rendered in block h, its accumulators cached there."""
        if loop in self.emitting:
            # its body reads a value that waits for the loop itself: this tiling's nest has a
            # cycle, and a ShapeError lets the scheduler try another tiling
            raise ShapeError(f"scheduler: the loop over X{loop.label} reads its own result "
                             f"(accumulators {[f'%{a.node.id}' for a in loop.accs]})")
        self.emitting.add(loop)
        x = loop.label
        dot_fed = [a.op == "matmul" or _computes_matmul(a.inputs[0]) for a in loop.accs]
        self.stats.side_reduction |= any(dot_fed) and not all(dot_fed)
        accs = {}
        for a in loop.accs:
            dims = self.dims(a.labels)
            kind = _acc_kind(a)
            shape = [self.t.block[d] for d in dims]
            # an integer reduction stays in its integer type: exact (and a count of segment ids
            # may index a load)
            if a.node.dtype.is_int:
                ty = TL[a.node.dtype]
                init = f"tl.full({{s}}, {int_neutral(kind, a.node.dtype)}, {ty})"
            else:
                ty = "tl.float32"
                init = f"tl.zeros({{s}}, {ty})" if kind == "sum" else f"tl.full({{s}}, {NEUTRAL[kind]}, tl.float32)"
            accs[id(a)] = self.var(h, init.format(s=shape), dims, ty, prefix="acc")
            self.stats.acc_elems += max(1, _prod(shape))
        bx = self.t.block[x]
        trips = -(-D.evaluate(self.labels[x].extent, self.env) // bx)
        # Each segment is one `for` over a range of tiles with the same body, except that
        # a mask known to hold on all its tiles is left out (tiles skipping: bounds.py).
        deferred = {}
        for seg in segments(self, h, x, loop.accs, trips):
            body = Block(h, h.chain + (x,), trips=h.trips * trips * seg.fraction)
            self.loop_chains.add(body.chain)
            self.keep, self.whole = seg.keep, (x if seg.full else None)
            self.bodies[id(body)] = x
            self.loop_body(body, loop, accs, deferred)
            del self.bodies[id(body)]
            self.keep, self.whole = {}, None
            h.lines += [f"{sym} = {render(b)}" for sym, b in seg.defs]
            # index tiles carried a step ahead: the first step's loaded before the loop,
            # each next one at the end of the step (none past the segment)
            off = f" + {self.windows[x].off}" if x in self.windows else ""
            lo, hi = render(seg.lo), render(seg.hi)
            for carried, addr, mask, cg, shape in self.prefetches.pop(id(body), ()):
                h.lines.append(f"{carried} = " + self.prefetch_load(
                    x, addr, mask, cg, shape, f"({lo}{off} + tl.arange(0, {bx}))", lo, hi))
                body.lines.append(f"{carried} = " + self.prefetch_load(
                    x, addr, mask, cg, shape, f"(idx{x} + {bx})", f"(start{x} + {bx})", hi))
            self.searched |= any(isinstance(b, Search) for _, b in seg.defs)
            h.lines.append(f"for start{x} in range({render(seg.lo)}, {render(seg.hi)}, {bx}):")
            h.lines += ["    " + line for line in body.lines]
        for a, full in deferred.values():
            kind, acc = _acc_kind(a), accs[id(a)]
            out = tuple(d for d in full.dims if d != x)
            part = self.var(h, REDUCE_IN_TILE[kind].format(x=full.name, axis=full.dims.index(x)), out, "tl.float32")
            h.lines.append(f"{acc.name} = " + COMBINE[kind].format(a=acc.name, b=self.align(part, acc.dims)))
        for a in loop.accs:
            h.cache[id(a)] = accs[id(a)]
        self.emitting.discard(loop)

    def deferred_tile(self, h: Block, loop: Loop, a, x: Val, acc: Val, deferred: dict) -> Val | None:
        """The accumulator, shaped as the step's tile, of a float sum, max or min (or a
        contraction off the tensor cores) over the loop's label that nothing in the loop
        reads or rescales: each step adds its tile lane by lane, and the tile is reduced
        once after the loop. Reduced every step, each load could feed shuffles across
        lanes before the next was issued (ptxas kept one 16-byte load in flight a thread
        in the MatMul->RowSum row sum that took 3x its twin's time)."""
        r, kind = a.reduced.id, _acc_kind(a)
        if a.node.dtype.is_int or kind not in ("sum", "max", "min") or r != loop.label or r not in x.dims \
                or x.scale is not None or self.t.block[r] == 1 or loop.scaled[a]:  # rescaled each step: online softmax
            return None
        # the step's own dims: a step constant along one of the result's (a [64] masked sum
        # into a [256] row) stays its size, broadcast once after the loop
        dims = x.dims
        if id(a) not in deferred:
            shape = [self.t.block[d] for d in dims]
            init = f"tl.zeros({shape}, tl.float32)" if kind == "sum" else f"tl.full({shape}, {NEUTRAL[kind]}, tl.float32)"
            deferred[id(a)] = (a, self.var(h, init, dims, "tl.float32", prefix="acc"))
            # The model counts a loop's largest tile twice over (in f32, and as loaded): the
            # first such accumulator takes the f32 copy's place, as each element is added
            # when converted (ptxas: 96 registers a thread for a 64 x 256 bf16 step at 8
            # warps, where the model counted 193 with both).
            shared = 0 if self.stats.deferred else self.stats.loop_elems
            self.stats.deferred = True
            self.stats.acc_elems += max(0, _prod(shape) - shared)
        full = deferred[id(a)][1]
        if any(d not in full.dims for d in x.dims):  # another segment's tile varies otherwise
            raise ShapeError(f"scheduler: internal: reduce %{a.node.id}'s steps vary over {x.dims}, its tile over {full.dims}")
        return full

    def loop_body(self, body: Block, loop: Loop, accs, deferred: dict):
        x = loop.label
        off = f" + {self.windows[x].off}" if x in self.windows else ""
        body.lines.append(f"idx{x} = start{x}{off} + {self.arange(x)}")
        # Several MatMuls each step computes whole (S = q·Kᵀ of each row tile a program
        # holds, row_halves.py) are issued first, before a softmax waits on one of them,
        # so the tensor cores run beside it. One alone is emitted where it is read.
        dots = step_dots(loop, self.t)
        for inst in dots if len(dots) > 1 else ():
            self.value(body, inst)
        alphas = {}
        for a in loop.accs:
            acc = accs[id(a)]
            scale = [alphas[c] for c in loop.scaled[a]]
            if scale:
                factor = " * ".join(self.align(s, acc.dims) for s in scale)
                body.lines.append(f"{acc.name} = {acc.name} * {factor}")
            if a.op == "matmul":
                lhs, rhs = self.ensure(body, a.inputs[0]), self.ensure(body, a.inputs[1])
                part = self.dot(body, a, lhs, rhs, acc.dims, acc=acc.name, tile_acc=None if scale else (
                    lambda dims, a=a, acc=acc: self.deferred_tile(body.parent, loop, a, Val("", dims, ""), acc, deferred)))
                if part is not None:
                    body.lines.append(f"{acc.name} = {part.name}")
                continue
            kind = a.node.attrs["op"]
            x = self.value(body, a.inputs[0])
            x = x if kind in SCALED_REDUCE else self.unscaled(body, x)
            full = None if a in loop.factors else self.deferred_tile(body.parent, loop, a, x, acc, deferred)
            if full is not None:
                step = self.var(body, self.masked(x, a.reduced.id, NEUTRAL[kind]), x.dims, "tl.float32")
                body.lines.append(f"{full.name} = " + COMBINE[kind].format(a=full.name, b=self.align(step, full.dims)))
                continue
            part = self.partial_reduce(body, a, x)
            if a in loop.factors:
                old = self.var(body, acc.name, acc.dims, acc.ty, prefix="old")
                body.lines.append(f"{acc.name} = " + COMBINE[kind].format(a=acc.name, b=self.align(part, acc.dims)))
                if a in loop.rescale:
                    r = fcode(loop.rescale[a], {Y_OLD: old.name, Y_NEW: acc.name})
                    alphas[a] = self.var(body, f"tl.where({old.name} == {acc.name}, 1.0, {r})", acc.dims,
                                         "tl.float32", prefix="alpha")
                if kind in ("max", "min"):
                    # An empty prefix leaves the neutral -inf (+inf for min): read it as 0 in
                    # the separated node. A max of +inf is a value: the sum taken relative
                    # to it is NaN, as torch's inf - inf (read as 0, it gave 0 for the
                    # row's finite entries; tests/test_softmax_specials.py).
                    neutral = "-" if kind == "max" else ""
                    body.cache[id(a)] = self.var(body, f"tl.where({acc.name} == float(\"{neutral}inf\"), 0.0, {acc.name})",
                                                 acc.dims, "tl.float32", prefix="run")
                else:
                    body.cache[id(a)] = acc
            else:
                body.lines.append(f"{acc.name} = " + COMBINE[kind].format(a=acc.name, b=self.align(part, acc.dims)))

    # -- the kernel -------------------------------------------------------
    def program(self, name: str, symbols: list, dynamic: list) -> tuple[str, list, list]:
        fn = self.function(name, symbols, dynamic)
        return module([fn]), fn.bufs, fn.grid

    def function(self, name: str, symbols: list, dynamic: list, tile_args: bool = False,
                 extra_bufs: tuple = (), epilogue: tuple = ()) -> "Function":
        """The kernel as a jitted function. With `tile_args` its grid labels' tile ids are
        parameters (`tid<label>`, after the symbols) instead of decoded from the program id:
        another kernel calls it for tiles it chooses (combine.py). `extra_bufs` are pointer
        parameters the body does not read itself, `epilogue` lines that run after the stores."""
        top = self.top = Block(None, ())
        g = self.spec.views.graph
        order, tiles, grouped = self.grid_order(tile_args)
        n_tiles = " * ".join(tiles[lid] for lid in order) or "1"
        # Persistent: a plain tiled GEMM, one MatMul accumulated in its loop, and nothing
        # read beside it in the epilogue that varies along its columns. On the H200 (triton
        # 3.6) a persistent loop with a residual tile read in its epilogue ran 4-1000x slower
        # (Llama's down projection 1.6-53 ms against 0.37; RESULTS.md, 2026-12-01 session 3),
        # and with that tile loaded after the K loop still 1.9-3.5x (Llama's and Qwen3's,
        # session 19); a bias 9% slower (GPT-2's, session 35): in the wgmma accumulator's
        # layout a thread holds a quarter of the columns, so a column vector is dozens of
        # registers. A thread holds two of every sixteen rows: a row vector (RMSNorm's row
        # scale) costs it a few, and persistence took that GEMM from 0.3256 to 0.3104 ms
        # (H100, session 40). SwiGLU's two accumulators 2.7 ms against 1.8; attention's
        # softmax loops are not flattened either.
        gemm = [a.op for a in self.accs] == ["matmul"]
        columns = unit_label(self.accs[0].view[-1], self.views.by_sym()) if gemm else None
        epilogue_tiles = any(inst.leaf and self.dims(inst.labels) and
                             (columns is None or columns.id in inst.labels) and
                             not any(self.t.role[lid] == "loop" for lid in inst.labels)
                             for inst in self.views.memo.values())
        self.persistent = not tile_args and grouped and gemm and not epilogue_tiles
        wide = self.wide()
        pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
        top.lines += self.full_lanes()
        for st in self.spec.stores:
            v = self.ensure(top, st.inst)
            self.store(top, st, v)
        top.lines += list(epilogue)
        self.stats.outer_steps, self.stats.outer_step_bytes = self.outer_load_steps()
        if tile_args:
            # a tensor of the offsets' type, also where the caller passes a plain int
            decode = [f"tid{lid} = tl.zeros([], {'tl.int64' if wide else 'tl.int32'}) + tid{lid}" for lid in order] + \
                [f"idx{lid} = {self.lanes(lid)}" for lid in order if self.t.block[lid] > 1]
        else:
            # The decode goes before the body but is written after it: the loops emitted in
            # the body tell which tile ids to decode heaviest first (tile_order.py).
            decode = [f"pid = {'tile' if self.persistent else pid}"] + \
                self.decode(order, tiles, grouped, descending(self.stats.loops))
        top.lines = decode + top.lines
        if self.persistent:
            # The next tile's loads are in flight while this tile's epilogue converts its
            # result through shared memory: both are live at once. Measured on the H200
            # (triton 3.6; RESULTS.md, 2026-12-01 session 3): a 128x256 GEMM at 4 stages fit in 192
            # KiB with its full tiles stored as they are, and asked 192 + 64 KiB (its bf16
            # tile) with a masked store (dynamic rows). Where this is short, the launcher
            # drops a stage.
            self.stats.epilogue_smem = self.stats.masked_store_bytes
            # A persistent kernel: each program runs tiles pid, pid + programs, ... (the
            # launcher starts min(tiles, SMs x resident programs) of them), in grouped order.
            # Flattened with its K loop, unless a combine runs after that loop: triton 3.6
            # fails to fuse the two around its `if` (TritonGPUFuseNestedLoops: "scf.if op
            # region control flow edge ...", a split-K GEMM's s_k = 4 plan at 4096 x 4096 x
            # 6144; RESULTS.md, session 40), and prints the whole module as it fails.
            flatten = ", flatten=True" if not epilogue else ""
            top.lines = [f"for tile in tl.range({pid}, {n_tiles}, tl.num_programs(0){flatten}):"] + \
                ["    " + ln for ln in top.lines]
        bufs = []
        for inst in self.views.memo.values():
            if inst.leaf:
                bufs.append(buffer_name(g, inst.node))
        outs = [st.buffer for st in self.spec.stores]
        bufs = list(dict.fromkeys(sorted(set(bufs)) + outs + list(extra_bufs)))
        params = [f"{b}_ptr" for b in bufs] + [arg for arg, _, _ in self.descriptor_args()] + \
            [s if s in dynamic else f"{s}: tl.constexpr" for s in symbols]
        params += [f"tid{lid}" for lid in self.canon_grid()] if tile_args else []
        params += ["TMA: tl.constexpr"] if self.descriptors else []  # the launcher's switch to pointer loads
        dns = f"(do_not_specialize={sorted(s for s in symbols if s in dynamic)!r})" \
            if any(s in dynamic for s in symbols) and not tile_args else ""
        comment = [f"# X{lab.id}: extent {D.fmt(lab.extent)}, {self.t.role[lab.id]}, block {self.t.block[lab.id]}"
                   + (f" over {self.t.step[lab.id]} indices" if lab.id in self.t.step else "")
                   for lab in self.views.labels]
        lines = comment + [f"@triton.jit{dns}", f"def {name}({', '.join(params)}):"] + \
            ["    " + ln for ln in top.lines]
        return Function(name, lines, bufs, [self.grid()], self.searched)

    def wide(self) -> bool:
        """Whether offsets are int64: int32 when every buffer (and a tile of overhang)
        stays below 2**31 elements, which a dynamic extent does not promise."""
        return any(self.numel(inst.node) >= 2 ** 30 for inst in self.views.memo.values() if inst.leaf) or \
            any(self.numel(st.node) >= 2 ** 30 for st in self.spec.stores) or bool(self.dynamic)

    def full_lanes(self) -> list[str]:
        """The lanes of each label a program holds whole (`idx<label>`), made once at its top."""
        used = set()
        for inst in self.views.memo.values():
            used |= inst.labels | ({inst.reduced.id} if inst.reduced else set())
        return [f"idx{lab.id} = {self.arange(lab.id)}" for lab in self.views.labels
                if self.t.role[lab.id] == "full" and self.t.block[lab.id] > 1 and lab.id in used]

    def grid_order(self, tile_args: bool = False) -> tuple[list, dict, bool]:
        """The grid labels, fastest varying first; each one's tile count (code); and
        whether two tiled MatMul sides decode in grouped order."""
        order = list(reversed(self.canon_grid()))
        tiles = {lid: self.grid_tiles(lid) for lid in order}
        grouped = not tile_args and len(order) >= 2 and all(self.t.block[i] > 1 for i in order[:2]) and \
            set(order[:2]) <= dot_labels(self.views)
        return order, tiles, grouped

    def grid(self) -> str:
        """The launch's program count (host code: `cdiv`, `max`), one per tile of each grid label."""
        terms = []
        for lid in reversed(self.canon_grid()):
            bx = self.t.period(lid)
            term = f"cdiv({code(self.labels[lid].extent)}, {bx})" if bx > 1 else code(self.labels[lid].extent)
            terms.append(f"max({term}, 1)" if lid in self.one_tile_at_least else term)
        return " * ".join(terms) or "1"

    def outer_load_steps(self) -> tuple[float, float]:
        """Steps per program of the loops that load tiles around an inner loop, and the
        bytes such a step loads: Triton pipelines innermost loops only, so each such step
        waits for its loads (MLA paged decode with its 512-wide contraction looped in
        128-column steps inside the key loop: 0.22 ms on the H200 against 0.13 with the
        contraction whole; RESULTS.md, 2026-12-02 session 15)."""
        def outer(chain):
            return any(len(c) > len(chain) and c[:len(chain)] == chain for c in self.loop_chains)
        # the longest body: a loop split in segments (bounds.py) runs most steps in its
        # full one, a tile or so in each edge
        steps, per_step = 0.0, {}
        for chain, trips, nbytes in self.load_steps:
            if outer(chain):
                steps = max(steps, trips)
                per_step[chain] = per_step.get(chain, 0) + nbytes
        return steps, max(per_step.values(), default=0)

    def decode(self, order: list, tiles: dict, grouped: bool, backwards: set) -> list:
        """The lines that decode `pid` into each grid label's tile id (`order`: fastest
        varying first), the ids of the labels in `backwards` counted from their last tile."""
        def tile_id(lid, e):
            return f"{tiles[lid]} - 1 - ({e})" if lid in backwards else e

        lines = []
        if grouped:
            # Two tiled MatMul sides: GROUP rows of tiles run together so that a wave of
            # programs reuses their A rows and B columns from L2 (grouped program order).
            n_id, m_id = order[:2]
            nt, mt = tiles[n_id], tiles[m_id]
            lines += [f"pmn = pid % ({mt} * {nt})", f"pid = pid // ({mt} * {nt})",
                      f"first = pmn // ({GROUP} * {nt}) * {GROUP}",
                      f"rows = tl.minimum({mt} - first, {GROUP})",
                      f"tid{m_id} = " + tile_id(m_id, f"first + (pmn % ({GROUP} * {nt})) % rows"),
                      f"tid{n_id} = " + tile_id(n_id, f"(pmn % ({GROUP} * {nt})) // rows")]
            order = order[2:]
            for lid in (n_id, m_id):
                lines.append(f"idx{lid} = {self.lanes(lid)}")
        for lid in order:
            bx = self.t.block[lid]
            lines.append(f"tid{lid} = " + tile_id(lid, f"pid % {tiles[lid]}"))
            lines.append(f"pid = pid // {tiles[lid]}")
            if bx > 1:
                lines.append(f"idx{lid} = {self.lanes(lid)}")
        return lines

    def descriptor_args(self) -> list:
        """[argument, buffer, block] of each TMA descriptor the kernel reads through."""
        return [[arg, buf, list(block)] for (buf, block), arg in self.descriptors.items()]

    def grid_tiles(self, lid: int) -> str:
        bx, ext = self.t.period(lid), code(self.labels[lid].extent)
        tiles = f"(({ext} + {bx - 1}) // {bx})" if bx > 1 else ext
        return f"max({tiles}, 1)" if lid in self.one_tile_at_least else tiles

    def canon_grid(self) -> list:
        return [lab.id for lab in self.spec.root_labels]

    def store(self, b: Block, st, v: Val):
        dims = self.dims(self.views.labels_of(st.view))
        names = self.names(dims)
        shape = st.node.shape
        mask = {}
        view = [sympy.sympify(e) for e in st.view]
        strides = [sympy.Mul(*shape[k + 1:]) for k in range(len(shape))]
        folded = merged_offset(sum((e * s for e, s in zip(view, strides)), sympy.Integer(0)),
                               {lab.sym: lab.extent for lab in self.views.labels})
        if folded is not None:  # no integer division per stored element
            terms = [code(folded, names)]
        else:
            terms = [f"{code(e, names)} * {code(s)}" if s != 1 else code(e, names)
                     for e, s in zip(view, strides) if e != 0]
        for lid in self.views.labels_of(st.view):
            m = self.valid(lid, dims)
            if m:
                mask[m] = {lid}
        for k, e in enumerate(view):  # a program's later tiles of a label (Tiling.unroll) may pass the end
            if self.views.labels_of([e]) & set(self.t.unroll):
                _, hi = self.bounds(e)
                if hi is None or not provable(shape[k] - 1 - hi):
                    mask[f"({code(e, names)} < {code(shape[k])})"] = self.views.labels_of([e])
        ty = self.buffer_dtype(st.node)
        self.stats.traffic(st.buffer, self.distinct(dims) * _ITEMSIZE[ty], self.numel(st.node) * _ITEMSIZE[ty])
        addr = f"{st.buffer}_ptr" + (" + " + " + ".join(terms) if terms else "")
        value = self.align(v, dims)
        if v.dims != dims and v.dims and dims:
            value = f"tl.broadcast_to({value}, {[self.t.block[d] for d in dims]})"
        elif not v.dims and dims:
            value = f"{self.filled(dims, '0', v.ty)} + {value}"
        m = self.mask(mask, dims) if mask else ""
        if mask:
            lanes = _prod([self.t.block[d] for d in dims])
            self.stats.masked_store_bytes = max(self.stats.masked_store_bytes, lanes * _ITEMSIZE[ty])
        b.lines.append(f"tl.store({addr}, {convert(value, ty)}{m})")


# Math the CPU interpreter cannot take from libdevice, in f32 (each within a few ulp),
# written into a kernel's module where its body calls it. NaN is propagated with
# selects: tl.maximum/minimum drop it on the GPU.
MATH = {
    # the sign bit: true for -0.0 and a negative NaN too. Through an integer of x's width:
    # a 0-d f64 (a float argument, or a size's `d ** -0.5` under dynamic=True) stays f64.
    "negative": [
        "def negative(x):",
        "    if x.dtype.primitive_bitwidth == 64:  # if/else: compiled, code after an early return is built too",
        "        sign = x.to(tl.int64, bitcast=True) < 0",
        "    else:",
        "        sign = x.to(tl.int32, bitcast=True) < 0",
        "    return sign",
    ],
    # C's pow, as torch's: |a|^b through exp and log, negated where a's sign bit is set
    # and b is an odd integer (pow(-0., -1) = -inf), NaN for a negative finite base and
    # a fractional exponent (not -inf: pow(-inf, 1.5) = inf), and 1 for b = 0, a = 1,
    # and a = -1 with b = +-inf. Nested selects, not `&` of comparisons: with a scalar
    # exponent, Triton's CPU interpreter broadcasts a comparison as floats.
    "pow_f32": [
        "def pow_f32(a, b):",
        "    mag = tl.exp(tl.log(tl.abs(a)) * b)",
        "    whole = tl.floor(b) == b",
        "    odd = tl.where(whole, tl.floor(b * 0.5) * 2.0 != b, False)",
        "    r = tl.where(negative(a), tl.where(odd, -mag, mag), mag)",
        "    r = tl.where(a < 0.0, tl.where(whole, r, tl.where(a == -float(\"inf\"), r, float(\"nan\"))), r)",
        "    r = tl.where(a == -1.0, tl.where(tl.abs(b) == float(\"inf\"), 1.0, r), r)",
        "    return tl.where(b == 0.0, 1.0, tl.where(a == 1.0, 1.0, r))",
    ],
    # atan(t), t = min(|x|, |y|) / max(|x|, |y|) in [0, 1], past tan(pi/8) as
    # pi/4 + atan((t - 1) / (t + 1)); then mirrored into the operands' quadrant.
    # Cephes' atanf polynomial on |u| <= tan(pi/8): about 1e-7 relative.
    "atan2_f32": [
        "def atan2_f32(y, x):",
        "    ax = tl.abs(x)",
        "    ay = tl.abs(y)",
        "    hi = tl.maximum(ax, ay)",
        "    lo = tl.minimum(ax, ay)",
        "    t = tl.where(hi == 0.0, 0.0, tl.where(lo == float(\"inf\"), 1.0, lo / hi))",
        "    big = t > 0.41421356237309503",
        "    u = tl.where(big, (t - 1.0) / (t + 1.0), t)",
        "    z = u * u",
        "    p = (((0.0805374449538 * z - 0.138776856032) * z + 0.199777106478) * z - 0.333329491539) * z * u + u",
        "    r = tl.where(big, 0.7853981633974483 + p, p)",
        "    r = tl.where(ay > ax, 1.5707963267948966 - r, r)",
        "    r = tl.where(negative(x), 3.141592653589793 - r, r)",
        "    r = tl.where(negative(y), -r, r)",
        "    return tl.where(x != x, x, tl.where(y != y, y, r))",
    ],
    # max * sqrt(1 + (min / max)^2): no overflow before the result's; inf beside a NaN (C's hypot)
    "hypot_f32": [
        "def hypot_f32(a, b):",
        "    hi = tl.maximum(tl.abs(a), tl.abs(b))",
        "    lo = tl.minimum(tl.abs(a), tl.abs(b))",
        "    q = tl.where(hi == 0.0, 0.0, lo / hi)",
        "    r = tl.where(a != a, a, tl.where(b != b, b, hi * tl.sqrt(1.0 + q * q)))",
        "    r = tl.where(tl.abs(b) == float(\"inf\"), float(\"inf\"), r)",
        "    return tl.where(tl.abs(a) == float(\"inf\"), float(\"inf\"), r)",
    ],
    # erfc to f32's relative precision where it is tiny (1 - erf(x) is 0 past x = 4): the
    # Chebyshev fit t exp(-x^2 + P(t)), t = 1 / (1 + |x| / 2), of Numerical Recipes' erfcc
    # (fractional error under 1.2e-7), reflected as 2 - erfc(-x) below 0; x^2 as h^2, exact
    # for h = x in 1/16ths, and the small rest, which f32 rounds 100 times less
    "erfc_f32": [
        "def erfc_f32(x):",
        "    z = tl.abs(x)",
        "    z = tl.where(z > 16.0, 16.0, z)  # erfc(16) is 0 in f32; z * 16 below overflows from 2e37",
        "    t = 1.0 / (1.0 + 0.5 * z)",
        "    p = 0.17087277",
        "    p = -0.82215223 + p * t",
        "    p = 1.48851587 + p * t",
        "    p = -1.13520398 + p * t",
        "    p = 0.27886807 + p * t",
        "    p = -0.18628806 + p * t",
        "    p = 0.09678418 + p * t",
        "    p = 0.37409196 + p * t",
        "    p = 1.00002368 + p * t",
        "    p = -1.26551223 + p * t",
        "    h = tl.floor(z * 16.0) * 0.0625",
        "    r = t * tl.exp(-h * h) * tl.exp((h - z) * (z + h) + p)",
        "    return tl.where(x < 0.0, 2.0 - r, r)",
    ],
    # Giles' single-precision erfinv ("Approximating the erfinv function", 2010):
    # w = -log(1 - x^2), one polynomial in w below 5 and one in sqrt(w) above;
    # +-1 give +-inf, |x| > 1 NaN (the log of a negative).
    "erfinv_f32": [
        "def erfinv_f32(x):",
        "    w = -tl.log((1.0 - x) * (1.0 + x))",
        "    a = w - 2.5",
        "    p = 2.81022636e-08",
        "    p = 3.43273939e-07 + p * a",
        "    p = -3.5233877e-06 + p * a",
        "    p = -4.39150654e-06 + p * a",
        "    p = 0.00021858087 + p * a",
        "    p = -0.00125372503 + p * a",
        "    p = -0.00417768164 + p * a",
        "    p = 0.246640727 + p * a",
        "    p = 1.50140941 + p * a",
        "    c = tl.sqrt(w) - 3.0",
        "    q = -0.000200214257",
        "    q = 0.000100950558 + q * c",
        "    q = 0.00134934322 + q * c",
        "    q = -0.00367342844 + q * c",
        "    q = 0.00573950773 + q * c",
        "    q = -0.0076224613 + q * c",
        "    q = 0.00943887047 + q * c",
        "    q = 1.00167406 + q * c",
        "    q = 2.83297682 + q * c",
        "    r = tl.where(w < 5.0, p, q) * x",
        "    return tl.where(tl.abs(x) == 1.0, x * float(\"inf\"), r)",
    ],
}


@dataclass
class Function:
    """One jitted function of a kernel's module: its lines (comments, decorator, def),
    the buffers its pointer parameters name, in order, and the kernel's grid."""
    name: str
    lines: list[str]
    bufs: list[str]
    grid: list[str]
    searched: bool  # it calls monotone.FIRST_AT_LEAST


def module(functions: list[Function]) -> str:
    """A kernel's source: the shared helpers its functions call, then the functions (a
    function is defined before the one that calls it)."""
    body = "\n".join(ln for fn in functions for ln in fn.lines)
    src = ["import os", "", "import triton", "import triton.language as tl", "",
           INTERPRETED_LINE,
           "# Triton's CPU interpreter computes bf16 tl.dot wrongly; it gets fp32 operands there.",
           "DOT_BF16 = tl.constexpr(tl.float32 if INTERPRETED else tl.bfloat16)",
           ""] + ROUND_BF16 + ["", ""] + \
        (FIRST_AT_LEAST + ["", ""] if any(fn.searched for fn in functions) else []) + math_helpers(body)
    for i, fn in enumerate(functions):
        src += (["", ""] if i else []) + fn.lines
    return "\n".join(src) + "\n"


def math_helpers(body: str) -> list[str]:
    """The MATH functions `body` calls, directly or through another, callees first."""
    used, text = [], body
    for name in reversed(MATH):  # a helper only calls those defined before it
        if f"{name}(" in text:
            used.insert(0, name)
            text += "\n".join(MATH[name])
    return [line for name in used for line in ["@triton.jit", *MATH[name], "", ""]]




# Whether Triton's CPU interpreter runs the kernel: TRITON_INTERPRET read as Triton reads
# it (1, true, on, yes, y); `== "1"` alone let "true" run bf16 dots the interpreter gets wrong.
INTERPRETED_LINE = ("INTERPRETED = tl.constexpr(os.environ.get(\"TRITON_INTERPRET\", \"\").lower() "
                    "in (\"1\", \"true\", \"on\", \"yes\", \"y\"))")

# A cast to bf16 rounds to nearest even on the GPU; Triton's CPU interpreter truncates,
# so there the rounding is done on the bits first (the cast is then exact).
ROUND_BF16 = [
    "",
    "@triton.jit",
    "def to_bf16(x):",
    "    if INTERPRETED:",
    "        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)",
    "        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000",
    "        x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))",
    "    return x.to(tl.bfloat16)",
    "",
    "",
    "@triton.jit",
    "def mul(a, b):",
    "    return a * b",
] + [line for op, form in (("max", NAN_MAX), ("min", NAN_MIN)) for line in [
    "",
    "",
    "@triton.jit",
    f"def {op}_nan(a, b):",
    "    return " + form.format(a="a", b="b"),
    "",
    "",
    # A reduction with its own combine runs element by element in Triton's CPU
    # interpreter (1.4 s for a 128 x 128 tile against 4 ms): there tl.max/min, with NaN
    # put back where a lane held one.
    "@triton.jit",
    f"def reduce_{op}(x, AXIS: tl.constexpr):",  # upper case: no symbol's `s: tl.constexpr` reads in it
    "    if INTERPRETED:",
    f"        r = tl.where(tl.sum((x != x).to(tl.float32), AXIS) > 0, float(\"nan\"), tl.{op}(x, AXIS))",
    "    else:",
    f"        r = tl.reduce(x, AXIS, {op}_nan)",
    "    return r",
]]


def convert(value: str, ty: str) -> str:
    return f"to_bf16({value})" if ty == "tl.bfloat16" else f"{value}.to({ty})"


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def fact_table(facts) -> dict:
    """Separable facts keyed by the F node's id, with the rescale parsed."""
    out = {}
    for f in facts:
        out[f.node] = (f.factor, parse_rescale(f.rescale))
    return out


def zero_padded_load(split):
    """(load, gathered) when split instance `split` reads a masked load, possibly behind
    casts, reshapes, permutes and gathers through a loaded index, whose mask (or its index
    load's) holds where the split's merged index is in range, so that every lane past it
    can hold 0; gathered: only once the load takes its index load's mask
    (`Emitter.masked_gathers`). None otherwise: an index past a slice's stop may still
    lie inside the tensor, a broadcast drops the index, and a reshape that merges the
    axis with others wraps an index past its extent back into the tensor (`% m`)."""
    axis, inst = split.node.attrs["axis"], split.inputs[0]
    merged = split.view[axis] * split.node.shape[axis + 1] + split.view[axis + 1]
    extent = split.node.inputs[0].shape[axis]
    gathered, loads = False, []
    while inst.op in ("cast", "reshape", "permute", "take", "gather"):
        if inst.op in ("take", "gather"):
            index = _direct_load(inst.inputs[1])
            if index is None:
                return None
            gathered = True
            loads.append(index)
        inst = inst.inputs[0]
    if inst.op != "load":
        return None
    # a load masks `merged < extent` where it indexes a dim of that extent with it
    if not any(sympy.expand(e - merged) == 0 and sympy.expand(d - extent) == 0
               for x in [inst, *loads] for e, d in zip(x.view, x.node.shape)):
        return None
    return inst, gathered


def _direct_load(inst):
    """The load under inst seen through reshapes and permutes only (its Val carries the
    load's mask), or None."""
    while inst.op in ("reshape", "permute"):
        inst = inst.inputs[0]
    return inst if inst.op == "load" else None
