"""Scores scaled after the dot: a loop step's S = (q·c)·Kᵀ computed as (q·Kᵀ)·c.

The search folds attention's score scale (rsqrt(d)·log2e) into the q tile's prologue,
once per program. Triton then holds the scaled q tile in registers for the whole kv
loop, as the tensor cores' A operand: 32 registers a thread at 8 warps, which pushed a
kernel holding two row tiles (row_halves.py) into 58 spilled registers, and which made
Triton reload q from shared memory every step where it did not fit. Taken straight from
its load, q stays in shared memory, and the scale moves onto the scores at no cost per
score: the row max is taken of the raw scores and scaled once per row (a positive
factor commutes with max and with a -inf mask fill), and the softmax's subtraction
becomes one fused multiply-add, s·c - m. The product is also more exact: q is not
rounded to bf16 after scaling.

On the H200 (b4 h32 s4096 d128, RESULTS.md 2026-12-03) full attention ran 12.5% faster
with one row tile per program and 7% faster with two; causal attention with one row
tile ran 5% slower (there q in registers fit). Neither is right everywhere, so this is
an option beside each tiling, and the runtime's profiling picks.
"""
from __future__ import annotations

import dataclasses

import sympy

from cleave.ir.dtypes import DType
from cleave.rules.lower import LOW

from .partition import KernelSpec
from .tiles import Tiling

MIN_ROWS = 64  # a decode's 16-row q tile is small beside its keys: no option there
# A scale whose factors lie in this range, and the reciprocal square root of the dot's
# contraction extent, is a positive finite f32 (the rsqrt is inf only over an empty
# contraction, where the kernel reads it as 0: the raw scores are 0 there, and so were
# the scaled ones). Moving it keeps a -inf fill -inf and the row max the row max.
FACTOR_RANGE = (1e-6, 1e6)


def scaled_dots(spec: KernelSpec, t: Tiling) -> dict:
    """id(MatMul instance) -> (operand position, raw operand, scale) for each MatMul a loop
    step computes whole whose loop-invariant operand is a low-precision value scaled by a
    positive scalar and rounded back to that precision: cast(mul(cast(x), c))."""
    out = {}
    for inst in spec.views.memo.values():
        if inst.op != "matmul" or inst.reduced is None or t.role[inst.reduced.id] == "loop":
            continue
        if not any(t.role[i] == "loop" for i in inst.labels):
            continue
        contraction = inst.node.inputs[0].shape[-1]
        for k, a in enumerate(inst.inputs):
            found = _scaled_operand(a, t, contraction)
            if found is not None and _rows(a, inst, t) >= MIN_ROWS:
                out[id(inst)] = (k, *found)
                break
    return out


def option(spec: KernelSpec, t: Tiling) -> tuple[KernelSpec, Tiling] | None:
    """The same kernel and tiling with its scaled dots' scale moved after the dot, where
    it has such a dot."""
    if t.scale_after or not scaled_dots(spec, t):
        return None
    return spec, dataclasses.replace(t, scale_after=True)


def _scaled_operand(a, t: Tiling, contraction):
    """(x, c) where a = cast_low(mul(x', c)) with x' x itself or its exact upcast to f32,
    x in that low precision, c a positive scalar; a constant over every loop."""
    if any(t.role[i] == "loop" for i in a.labels):
        return None
    if a.op != "cast" or a.node.dtype not in LOW or a.inputs[0].op != "mul":
        return None
    low = a.node.dtype
    for x, c in (a.inputs[0].inputs, reversed(a.inputs[0].inputs)):
        if c.labels or not _positive(c, contraction):
            continue
        if x.op == "cast" and x.node.dtype is DType.f32 and x.inputs[0].node.dtype is low:
            x = x.inputs[0]
        if x.node.dtype is low and x.labels == a.labels:
            return x, c
    return None


def _rows(a, inst, t: Tiling) -> int:
    """The tile lanes of operand a's labels that are not the MatMul's contraction."""
    rows = 1
    for i in a.labels:
        if i != inst.reduced.id:
            rows *= t.block[i]
    return rows


def _positive(c, contraction) -> bool:
    """Whether scalar instance c is a positive finite f32 for every binding with a
    nonempty contraction: a product of constants in FACTOR_RANGE and the contraction
    extent's reciprocal square root, divided by such constants only (a quotient by the
    rsqrt is 0 over an empty contraction, and 0 times a -inf fill is NaN)."""
    op = c.node.op
    if op == "const":
        lo, hi = FACTOR_RANGE
        return c.node.dtype is DType.f32 and lo <= float(c.node.attrs["value"]) <= hi
    if op == "rsqrt":
        size = c.inputs[0].node
        return size.op == "size" and sympy.simplify(sympy.sympify(size.attrs["value"]) - contraction) == 0
    if op == "mul":
        return all(_positive(x, contraction) for x in c.inputs)
    if op == "div":
        return _positive(c.inputs[0], contraction) and c.inputs[1].node.op == "const" and \
            _positive(c.inputs[1], contraction)
    return False
