"""A rule's small symbolic instances, as pairs of IR graphs, for the verifier.

Each tensor variable becomes an input whose shape is picked from a few
candidates (full, constant along the axis, the right operand of a MatMul, a
scalar) so that both sides build and the rule's conditions hold; axis
variables are bound to -1 and -2 in turn.
"""
from __future__ import annotations

import itertools

import sympy

from cleave.ir import Graph, RuleInstance
from cleave.ir import dims as D

from .dsl import REDUCE, Rule, RuleError, Var
from .lower import Lowering, condition_vars, split_count

M, N, P, B = (D.symbol(n) for n in ("M", "N", "P", "B"))
TOPK = 3


def _shapes(axis: int):
    """Candidate shapes with the reduced extent N on `axis`."""
    if axis == -1:
        return [(M, N), (M, 1), (N, P), (), (1, N)]
    return [(B, N, M), (B, 1, M), (B, N, P), (), (1, N, M)]


def _flat(node, a: int) -> bool:
    return node.rank + a < 0 or D.is_one(node.shape[a])


def _holds(rule: Rule, nodes: dict, axes: dict) -> bool:
    for c in rule.conditions:
        x = nodes[c.args[0].name]
        if c.kind == "flat" and not _flat(x, c.args[1].value(axes)):
            return False
        if c.kind == "splittable":
            a = c.args[1].value(axes)
            if x.rank + a < 0 or D.is_one(x.shape[a]):
                return False
    return True


def _build(rule: Rule, side, shapes: dict, axes: dict) -> tuple[Graph, dict]:
    g = Graph(f"{rule.name}.{side}")
    nodes = {}
    sizes = {c.args[0].name: c for c in rule.conditions if c.kind == "extent"}
    conds = condition_vars(rule.lhs)
    for name, shape in shapes.items():
        if name not in sizes:
            nodes[name] = g.input(name, shape, "bool" if name in conds else "f32")
    for name, cond in sizes.items():
        x = nodes[cond.args[1].name]
        nodes[name] = g.add("size", value=x.shape[cond.args[2].value(axes)], dtype="f32")
    low = Lowering(g, nodes, axes, {v: TOPK for v in _int_vars(rule)}, what=f"rule {rule.name} ({side})")
    out = low(getattr(rule, side))
    g.output(out, names=["out"])
    return g, nodes


def _int_vars(rule: Rule) -> list[str]:
    out = []
    for t in (rule.lhs, rule.rhs):
        stack = [t]
        while stack:
            x = stack.pop()
            if hasattr(x, "op"):
                if x.op.startswith("topk") and isinstance(x.args[1], Var):
                    out.append(x.args[1].name)
                stack.extend(x.args)
    return out


def _conditions(*graphs: Graph) -> list:
    out = []
    for g in graphs:
        for c in g.constraints:
            rel = {"eq": sympy.Eq(c.lhs, c.rhs), "le": sympy.Le(c.lhs, c.rhs),
                   "divides": sympy.Eq(sympy.Mod(c.rhs, c.lhs), 0)}[c.kind]
            if rel is not sympy.true and str(rel) not in map(str, out):
                out.append(rel)
    return out


def nonempty_chunks(extent) -> sympy.Rel:
    """No chunk of a split of `extent` into its count is all padding."""
    s = split_count(extent)
    return sympy.Le((s - 1) * sympy.ceiling(extent / s) + 1, extent)


def _rule_conditions(rule: Rule, nodes: dict, axes: dict) -> list:
    return [nonempty_chunks(nodes[c.args[0].name].shape[c.args[1].value(axes)])
            for c in rule.conditions if c.kind == "nonempty"]


def masked_vars(rule: Rule) -> tuple[str, ...]:
    """The variables the lhs reduces over (reduction and MatMul operands), except the
    ones a condition declares flat or finite: a mask may have set any of their elements
    to -inf. A flat operand (a shift or a scale constant along the axis) is a finite value."""
    flat = {c.args[0].name for c in rule.conditions if c.kind in ("flat", "finite")}
    out: list[str] = []

    def walk(t, reduced: bool):
        if isinstance(t, Var):
            if reduced and t.name not in flat and t.name not in out:
                out.append(t.name)
        elif hasattr(t, "op"):
            inner = reduced or t.op in REDUCE or t.op == "matmul" or t.op.startswith("topk")
            for a in t.args:
                walk(a, inner)

    walk(rule.lhs, False)
    return tuple(out)


def instantiate(rule: Rule) -> list[RuleInstance]:
    ints = set(_int_vars(rule))
    tensors = [v for v in rule.variables() if v not in ints]
    sized = {c.args[0].name for c in rule.conditions if c.kind == "extent"}
    free = [v for v in tensors if v not in sized]
    out = []
    for axis in (-1, -2):
        axes = {a: axis for a in rule.axis_vars()}
        for choice in itertools.product(_shapes(axis), repeat=len(free)):
            shapes = dict(zip(free, choice))
            try:
                lhs, nodes = _build(rule, "lhs", shapes, axes)
                rhs, _ = _build(rule, "rhs", shapes, axes)
            except (RuleError, ValueError):
                continue
            lo, ro = lhs.outputs[0], rhs.outputs[0]
            if len(lo.shape) != len(ro.shape) or not all(D.equal(x, y) for x, y in zip(lo.shape, ro.shape)):
                continue
            if _holds(rule, nodes, axes) and _uses_axis(nodes, axis):
                masked = tuple(v for v in masked_vars(rule) if v in lhs.inputs)
                out.append(RuleInstance(rule.name, lhs, rhs,
                                        _conditions(lhs, rhs) + _rule_conditions(rule, nodes, axes), masked))
                break
    if not out:
        raise RuleError(f"{rule.source}: rule {rule.name}: no small instance builds on both sides "
                        "(check the shapes its patterns imply)")
    return out


def _uses_axis(nodes: dict, axis: int) -> bool:
    """Rank-2 shapes for axis -1 and rank-3 ones for axis -2: skip degenerate picks."""
    return any(n.rank >= -axis + 1 for n in nodes.values() if n.op == "input")
