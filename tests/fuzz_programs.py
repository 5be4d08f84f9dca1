"""Random tensor programs for the differential fuzz (tests/test_fuzz.py), and the
worker process that runs them through `cleave.compile` next to eager PyTorch.

A program is Python source text: a `def prog(x, ...)` of 3 to 8 statements over the
ops cleave captures, with one dynamic axis `n` (see README, "Compile once, serve
every shape"). Source text, rather than a closure, makes a failure report a
reproducer: the report prints the program, its sizes, its seed and a script.

Programs are well defined by construction, never filtered afterwards. Every value
carries an interval that encloses what any implementation computes for it (exact
arithmetic, eager's rounding, cleave's): each op's interval is the exact op's
image widened by that op's rounding. An op is only applied where its domain is
safe on the whole interval (log of values >= 0.01, sqrt and rsqrt >= 0.05,
divisors at least 0.5 away from 0, exp of values <= 3), and reductions that are
undefined on an empty axis (mean, amax, amin, logsumexp) never run over n when a
call has n = 0: no eager result is NaN or inf, and eager never raises.

Each output is compared with eager (same dtypes) and with the same program run in
float64 (every cast to bf16 becomes a cast to float64). Errors are
max|got - want| / max(max|want|, 1): inputs are O(1), so an output much smaller
than its inputs comes from cancellation, whose rounding is at the inputs' scale.
How close is close enough depends on where the output's precision was lost,
tracked per value (`Value.category`):
- "f32": only f32 arithmetic upstream. f32 rounding differences (fused sums,
  reassociation) measure ~1e-6 against fp64 over thousands of programs; TIGHT
  (1e-4) leaves a wide margin and still catches any real error.
- "round-trip": an explicit narrowing cast (`.to(torch.bfloat16)`) of a computed
  value upstream, otherwise exact or f32. cleave must keep the cast, so against
  eager TIGHT holds, except that a value within f32 noise of a bf16 rounding
  boundary may round the other way: a tenth of the elements may be off by up to
  the bf16 bound. A deleted cast moves nearly every element by ~2^-9.
- "bf16-ops": an op computing in bf16. cleave computes such ops in f32 and rounds
  where the program casts (rules/lower.py's precision policy), eager rounds after
  each op: they differ by a few bf16 half-ulps (<= 2^-8 relative each). LOOSE
  (2e-2, five of them) bounds that, or twice eager's own distance from fp64 where
  a sum of rounded terms makes that larger.
Against fp64, "f32" outputs must be within TIGHT, the others within the bf16 bound.
A program whose eager result is itself far from fp64 (TIGHT for "f32", CONDITION
for the others) is ill-conditioned: the generator's fault, reported as invalid.
Compares (`torch.where`) only read "f32" values, where both sides agree to ~1e-7,
against a constant or an input: a different branch is (almost) never taken.
"""
from __future__ import annotations

import json
import math
import os
import random
import select
import subprocess
import sys
import tempfile
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from pathlib import Path

from hypothesis import strategies as st

from cleave.ir.dtypes import dtype as ir_dtype

# --- sizes -------------------------------------------------------------------

DYNAMIC_SIZES = (0, 1, 3, 5, 7, 9, 11)   # the dynamic axis n, called at two of them
STATIC_SIZES = (1, 3, 5, 7)
MAX_ELEMENTS = 400                        # per value, at the largest n: the interpreter's cost grows with it
MAX_MAGNITUDE = 1e3                       # keeps every value's interval (and its rounding) small
MAX_INPUTS = 5
INPUT_NAMES = ("x", "y", "z", "w", "u")

TIGHT = 1e-4   # "f32" outputs, and most elements of "round-trip" ones
LOOSE = 2e-2   # "bf16-ops" outputs, and the rare bf16 boundary flips of "round-trip" ones
FLIP_SHARE = 0.1  # of a round-trip output's elements may round the other way
CONDITION = 0.1   # eager in bf16 farther than this from fp64: the program is ill-conditioned


@dataclass(frozen=True)
class Dyn:
    """A dim that is `mult` times the dynamic size n (cat along n gives 2n, a merge with 3 gives 3n)."""
    mult: int = 1

    def __str__(self):
        return "n" if self.mult == 1 else f"{self.mult} * n"


def dim_size(dim, n: int) -> int:
    return dim.mult * n if isinstance(dim, Dyn) else dim


def dim_range(dim, sizes) -> tuple[int, int]:
    """Smallest and largest extent of a dim over the program's calls."""
    return (dim_size(dim, min(sizes)), dim_size(dim, max(sizes)))


def broadcast(*shapes):
    """torch's broadcast of shapes whose dims are ints or Dyn; None where they do not broadcast at every n."""
    out = []
    for dims in zip_longest(*(reversed(s) for s in shapes), fillvalue=1):
        wide = {d for d in dims if d != 1}
        if len(wide) > 1:
            return None
        out.append(wide.pop() if wide else 1)
    return tuple(reversed(out))


# --- intervals ----------------------------------------------------------------

def widen(lo: float, hi: float, dtype: str) -> tuple[float, float]:
    """The interval of an op's result, grown by its rounding: half a bf16 ulp is at
    most 2^-8 relative; 1e-6 covers f32 rounding of short sums and reorderings."""
    mag = max(abs(lo), abs(hi))
    eps = mag * (2.0 ** -8 if dtype == "bf16" else 1e-6) + 1e-30
    return lo - eps, hi + eps


def products(a, b) -> tuple[float, float]:
    p = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return min(p), max(p)


def silu(v: float) -> float:
    return v / (1.0 + math.exp(-v))


def silu_range(lo, hi):
    # silu falls to its minimum -0.2785 at -1.2785, then rises: the max is at an end
    low = -0.2785 if lo < -1.2785 < hi else min(silu(lo), silu(hi))
    return low, max(silu(lo), silu(hi))


def square_range(lo, hi):
    low = 0.0 if lo <= 0 <= hi else min(lo * lo, hi * hi)
    return low, max(lo * lo, hi * hi)


def sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


# --- program model ----------------------------------------------------------

@dataclass(eq=False)
class Value:
    name: str
    shape: tuple
    dtype: str                 # "f32" | "bf16"
    lo: float
    hi: float
    rounded: bool = False      # a narrowing cast of a computed value upstream
    lowp_op: bool = False      # an op that rounds to bf16 upstream
    is_input: bool = False
    uses: int = 0

    @property
    def category(self) -> str:
        return "bf16-ops" if self.lowp_op else "round-trip" if self.rounded else "f32"

    @property
    def magnitude(self) -> float:
        return max(abs(self.lo), abs(self.hi))


@dataclass
class InputSpec:
    name: str
    shape: list                # ints, and {"dyn": mult} for the dynamic axis
    dtype: str
    lo: float
    hi: float


@dataclass
class Program:
    inputs: list[InputSpec]
    body: list[str]            # statements of prog, without indentation
    outputs: list[str]
    categories: list[str]      # per output: "f32" | "round-trip" | "bf16-ops"
    sizes: tuple               # the dynamic size n of the three calls
    seed: int
    ops: list[str] = field(default_factory=list)   # op kinds used, for reports

    def source(self, fp64: bool = False) -> str:
        """`def prog(...)`; with fp64 every cast goes to float64 (the exact reference)."""
        args = ", ".join(i.name for i in self.inputs)
        lines = [f"def prog({args}):", *("    " + s for s in self.body), f"    return {', '.join(self.outputs)}"]
        text = "\n".join(lines) + "\n"
        if fp64:
            text = text.replace("torch.bfloat16", "torch.float64").replace(".float()", ".double()")
        return text

    @property
    def dynamic(self) -> dict:
        """cleave.compile's dynamic argument: every input axis of extent n."""
        out = {}
        for spec in self.inputs:
            axes = {k: "n" for k, d in enumerate(spec.shape) if isinstance(d, dict)}
            if axes:
                out[spec.name] = axes
        return out

    def input_code(self, n: int, seed: int) -> str:
        """Statements building the inputs for size n: uniform in each input's range,
        drawn in float64 from a seeded generator, then cast (bf16 inputs are exact)."""
        lines = [f"g = torch.Generator().manual_seed({seed})"]
        for spec in self.inputs:
            dims = ", ".join(str(d["dyn"] * n) if isinstance(d, dict) else str(d) for d in spec.shape)
            dims += "," if len(spec.shape) == 1 else ""
            lines.append(f"{spec.name} = (torch.rand(({dims}), generator=g, dtype=torch.float64) "
                         f"* {spec.hi - spec.lo!r} + {spec.lo!r}).to(torch.{ir_dtype(spec.dtype).torch_name})")
        return "\n".join(lines)

    def repro(self) -> str:
        """A script that runs this program through cleave.compile at its three sizes."""
        names = ", ".join(i.name for i in self.inputs)
        calls = [f"# call {k + 1}: n = {n}\n{self.input_code(n, self.seed + k)}\n"
                 f"print('n = {n}, max |cleave - eager| per output:', "
                 f"[(o.double() - e.double()).abs().max().item() if e.numel() else None "
                 f"for o, e in zip(as_tuple(f({names})), as_tuple(prog({names})))])"
                 for k, n in enumerate(self.sizes)]
        return "\n".join([
            "import torch, torch.nn.functional as F, cleave",
            self.source().rstrip(),
            "as_tuple = lambda t: t if isinstance(t, tuple) else (t,)",
            f"f = cleave.compile(prog, dynamic={self.dynamic!r})",
            *calls,
        ])

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Program":
        data = json.loads(text)
        data["inputs"] = [InputSpec(**i) for i in data["inputs"]]
        data["sizes"] = tuple(data["sizes"])
        return cls(**data)


# --- the builder: values, inputs and statements ------------------------------

class Unavailable(Exception):
    """This op cannot be applied to the program built so far; the generator draws another."""


class Builder:
    def __init__(self, choose: "Choices", sizes: tuple, statics: list[int]):
        self.choose, self.sizes, self.statics = choose, sizes, statics
        self.values: list[Value] = []
        self.inputs: list[InputSpec] = []
        self.body: list[str] = []
        self.ops: list[str] = []
        self.uses_n = False

    # sizes
    @property
    def may_be_empty(self) -> bool:
        return 0 in self.sizes

    def max_elements(self, shape) -> int:
        return math.prod(dim_range(d, self.sizes)[1] for d in shape)

    def static(self) -> int:
        return self.choose.pick(self.statics)

    # values
    def pick(self, ok=lambda v: True) -> Value:
        """An operand: half the time the latest value nothing reads yet (programs grow
        into one connected DAG rather than a forest), else any value passing `ok`."""
        options = [v for v in reversed(self.values) if ok(v)]
        if not options:
            raise Unavailable
        fresh = [v for v in options if not v.uses and not v.is_input]
        if fresh and self.choose.flip():
            return fresh[0]
        return self.choose.pick(options)

    def new_input(self, shape, dtype: str = "f32", lo: float = -2.0, hi: float = 2.0) -> Value:
        if len(self.inputs) >= MAX_INPUTS or any(isinstance(d, Dyn) and d.mult != 1 for d in shape):
            raise Unavailable   # an input of extent 2n would be a second, unrelated symbol for torch.export
        name = INPUT_NAMES[len(self.inputs)]
        self.inputs.append(InputSpec(name, [{"dyn": d.mult} if isinstance(d, Dyn) else d for d in shape],
                                     dtype, lo, hi))
        value = Value(name, tuple(shape), dtype, lo, hi, is_input=True)
        self.values.append(value)
        return value

    def operand_or_input(self, ok, shape, dtype="f32", lo=-2.0, hi=2.0) -> Value:
        """An existing value passing `ok`, or (drawn, or when there is none) a new input."""
        try:
            if self.choose.flip():
                return self.pick(ok)
        except Unavailable:
            pass
        return self.new_input(shape, dtype, lo, hi)

    def emit(self, op: str, expr: str, operands, shape, dtype: str, lo: float, hi: float,
             rounds: bool = True, casts: bool = False) -> Value:
        """Add `v<k> = expr`. `rounds`: the op rounds its result (layout ops, neg, abs,
        max and min are exact); `casts`: it is a narrowing cast to bf16."""
        shape = tuple(shape)
        if self.max_elements(shape) > MAX_ELEMENTS:
            raise Unavailable
        if rounds:
            lo, hi = widen(lo, hi, dtype)
        if not (math.isfinite(lo) and math.isfinite(hi)) or max(abs(lo), abs(hi)) > MAX_MAGNITUDE:
            raise Unavailable
        value = Value(f"v{len(self.body) + 1}", shape, dtype, lo, hi,
                      rounded=casts or any(o.rounded for o in operands),
                      lowp_op=(rounds and not casts and dtype == "bf16") or any(o.lowp_op for o in operands))
        for o in operands:
            o.uses += 1
        self.values.append(value)
        self.body.append(f"{value.name} = {expr}")
        self.ops.append(op)
        return value

    def mark(self) -> tuple[int, int]:
        return len(self.values), len(self.inputs)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Forget the inputs an op created before it turned out Unavailable."""
        self.values, self.inputs = self.values[:mark[0]], self.inputs[:mark[1]]

    def size_expr(self, dim) -> str:
        """A reshape argument: ints as they are, n read off the first input (`n = x.shape[k]`)."""
        if isinstance(dim, Dyn):
            self.uses_n = True
        return str(dim)

    def axis(self, value: Value) -> int:
        if not value.shape:
            raise Unavailable
        return self.choose.integer(0, len(value.shape) - 1)

    def signed_axis(self, value: Value, axis: int) -> int:
        """Axes are written either way torch accepts them: 1 or -1."""
        return axis - len(value.shape) if self.choose.flip() else axis


def promote(*dtypes) -> str:
    return "f32" if "f32" in dtypes else "bf16"


def pure(v: Value) -> bool:
    """Both eager and cleave compute it to f32 accuracy: safe to compare against a threshold."""
    return not v.rounded and not v.lowp_op


# --- ops ----------------------------------------------------------------------
# Each op draws its operands and emits one statement, or raises Unavailable.

UNARY = {  # name: (template, domain check on the operand's interval, image of the interval)
    "exp": ("torch.exp({})", lambda lo, hi: hi <= 3.0, lambda lo, hi: (math.exp(lo), math.exp(hi))),
    "tanh": ("torch.tanh({})", None, lambda lo, hi: (math.tanh(lo), math.tanh(hi))),
    "log": ("torch.log({})", lambda lo, hi: lo >= 0.01, lambda lo, hi: (math.log(lo), math.log(hi))),
    "sqrt": ("torch.sqrt({})", lambda lo, hi: lo >= 0.05, lambda lo, hi: (math.sqrt(lo), math.sqrt(hi))),
    "rsqrt": ("torch.rsqrt({})", lambda lo, hi: lo >= 0.05, lambda lo, hi: (hi ** -0.5, lo ** -0.5)),
    "sigmoid": ("torch.sigmoid({})", None, lambda lo, hi: (sigmoid(lo), sigmoid(hi))),
    "silu": ("F.silu({})", None, silu_range),
    "square": ("{} ** 2", None, square_range),
    "cube": ("torch.pow({}, 3)", None, lambda lo, hi: (lo ** 3, hi ** 3)),
    "pow": ("torch.pow({}, 1.5)", lambda lo, hi: lo >= 0.05, lambda lo, hi: (lo ** 1.5, hi ** 1.5)),
    "pow_neg": ("{} ** -0.5", lambda lo, hi: lo >= 0.05, lambda lo, hi: (hi ** -0.5, lo ** -0.5)),
    "abs": ("{}.abs()", None, lambda lo, hi: (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)),
                                             max(abs(lo), abs(hi)))),
    "neg": ("-{}", None, lambda lo, hi: (-hi, -lo)),
}
EXACT_UNARY = {"abs", "neg"}


def op_unary(b: Builder) -> Value:
    name = b.choose.pick(list(UNARY))
    template, domain, image = UNARY[name]
    ok = (lambda v: domain(v.lo, v.hi)) if domain else (lambda v: True)
    try:
        a = b.pick(ok)
    except Unavailable:  # no value in the domain: a positive input, shaped like a value (or the first input)
        like = b.pick()
        a = b.new_input(like.shape, like.dtype, 0.5, 2.0)
    lo, hi = image(a.lo, a.hi)
    return b.emit(name, template.format(a.name), [a], a.shape, a.dtype, lo, hi, rounds=name not in EXACT_UNARY)


BINARY = {  # name: (template, interval)
    "add": ("{} + {}", lambda a, c: (a[0] + c[0], a[1] + c[1])),
    "sub": ("{} - {}", lambda a, c: (a[0] - c[1], a[1] - c[0])),
    "mul": ("{} * {}", products),
    "div": ("{} / {}", lambda a, c: products(a, (1.0 / c[1], 1.0 / c[0]))),
    "maximum": ("torch.maximum({}, {})", lambda a, c: (max(a[0], c[0]), max(a[1], c[1]))),
    "minimum": ("torch.minimum({}, {})", lambda a, c: (min(a[0], c[0]), min(a[1], c[1]))),
}
CONSTANTS = (0.5, 2.0, -1.5, 3.0, 0.25)
DIVISORS = (2.0, -1.5, 0.75, 4.0)        # bounded away from 0


def divisor_ok(v: Value) -> bool:
    return v.lo >= 0.5 or v.hi <= -0.5


def op_binary(b: Builder) -> Value:
    name = b.choose.pick(list(BINARY))
    template, image = BINARY[name]
    a = b.pick()
    choice = b.choose.pick(["value", "input", "scalar"])
    if choice == "scalar" and name in ("add", "sub", "mul", "div"):
        c = b.choose.pick(DIVISORS if name == "div" else CONSTANTS)
        if name != "div" and b.choose.flip():   # the scalar on the left: 2.0 - v
            lo, hi = image((c, c), (a.lo, a.hi))
            return b.emit(name, template.format(c, a.name), [a], a.shape, a.dtype, lo, hi)
        lo, hi = image((a.lo, a.hi), (c, c))
        return b.emit(name, template.format(a.name, c), [a], a.shape, a.dtype, lo, hi)
    fits = (lambda v: broadcast(a.shape, v.shape) is not None and (name != "div" or divisor_ok(v)))
    if choice == "value":
        c = b.pick(fits)
    else:  # a new input broadcasting against a: same shape, its last dim (a bias), or a column (keepdim)
        shapes = [a.shape, a.shape[-1:], a.shape[:-1] + (1,)] if a.shape else [()]
        shape = b.choose.pick(shapes)
        c = b.new_input(shape, b.choose.pick(["f32", a.dtype]),
                        *((0.5, 2.0) if name == "div" else (-2.0, 2.0)))
    exact = name in ("maximum", "minimum")
    dtype = promote(a.dtype, c.dtype)
    lo, hi = image((a.lo, a.hi), (c.lo, c.hi))
    return b.emit(name, template.format(a.name, c.name), [a, c], broadcast(a.shape, c.shape), dtype, lo, hi,
                  rounds=not exact)


def over_n(dim) -> str:
    """Marks a reduction over the dynamic axis in the op list (the reports count them: n may be 0)."""
    return " over n" if isinstance(dim, Dyn) else ""


def reduced_shape(shape, axis: int, keepdim: bool) -> tuple:
    return shape[:axis] + ((1,) if keepdim else ()) + shape[axis + 1:]


def op_reduce(b: Builder) -> Value:
    a = b.pick(lambda v: len(v.shape) >= 1)
    axis = b.axis(a)
    kind = b.choose.pick(["sum", "mean", "amax", "amin"])
    dim = a.shape[axis]
    if isinstance(dim, Dyn) and b.may_be_empty and kind != "sum":
        raise Unavailable  # mean of nothing is NaN, amax of nothing an error: only sum is defined at n = 0
    keepdim = b.choose.flip()
    k_min, k_max = dim_range(dim, b.sizes)
    if kind == "sum":
        lo, hi = min(a.lo * k_min, a.lo * k_max), max(a.hi * k_min, a.hi * k_max)
    else:
        lo, hi = a.lo, a.hi
    keep = ", keepdim=True" if keepdim else ""
    return b.emit(kind + over_n(dim), f"{a.name}.{kind}({b.signed_axis(a, axis)}{keep})", [a],
                  reduced_shape(a.shape, axis, keepdim), a.dtype, lo, hi, rounds=kind in ("sum", "mean"))


# exp turns an absolute error into a relative one, and softmax, log_softmax and
# logsumexp depend on absolute differences of their inputs: a bf16-rounded input of
# magnitude 8 carries up to 8 * 2^-9 = 1.6% of such error, under LOOSE. (exp itself
# only takes arguments <= 3, and its large outputs are what the error is scaled by.)
ROUNDED_SOFTMAX_MAGNITUDE = 8.0


def softmax_input_ok(v: Value) -> bool:
    return len(v.shape) >= 1 and (pure(v) or v.magnitude <= ROUNDED_SOFTMAX_MAGNITUDE)


def op_softmax(b: Builder) -> Value:
    a = b.pick(softmax_input_ok)
    axis = b.axis(a)
    kind = b.choose.pick(["softmax", "log_softmax", "logsumexp"])
    dim = a.shape[axis]
    k_min, k_max = dim_range(dim, b.sizes)
    spread = a.hi - a.lo
    ax = b.signed_axis(a, axis)
    if kind == "softmax":   # each share is at least exp(-spread) / k
        return b.emit(kind + over_n(dim), f"torch.softmax({a.name}, dim={ax})", [a], a.shape, a.dtype,
                      math.exp(-spread) / max(k_max, 1), 1.0)
    if kind == "log_softmax":
        return b.emit(kind + over_n(dim), f"torch.log_softmax({a.name}, dim={ax})", [a], a.shape, a.dtype,
                      -spread - math.log(max(k_max, 1)), 0.0)
    if k_min == 0:
        raise Unavailable  # logsumexp of nothing is -inf
    keepdim = b.choose.flip()
    keep = ", keepdim=True" if keepdim else ""
    return b.emit(kind + over_n(dim), f"torch.logsumexp({a.name}, dim={ax}{keep})", [a],
                  reduced_shape(a.shape, axis, keepdim), a.dtype, a.lo + math.log(k_min), a.hi + math.log(k_max))


def op_matmul(b: Builder) -> Value:
    a = b.pick(lambda v: len(v.shape) >= 2)
    k = a.shape[-1]
    if b.choose.flip() and len(a.shape) == 3:   # torch.bmm: (B, P, K) @ (B, K, M)
        m = b.static()
        shape = (a.shape[0], k, m)
        c = b.operand_or_input(lambda v: v.shape[:2] == shape[:2] and len(v.shape) == 3 and v.dtype == a.dtype,
                               shape, a.dtype)
        expr, out = f"torch.bmm({a.name}, {c.name})", a.shape[:2] + c.shape[2:]
    else:   # a (..., K) @ c (K, M)
        m = b.static()
        c = b.operand_or_input(lambda v: len(v.shape) == 2 and v.shape[0] == k and v.dtype == a.dtype,
                               (k, m), a.dtype)
        expr, out = f"{a.name} @ {c.name}", a.shape[:-1] + c.shape[-1:]
    bound = dim_range(k, b.sizes)[1] * a.magnitude * c.magnitude
    return b.emit(("bmm" if "bmm" in expr else "matmul") + over_n(k), expr, [a, c], out, a.dtype, -bound, bound)


def op_transpose(b: Builder) -> Value:
    a = b.pick(lambda v: len(v.shape) >= 2)
    i, j = b.choose.pick([(p, q) for p in range(len(a.shape)) for q in range(p + 1, len(a.shape))])
    shape = list(a.shape)
    shape[i], shape[j] = shape[j], shape[i]
    return b.emit("transpose", f"{a.name}.transpose({b.signed_axis(a, i)}, {j})", [a], shape, a.dtype,
                  a.lo, a.hi, rounds=False)


def op_unsqueeze(b: Builder) -> Value:
    a = b.pick(lambda v: len(v.shape) <= 2)
    axis = b.choose.integer(0, len(a.shape))
    shape = a.shape[:axis] + (1,) + a.shape[axis:]
    return b.emit("unsqueeze", f"{a.name}.unsqueeze({axis})", [a], shape, a.dtype, a.lo, a.hi, rounds=False)


def splits(dim) -> list[tuple]:
    """The ways to reshape one dim into two: a dynamic 3n into (n, 3) or (3, n); a
    static size into two factors above 1."""
    if isinstance(dim, Dyn):
        return [(Dyn(1), dim.mult), (dim.mult, Dyn(1))] if dim.mult > 1 else []
    return [(p, dim // p) for p in range(2, dim) if dim % p == 0]


def merge(d1, d2):
    if isinstance(d1, Dyn) and isinstance(d2, Dyn):
        return None
    if isinstance(d1, Dyn) or isinstance(d2, Dyn):
        dyn, k = (d1, d2) if isinstance(d1, Dyn) else (d2, d1)
        return Dyn(dyn.mult * k)
    return d1 * d2


def op_reshape(b: Builder) -> Value:
    a = b.pick(lambda v: len(v.shape) >= 1)
    merges = [i for i in range(len(a.shape) - 1) if merge(a.shape[i], a.shape[i + 1]) is not None]
    split_at = [(i, s) for i, d in enumerate(a.shape) for s in splits(d)] if len(a.shape) < 3 else []
    moves = [("merge", i) for i in merges] + [("split", s) for s in split_at]
    if not moves:
        raise Unavailable
    kind, where = b.choose.pick(moves)
    if kind == "merge":
        shape = a.shape[:where] + (merge(a.shape[where], a.shape[where + 1]),) + a.shape[where + 2:]
    else:
        i, parts = where
        shape = a.shape[:i] + parts + a.shape[i + 1:]
    args = ", ".join(b.size_expr(d) for d in shape) if shape else ""
    return b.emit("reshape", f"{a.name}.reshape({args})" if len(shape) != 1 else f"{a.name}.reshape({args},)",
                  [a], shape, a.dtype, a.lo, a.hi, rounds=False)


def op_slice(b: Builder) -> Value:
    a = b.pick(lambda v: any(isinstance(d, int) and d >= 2 for d in v.shape))
    axis = b.choose.pick([i for i, d in enumerate(a.shape) if isinstance(d, int) and d >= 2])
    size = a.shape[axis]
    start = b.choose.integer(0, size - 1)
    stop = b.choose.integer(start + 1, size)
    step = b.choose.pick([1, 1, 1, 2])   # a step is a graph break (the whole function runs eagerly): rarer
    text = f"{start or ''}:{stop if stop != size else ''}" + (f":{step}" if step != 1 else "")
    index = ", ".join([":"] * axis + [text])
    shape = a.shape[:axis] + (len(range(start, stop, step)),) + a.shape[axis + 1:]
    return b.emit("slice", f"{a.name}[{index}]", [a], shape, a.dtype, a.lo, a.hi, rounds=False)


def op_cat(b: Builder) -> Value:
    a = b.pick(lambda v: len(v.shape) >= 1)
    axis = b.axis(a)

    def fits(v):
        return (len(v.shape) == len(a.shape) and all(p == q for k, (p, q) in enumerate(zip(v.shape, a.shape))
                                                    if k != axis) and type(v.shape[axis]) is type(a.shape[axis]))

    other = list(a.shape)
    other[axis] = Dyn(1) if isinstance(a.shape[axis], Dyn) else b.static()
    c = b.operand_or_input(fits, other, b.choose.pick(["f32", a.dtype]))
    d1, d2 = a.shape[axis], c.shape[axis]
    shape = list(a.shape)
    shape[axis] = Dyn(d1.mult + d2.mult) if isinstance(d1, Dyn) else d1 + d2
    return b.emit("cat", f"torch.cat([{a.name}, {c.name}], dim={b.signed_axis(a, axis)})", [a, c], shape,
                  promote(a.dtype, c.dtype), min(a.lo, c.lo), max(a.hi, c.hi), rounds=False)


def op_where(b: Builder) -> Value:
    # A compare against another computed value can tie by algebra (log(exp(x)) >= x)
    # and then fall either way with rounding: the threshold is a constant or an input.
    cond = b.pick(pure)
    compare = b.choose.pick([">", "<", ">=", "<="])
    if b.choose.flip():
        rhs, rhs_shape, rhs_vals = repr(b.choose.pick([0.0, 0.5, -0.5, 1.0])), (), []
    else:
        other = b.pick(lambda v: v.is_input and v is not cond and broadcast(cond.shape, v.shape) is not None)
        rhs, rhs_shape, rhs_vals = other.name, other.shape, [other]
    shape = broadcast(cond.shape, rhs_shape)
    yes = b.pick(lambda v: broadcast(shape, v.shape) is not None)
    shape = broadcast(shape, yes.shape)
    if b.choose.flip():
        no = b.pick(lambda v: broadcast(shape, v.shape) is not None)
        shape, no_name, no_vals, dtype = broadcast(shape, no.shape), no.name, [no], promote(yes.dtype, no.dtype)
        lo, hi = min(yes.lo, no.lo), max(yes.hi, no.hi)
    else:
        c = b.choose.pick([0.0, -1.0, 1.5])
        no_name, no_vals, dtype, lo, hi = repr(c), [], yes.dtype, min(yes.lo, c), max(yes.hi, c)
    return b.emit("where", f"torch.where({cond.name} {compare} {rhs}, {yes.name}, {no_name})",
                  [cond, *rhs_vals, yes, *no_vals], shape, dtype, lo, hi, rounds=False)


NORM_EPS = 0.01  # bounds 1/sqrt(var + eps) by 10: a near-constant row does not amplify rounding without limit


def op_norm(b: Builder) -> Value:
    kind = b.choose.pick(["layer_norm", "rms_norm", "rms_by_hand"])
    # layer_norm subtracts the mean: an input rounded to bf16 whose rows vary little
    # against their mean would have its rounding amplified (by |x| / std), so it
    # normalizes unrounded values only. RMS normalization has no such cancellation.
    a = b.pick(lambda v: len(v.shape) >= 1 and isinstance(v.shape[-1], int) and (kind != "layer_norm" or pure(v)))
    k = a.shape[-1]
    operands, weight = [a], ""
    if kind != "rms_by_hand" and b.choose.flip():
        w = b.new_input((k,), a.dtype, 0.5, 1.5)
        operands, weight = [a, w], f", weight={w.name}"
    bound = math.sqrt(k) * (1.5 if weight else 1.0)   # |x - mean| / std <= sqrt(k)
    if kind == "layer_norm":
        expr = f"F.layer_norm({a.name}, ({k},){weight}, eps={NORM_EPS})"
    elif kind == "rms_norm":
        expr = f"F.rms_norm({a.name}, ({k},){weight}, eps={NORM_EPS})"
    else:
        expr = f"{a.name} * torch.rsqrt({a.name}.pow(2).mean(-1, keepdim=True) + {NORM_EPS})"
    return b.emit(kind, expr, operands, a.shape, a.dtype, -bound, bound)


def op_cast(b: Builder) -> Value:
    kind = b.choose.pick(["to_bf16", "round_trip", "to_f32"])
    if kind == "to_f32":
        a = b.pick(lambda v: v.dtype == "bf16")
        return b.emit(kind, f"{a.name}.float()", [a], a.shape, "f32", a.lo, a.hi, rounds=False)
    a = b.pick(lambda v: v.dtype == "f32")
    lo, hi = widen(a.lo, a.hi, "bf16")
    cast = f"{a.name}.to(torch.bfloat16)" + (".float()" if kind == "round_trip" else "")
    return b.emit(kind, cast, [a], a.shape, "f32" if kind == "round_trip" else "bf16", lo, hi,
                  rounds=False, casts=True)


# Simple ops first: hypothesis shrinks a failing program towards them. Unary and
# binary ops come twice: each stands for many ops, and they are what the others feed.
OPS = [op_unary, op_binary, op_reduce, op_softmax, op_cast, op_unary, op_binary, op_transpose, op_reshape,
       op_slice, op_unsqueeze, op_cat, op_matmul, op_where, op_norm]


# --- where the choices come from -------------------------------------------------

class Choices:
    """The generator's decisions. Hypothesis draws them for `programs()` (it explores
    edge cases and can shrink); a seeded random.Random for `program_from_seed`,
    whose programs spread evenly over the ops (hypothesis's derandomized examples
    cluster around its simplest ones, too few kinds of program for a CI budget of 30)."""

    def __init__(self, draw=None, rng=None):
        self.draw, self.rng = draw, rng

    def pick(self, options):
        options = list(options)
        return self.draw(st.sampled_from(options)) if self.draw else self.rng.choice(options)

    def flip(self) -> bool:
        return self.draw(st.booleans()) if self.draw else self.rng.random() < 0.5

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi)) if self.draw else self.rng.randint(lo, hi)


def first_input_shape(choose: Choices, statics, n_max: int) -> tuple:
    """Rank 1 to 3, n on any axis, static dims from the program's pool, within MAX_ELEMENTS."""
    shape = [choose.pick(statics) for _ in range(choose.integer(1, 3) - 1)]
    while math.prod(shape) * n_max > MAX_ELEMENTS:
        shape.pop()
    shape.insert(choose.integer(0, len(shape)), Dyn(1))
    return tuple(shape)


def build_program(choose: Choices, min_ops: int = 3, max_ops: int = 8) -> Program:
    n1 = choose.pick(DYNAMIC_SIZES)
    n2 = choose.pick([s for s in DYNAMIC_SIZES if s != n1])
    statics = [choose.pick(STATIC_SIZES) for _ in range(choose.integer(2, 3))]
    b = Builder(choose, (n1, n2), statics)
    b.new_input(first_input_shape(choose, statics, max(n1, n2)), choose.pick(["f32", "f32", "bf16"]))
    wanted = choose.integer(min_ops, max_ops)
    for _ in range(4 * wanted):
        if len(b.body) == wanted:
            break
        mark = b.mark()
        try:
            choose.pick(OPS)(b)
        except Unavailable:
            b.rollback(mark)
    if not b.body:   # every op drawn was unavailable: tanh applies to anything
        x = b.values[0]
        b.emit("tanh", f"torch.tanh({x.name})", [x], x.shape, x.dtype, -1.0, 1.0)
    if b.uses_n:
        first = b.inputs[0]
        axis = next(k for k, d in enumerate(first.shape) if isinstance(d, dict))
        b.body.insert(0, f"n = {first.name}.shape[{axis}]")
    outputs = [v for v in b.values if not v.is_input and not v.uses]
    return Program(b.inputs, b.body, [v.name for v in outputs], [v.category for v in outputs],
                   (n1, n2, n1), choose.integer(0, 2 ** 31 - 1), b.ops)


@st.composite
def programs(draw, min_ops: int = 3, max_ops: int = 8) -> Program:
    return build_program(Choices(draw=draw), min_ops, max_ops)


def program_from_seed(seed: int) -> Program:
    return build_program(Choices(rng=random.Random(seed)))


# --- checking one program (in the worker process) -------------------------------

def load(source: str):
    import torch
    import torch.nn.functional as F

    namespace = {"torch": torch, "F": F}
    exec(compile(source, "<fuzz program>", "exec"), namespace)
    return namespace["prog"]


def make_inputs(program: Program, n: int, seed: int) -> list:
    import torch

    namespace = {"torch": torch}
    exec(program.input_code(n, seed), namespace)
    return [namespace[i.name] for i in program.inputs]


def as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def relative_errors(got, want):
    """|got - want| per element, at the scale max(max|want|, 1) (see the module docstring)."""
    want = want.double()
    scale = max(want.abs().max().item(), 1.0) if want.numel() else 1.0
    return (got.double() - want).abs() / scale


def max_error(got, want) -> float:
    return relative_errors(got, want).max().item() if want.numel() else 0.0


@dataclass
class Tolerance:
    bound: float                 # every element
    tight: float | None = None   # and all but FLIP_SHARE of them (round-trip outputs)


def tolerance(category: str, eager_error: float) -> Tolerance:
    """How close cleave must be to eager for an output of this category; eager_error
    is eager's own distance from the fp64 evaluation. Where bf16 rounds, cleave (f32
    inside, rules/lower.py) sits about as far from eager as eager sits from exact
    arithmetic: it may differ by LOOSE, or by twice eager's own error where sums of
    rounded terms make that larger."""
    if category == "f32":
        return Tolerance(TIGHT)
    bound = max(LOOSE, 2 * eager_error)
    return Tolerance(bound, TIGHT if category == "round-trip" else None)


def mismatch(got, want, tol: Tolerance, what: str) -> str | None:
    """Why `got` is not within `tol` of `want`, or None."""
    import torch

    if got.shape != want.shape:
        return f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if not got.numel():
        return None
    err = relative_errors(got, want)
    worst = err.max().item()
    if not math.isfinite(worst):
        return f"{what}: {int((~torch.isfinite(got)).sum())} of {got.numel()} values are NaN/inf"
    if worst > tol.bound:
        return f"{what}: error {worst:.3g} > {tol.bound:.3g}"
    if tol.tight is not None:
        off = int((err > tol.tight).sum())
        if off > max(1, int(FLIP_SHARE * err.numel())):
            return f"{what}: {off}/{err.numel()} elements off by more than {tol.tight} (error up to {worst:.3g})"
    return None


def references(program: Program, prog, prog64, inputs) -> tuple[tuple, tuple, list[str]]:
    """Eager outputs in the program's dtypes, in fp64, and what makes the program
    invalid (the generator's fault): NaN/inf, or eager farther from fp64 than
    rounding explains (TIGHT for f32 outputs, CONDITION where bf16 rounds)."""
    import torch

    eager = as_tuple(prog(*inputs))
    exact = as_tuple(prog64(*(t.double() for t in inputs)))
    problems = []
    for k, (e, x, category) in enumerate(zip(eager, exact, program.categories)):
        if not torch.isfinite(e).all():
            problems.append(f"eager output {k} is not finite")
        elif max_error(e, x) > (TIGHT if category == "f32" else CONDITION):
            problems.append(f"eager output {k} is {max_error(e, x):.3g} from fp64 ({category}): ill-conditioned")
    return eager, exact, problems


def compare(program: Program, got: tuple, eager: tuple, exact: tuple) -> list[str]:
    """cleave's outputs against eager's and the fp64 evaluation's: dtype, shape, values."""
    if len(got) != len(eager):
        return [f"{len(got)} outputs, expected {len(eager)}"]
    problems = []
    for k, (g, e, x, category) in enumerate(zip(got, eager, exact, program.categories)):
        if g.dtype != e.dtype:
            problems.append(f"output {k} has dtype {g.dtype}, expected {e.dtype}")
        tol = tolerance(category, max_error(e, x))
        problems += filter(None, [mismatch(g, e, tol, f"output {k} vs eager"),
                                  mismatch(g, x, Tolerance(tol.bound), f"output {k} vs fp64")])
    return problems


RECOMPILE_KEYS = ("searches", "compiles", "from_cache", "operators", "graph_breaks")


def check(program: Program) -> dict:
    """Run the program at its three sizes through eager, fp64 eager and cleave.compile.
    status: ok | wrong | crash | recompiled | invalid (the generator's fault)."""
    import torch

    import cleave

    torch._dynamo.reset()  # dynamo keys state by file, line and name, the same for every program: none may leak
    verdict = {"status": "ok", "problems": [], "fallbacks": [], "stats": None, "second_call_recompiled": False}

    def fail(status, messages):
        if messages and verdict["status"] == "ok":
            verdict["status"] = status
        verdict["problems"] += messages

    prog, prog64 = load(program.source()), load(program.source(fp64=True))
    compiled = cleave.compile(prog, dynamic=program.dynamic)
    counters = []
    for call, n in enumerate(program.sizes):
        where = f"call {call + 1} (n={n}): "
        inputs = make_inputs(program, n, program.seed + call)
        try:
            eager, exact, invalid = references(program, prog, prog64, inputs)
        except Exception as err:  # noqa: BLE001 - reported: the generator made an invalid program
            invalid = [f"eager raised {type(err).__name__}: {err}"]
        if invalid:
            fail("invalid", [where + p for p in invalid])
            return verdict
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                got = as_tuple(compiled(*inputs))
            except Exception as err:  # noqa: BLE001 - a crash is reported with its traceback
                tb = traceback.format_exc().strip().splitlines()
                fail("crash", [f"{where}{type(err).__name__}: {err}\n    " + "\n    ".join(tb[-6:])])
                return verdict
        verdict["fallbacks"] += [str(w.message) for w in caught if str(w.message).startswith("cleave:")]
        fail("wrong", [where + p for p in compare(program, got, eager, exact)])
        counters.append({k: compiled.stats[k] for k in RECOMPILE_KEYS})
    verdict["stats"] = compiled.stats
    verdict["second_call_recompiled"] = counters[1] != counters[0]
    if counters[2] != counters[1]:
        fail("recompiled", [f"call 3 (n={program.sizes[2]}, as call 1) recompiled: {counters[1]} -> {counters[2]}"])
    return verdict


# --- the worker process and its client ------------------------------------------
# Programs run in a separate process: a segfault in Triton's interpreter (or a hang)
# must not take pytest down, and is then one program's crash, not the run's.

def worker_main() -> None:
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)           # prints from cleave or Triton go to stderr, not into the protocol
    sys.stdout = sys.stderr
    import torch
    torch.set_num_threads(1)  # the machine is shared
    for line in sys.stdin:
        program = Program.from_json(line)
        print(f"=== program seed {program.seed}\n{program.source()}", file=sys.stderr, flush=True)
        try:
            verdict = check(program)
        except Exception:  # noqa: BLE001 - a bug in this harness, reported as such
            verdict = {"status": "crash", "problems": ["harness: " + traceback.format_exc()], "fallbacks": [],
                       "stats": None, "second_call_recompiled": False}
        protocol.write(json.dumps(verdict) + "\n")
        protocol.flush()


class Worker:
    """Sends programs to a worker process, one at a time; starts a new one after a death or a timeout."""

    def __init__(self, cache_dir: Path, timeout: float = 180.0):
        self.cache_dir, self.timeout = Path(cache_dir), timeout
        self.proc: subprocess.Popen | None = None
        self.log = None

    def _start(self) -> None:
        env = dict(os.environ, CLEAVE_CACHE_DIR=str(self.cache_dir))
        env.setdefault("TRITON_INTERPRET", "1")
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)

    def _log_tail(self, lines: int = 15) -> str:
        self.log.seek(0)
        return "\n".join(self.log.read().splitlines()[-lines:])

    def run(self, program: Program) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.log.seek(0)
        self.log.truncate()
        self.proc.stdin.write(program.to_json() + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        if ready:
            self.proc.wait()
            why = f"worker died with exit status {self.proc.returncode}"
        else:
            self.proc.kill()
            self.proc.wait()
            why = f"timed out after {self.timeout:.0f} s"
        tail = self._log_tail()
        self.proc = None
        return {"status": "crash", "problems": [f"{why}; its stderr ends:\n{tail}"], "fallbacks": [],
                "stats": None, "second_call_recompiled": False}

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def report(program: Program, verdict: dict) -> str:
    """A failure as the test prints it: what went wrong, then a script that reproduces it."""
    problems = "\n".join("  - " + p for p in verdict["problems"])
    return (f"{verdict['status'].upper()}: seed {program.seed}, sizes n = {program.sizes}, "
            f"output categories {program.categories}\n{problems}\n--- reproducer ---\n{program.repro()}\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker_main()
