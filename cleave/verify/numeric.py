"""The numeric gate: both sides of a rule interpreted on random inputs, in fp64 and in f32.

It stands beside the provers because the algebra can hide what IEEE arithmetic
does (pads, empty chunks, -inf - -inf, infinities and NaN in the data, f32's range
and rounding): a rule passes only if this agrees too.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch

from ..interpreter import interpret
from ..ir import CleaveError, Graph
from ..ir.contracts import RuleInstance
from .bindings import Binding

_TIES = torch.tensor([-2.0, -1.0, 1.0, 2.0], dtype=torch.float64)

# (name, how floats are drawn): typical, wide (large exponents for softmax-style
# rules, still far from fp64 overflow), and few distinct values (ties for max/topk;
# no zeros: the provers' domain excludes zero divisors, see prove.py).
STYLES = (
    ("normal", lambda g, shape: torch.randn(shape, generator=g, dtype=torch.float64)),
    ("wide", lambda g, shape: 12 * torch.randn(shape, generator=g, dtype=torch.float64)),
    ("ties", lambda g, shape: _TIES[torch.randint(0, 4, shape, generator=g)]),
)
# The f32 leg's own: a large mean against a unit spread (a one-pass variance cancels
# there in f32), and values past exp's f32 range (|x| > 88: exp(x) is inf or 0 in f32;
# 1000 is past fp64's too, so these are compared in f32 only).
F32_STYLES = (
    ("offset", lambda g, shape: 1000 + torch.randn(shape, generator=g, dtype=torch.float64)),
    ("range", lambda g, shape: 60 * torch.randn(shape, generator=g, dtype=torch.float64)),
)

# The IEEE values a program's data may hold beyond the reals the provers see: a
# mask's -inf, an overflow's inf, 0/0's NaN, signed zeros and f32 subnormals.
SPECIALS = torch.tensor([-math.inf, math.inf, math.nan, 0.0, -0.0, 1e-40, -1e-40], dtype=torch.float64)
# A divisor's: the proofs take divisors non-zero, not finite (`(x + y) / y - 1 => x / y`
# turns the NaN of a y = exp(s) that overflowed into 0).
DIVISOR_SPECIALS = torch.tensor([-math.inf, math.inf, math.nan], dtype=torch.float64)

SPECIAL_DRAWS = 4

# The f32 leg's tolerance, in units of f32's epsilon of the output's largest value:
# a reassociation (a split sum, a moved scale) rounds differently by a few ulps of it,
# a rewrite that cancels or overflows where the program does not by far more.
F32_ULPS = 64
F32_EPS = torch.finfo(torch.float32).eps
F32_TINY = torch.finfo(torch.float32).tiny  # below f32's smallest normal: kernels flush subnormals to 0

# Ops an input passes through unchanged in value (a divisor broadcast to its operand's shape).
_LAYOUT_OPS = ("broadcast", "reshape", "permute", "slice", "cast", "concat")


def index_ranges(graph: Graph, env: Mapping[str, int]) -> dict[str, int]:
    """For integer inputs used as gather/take indices: the extent they index into."""
    out = {}
    for node in graph.live_nodes():
        if node.op in ("gather", "take") and node.inputs[1].op == "input":
            extent = graph.concrete_shape(node.inputs[0], env)[node.attrs["axis"]]
            name = node.inputs[1].attrs["name"]
            out[name] = min(out.get(name, extent), extent)
    return out


def random_inputs(graph: Graph, env: Mapping[str, int], style, gen: torch.Generator) -> dict[str, torch.Tensor]:
    ranges = index_ranges(graph, env)
    out = {}
    for name, node in graph.inputs.items():
        shape = graph.concrete_shape(node, env)
        if node.dtype.is_float:
            out[name] = style(gen, shape)
        elif str(node.dtype) == "bool":
            out[name] = torch.rand(shape, generator=gen) < 0.5
        else:
            out[name] = torch.randint(0, max(ranges.get(name, 4), 1), shape, generator=gen)
    return out


def masked_inputs(inst: RuleInstance, env: Mapping[str, int], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Normal inputs, with each element of the inputs `inst.masked` names set to -inf
    with probability 1/2, as a mask (`where(keep, x, -inf)`) leaves the scores of a
    softmax: at the gate's sizes some chunks of a split and some whole rows hold
    nothing else. The provers' inputs are finite reals; this is where -inf data is checked."""
    out = random_inputs(inst.lhs, env, STYLES[0][1], gen)
    for name in inst.masked:
        x = out[name]
        out[name] = x.masked_fill(torch.rand(x.shape, generator=gen) < 0.5, float("-inf"))
    return out


def _divisor_inputs(graph: Graph) -> set[str]:
    """The inputs the graph divides by (a div's divisor, a recip's or rsqrt's argument),
    directly or through layout ops: the provers' domain has them non-zero."""
    out: set[str] = set()
    for node in graph.live_nodes():
        args = node.inputs[1:2] if node.op == "div" else node.inputs[:1] if node.op in ("recip", "rsqrt") else []
        stack = list(args)
        while stack:
            x = stack.pop()
            if x.op == "input":
                out.add(x.attrs["name"])
            elif x.op in _LAYOUT_OPS:
                stack.extend(x.inputs)
    return out


def special_names(inst: RuleInstance) -> dict[str, torch.Tensor]:
    """The float inputs that may hold IEEE special values, and which: any, but for the
    left side's divisors (proofs hold where divisors are non-zero), which take no zero;
    none for the masked ones (their own style) and those a condition declares finite
    (flat, finite or nonzero)."""
    skip = set(inst.masked) | set(inst.finite)
    divisors = _divisor_inputs(inst.lhs)
    return {name: DIVISOR_SPECIALS if name in divisors else SPECIALS for name, node in inst.lhs.inputs.items()
            if node.dtype.is_float and name not in skip}


def special_inputs(inst: RuleInstance, env: Mapping[str, int], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Normal inputs, with each element of the special_names inputs set to one of its
    specials with probability 1/2: `where(p, x, 0) => mul(p, x)` holds on finite reals
    and is NaN where the program's masked_fill left x at -inf and p is false."""
    out = random_inputs(inst.lhs, env, STYLES[0][1], gen)
    for name, specials in special_names(inst).items():
        x = out[name]
        pick = specials[torch.randint(0, len(specials), x.shape, generator=gen)]
        out[name] = torch.where(torch.rand(x.shape, generator=gen) < 0.5, pick, x)
    return out


def _draws(inst: RuleInstance):
    """(name, draw(env, gen), whether fp64 compares it) per input style; masked only where
    the rule reduces values a mask can hide; special where a float input may hold any
    IEEE value; the f32 styles unless the rule is exempt from the f32 leg."""
    out = [(name, lambda env, gen, style=style: random_inputs(inst.lhs, env, style, gen), True)
           for name, style in STYLES]
    if inst.masked:
        out.append(("masked", lambda env, gen: masked_inputs(inst, env, gen), True))
    if special_names(inst):
        # drawn SPECIAL_DRAWS times per trial: a small binding has a few elements, and the
        # pair that breaks a rule (-inf where a mask is false) is one of many
        out += [("special", lambda env, gen: special_inputs(inst, env, gen), True)] * SPECIAL_DRAWS
    if not inst.f32_exempt:
        out += [(name, lambda env, gen, style=style: random_inputs(inst.lhs, env, style, gen), False)
                for name, style in F32_STYLES]
    return out


def _as_f32(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The float inputs rounded to f32 (a rule's instances are f32), held in fp64."""
    return {k: v.to(torch.float32).to(torch.float64) if v.dtype.is_floating_point else v for k, v in inputs.items()}


def evaluate(inst: RuleInstance, inputs: dict[str, torch.Tensor], env: Mapping[str, int],
             dtype: torch.dtype = torch.float64):
    """(lhs outputs, rhs outputs) computed in `dtype`; the rhs reads only the inputs it declares."""
    inputs = {k: v.to(dtype) if v.dtype.is_floating_point else v for k, v in inputs.items()}
    lhs = interpret(inst.lhs, inputs, compute_dtype=dtype, env=env)
    rhs_inputs = {k: v for k, v in inputs.items() if k in inst.rhs.inputs}
    rhs = interpret(inst.rhs, rhs_inputs, compute_dtype=dtype, env=env)
    return lhs, rhs


def first_mismatch(lhs: list[torch.Tensor], rhs: list[torch.Tensor]) -> str | None:
    """A description of the first differing output element, or None when all agree.
    NaN matches only NaN and an infinity only the same infinity."""
    for k, (a, b) in enumerate(zip(lhs, rhs)):
        if tuple(a.shape) != tuple(b.shape):
            return f"output {k}: lhs shape {list(a.shape)} vs rhs shape {list(b.shape)}"
        if not a.dtype.is_floating_point or not b.dtype.is_floating_point:
            bad = a.to(torch.float64) != b.to(torch.float64)
        else:
            a64, b64 = a.to(torch.float64), b.to(torch.float64)
            finite = torch.isfinite(a64) & torch.isfinite(b64)
            scale = max(1.0, float(torch.where(finite, a64.abs().maximum(b64.abs()), 0).max()) if a64.numel() else 1.0)
            close = (a64 - b64).abs() <= 1e-9 * scale + 1e-7 * a64.abs().maximum(b64.abs())
            same_special = (torch.isnan(a64) & torch.isnan(b64)) | (~finite & (a64 == b64))
            bad = ~((finite & close) | same_special)
        if bool(bad.any()):
            idx = tuple(int(i) for i in torch.nonzero(bad)[0])
            return f"output {k} element {list(idx)}: lhs={_num(a[idx])} rhs={_num(b[idx])}"
    return None


def f32_mismatch(exact: list[torch.Tensor], lhs: list[torch.Tensor], rhs: list[torch.Tensor]) -> str | None:
    """The first output element where the rhs computed in f32 is not the lhs computed
    in f32 (`lhs`, what the program computes), with the lhs in fp64 (`exact`) as the
    reference. A finite lhs wants a finite rhs no further from the reference than
    F32_ULPS of the output's largest value, or 4 times the lhs's own error where that
    is larger (the program's rounding is not the rule's to fix). A non-finite lhs
    wants the same value (NaN matching NaN) where the exact value is that too, and
    some non-finite value where f32's range lost the program's value (an overflow to
    NaN where the rhs overflows to inf, or a product that underflowed to 0 before
    meeting an inf): a finite rhs there is not what the program computes, more exact
    or not (`log(exp(x)) => x` past 88)."""
    for k, (t, a, b) in enumerate(zip(exact, lhs, rhs)):
        if not a.dtype.is_floating_point or not b.dtype.is_floating_point:
            bad = a.to(torch.float64) != b.to(torch.float64)
        else:
            t64, a64, b64 = t.to(torch.float64), a.to(torch.float64), b.to(torch.float64)
            ref = torch.where(torch.isfinite(t64), t64, a64)
            finite_ref = ref[torch.isfinite(ref)]
            scale = float(finite_ref.abs().max()) if finite_ref.numel() else 0.0
            finite = torch.isfinite(a64) & torch.isfinite(b64)
            err_lhs = torch.where(torch.isfinite(a64), (a64 - ref).abs(), 0)
            close = (b64 - ref).abs() <= F32_ULPS * F32_EPS * scale + 4 * err_lhs + F32_TINY
            same_special = (torch.isnan(a64) & torch.isnan(b64)) | (~torch.isfinite(a64) & (a64 == b64))
            lost = ~torch.isfinite(a64) & ~((torch.isnan(a64) & torch.isnan(t64)) | (a64 == t64))
            overflowed = lost & ~torch.isfinite(b64)
            bad = ~((finite & close) | same_special | overflowed)
        if bool(bad.any()):
            idx = tuple(int(i) for i in torch.nonzero(bad)[0])
            return f"output {k} element {list(idx)}: lhs={_num(a[idx])} rhs={_num(b[idx])} (exact {_num(t[idx])})"
    return None


def _num(t: torch.Tensor) -> str:
    v = t.item()
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def show_inputs(inputs: dict[str, torch.Tensor], limit: int = 24) -> str:
    parts = []
    for name, t in inputs.items():
        flat = t.reshape(-1).tolist()
        shown = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in flat[:limit])
        more = f", ... ({len(flat)} values)" if len(flat) > limit else ""
        parts.append(f"{name}{list(t.shape)}=[{shown}{more}]")
    return "; ".join(parts)


def numeric_gate(inst: RuleInstance, bindings: list[Binding], trials: int = 2, seed: int = 0) -> str | None:
    """None when lhs and rhs agree on every binding, style and trial, in fp64 and (unless
    the rule is exempt, `inst.f32_exempt`) in f32; else a counterexample."""
    gen = torch.Generator().manual_seed(seed)
    for binding in bindings:
        env = binding.dict
        for style_name, draw, in_fp64 in _draws(inst):
            for _ in range(trials):
                inputs = _as_f32(draw(env, gen))
                try:
                    lhs, rhs = evaluate(inst, inputs, env)
                    lhs32, rhs32 = (None, None) if inst.f32_exempt else evaluate(inst, inputs, env, torch.float32)
                except (CleaveError, RuntimeError, IndexError) as err:
                    return f"at {binding}: interpreting raised {type(err).__name__}: {err}"
                bad = first_mismatch(lhs, rhs) if in_fp64 else None
                if bad:
                    return f"at {binding}, {style_name} inputs {show_inputs(inputs)}: {bad}"
                bad = None if lhs32 is None else f32_mismatch(lhs, lhs32, rhs32)
                if bad:
                    return f"in f32 at {binding}, {style_name} inputs {show_inputs(inputs)}: {bad}"
    return None
