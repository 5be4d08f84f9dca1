"""The numeric gate: both sides of a rule interpreted in fp64 on random inputs.

It stands beside the provers because the algebra can hide what IEEE arithmetic
does (pads, empty chunks, -inf - -inf): a rule passes only if this agrees too.
"""
from __future__ import annotations

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


def _draws(inst: RuleInstance):
    """(name, draw(env, gen)) per input style; masked only where the rule reduces values a mask can hide."""
    out = [(name, lambda env, gen, style=style: random_inputs(inst.lhs, env, style, gen)) for name, style in STYLES]
    if inst.masked:
        out.append(("masked", lambda env, gen: masked_inputs(inst, env, gen)))
    return out


def evaluate(inst: RuleInstance, inputs: dict[str, torch.Tensor], env: Mapping[str, int]):
    """(lhs outputs, rhs outputs) in fp64; the rhs reads only the inputs it declares."""
    lhs = interpret(inst.lhs, inputs, compute_dtype=torch.float64, env=env)
    rhs_inputs = {k: v for k, v in inputs.items() if k in inst.rhs.inputs}
    rhs = interpret(inst.rhs, rhs_inputs, compute_dtype=torch.float64, env=env)
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
    """None when lhs and rhs agree on every binding, style and trial; else a counterexample."""
    gen = torch.Generator().manual_seed(seed)
    for binding in bindings:
        env = binding.dict
        for style_name, draw in _draws(inst):
            for _ in range(trials):
                inputs = draw(env, gen)
                try:
                    lhs, rhs = evaluate(inst, inputs, env)
                except (CleaveError, RuntimeError, IndexError) as err:
                    return f"at {binding}: interpreting raised {type(err).__name__}: {err}"
                bad = first_mismatch(lhs, rhs)
                if bad:
                    return f"at {binding}, {style_name} inputs {show_inputs(inputs)}: {bad}"
    return None

