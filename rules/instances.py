"""A rule's small symbolic instances, as pairs of IR graphs, for the verifier.

Each tensor variable becomes an input whose shape is picked from a few
candidates (full, broadcast along the axis by an extent 1 or a lower rank,
broadcast along another axis, the right operand of a MatMul, a scalar); axis
variables are bound to -1 and -2 in turn. Every assignment of these shapes at
which both sides build and the rule's conditions hold is an instance: a rule
may be right at full shapes and wrong where an operand broadcasts (a sum of a
broadcast operand counts it once per element). Assignments whose sides differ
in shape are kept too: the verifier's shape proof refutes them. An assignment
that builds only where some of its dims are equal (a square MatMul operand, a
scale along the contracted axis) is tried with them equal, for a rule that is not
elementwise (at axis -2, one with an axis variable): a rule may be wrong only there.
"""
from __future__ import annotations

import itertools
import re
import time

import sympy

from cleave.ir import Graph, RuleInstance
from cleave.ir import dims as D
from cleave.ir.ops import BINARY, UNARY

from .dsl import REDUCE, Rule, RuleError, Var, _walk_vars
from .lower import Lowering, condition_vars, split_count

M, N, P, B = (D.symbol(n) for n in ("M", "N", "P", "B"))
TOPK = 3
ELEMENTWISE = {*UNARY, *BINARY, "where", "const"}


def _shapes(axis: int):
    """Candidate shapes with the reduced extent N on `axis`: full, extent 1 on it,
    a MatMul's other operand, a scalar, extent 1 on another axis, lower ranks."""
    if axis == -1:
        return [(M, N), (M, 1), (N, P), (), (1, N), (N,)]
    return [(B, N, M), (B, 1, M), (B, N, P), (), (1, N, M), (N, M), (M,)]


def _flat(node, a: int) -> bool:
    return node.rank + a < 0 or D.is_one(node.shape[a])


def _holds(rule: Rule, nodes: dict, axes: dict) -> bool:
    for c in rule.conditions:
        if not c.args:  # a condition on the whole graph (wide_operands): values are exact in the reals
            continue
        x = nodes[c.args[0].name]
        if c.kind == "flat" and not _flat(x, c.args[1].value(axes)):
            return False
        if c.kind == "splittable":
            a = c.args[1].value(axes)
            if x.rank + a < 0 or D.is_one(x.shape[a]):
                return False
        if c.kind == "within" and not within(x, nodes[c.args[1].name]):
            return False
    return True


def within(c, x) -> bool:
    """c broadcasts to x's shape without widening it."""
    return c.rank <= x.rank and all(D.is_one(a) or D.equal(a, b) for a, b in zip(c.shape[::-1], x.shape[::-1]))


def _build(rule: Rule, side, shapes: dict, axes: dict, k: int = TOPK) -> tuple[Graph, dict]:
    g = Graph(f"{rule.name}.{side}")
    nodes = {}
    sizes = {c.args[0].name: c for c in rule.conditions if c.kind == "extent"}
    conds = condition_vars(rule.lhs)
    for name, shape in shapes.items():
        if name not in sizes:
            nodes[name] = g.input(name, shape, "bool" if name in conds else "f32")
    for name, cond in sizes.items():
        x, a = nodes[cond.args[1].name], cond.args[2].value(axes)
        if x.rank + a < 0:  # a scalar or lower-rank pick of x: the condition names no axis of it
            raise RuleError(f"rule {rule.name}: extent({name}, ...): {cond.args[1].name} has no axis {a}")
        nodes[name] = g.add("size", value=x.shape[a], dtype="f32")
    low = Lowering(g, nodes, axes, {v: k for v in _int_vars(rule)}, what=f"rule {rule.name} ({side})")
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


def declared_finite(rule: Rule) -> tuple[str, ...]:
    """The variables a condition declares flat, finite or nonzero. A flat operand (a shift
    or a scale constant along the axis) is a finite value, and so is a nonzero one (the
    search's `nonzero` is never 0 nor infinite)."""
    return tuple(dict.fromkeys(c.args[0].name for c in rule.conditions if c.kind in ("flat", "finite", "nonzero")))


def masked_vars(rule: Rule) -> tuple[str, ...]:
    """The variables the lhs reduces over (reduction and MatMul operands), except the
    declared finite ones: a mask may have set any of their elements to -inf."""
    flat = set(declared_finite(rule))
    out: list[str] = []

    def walk(t, reduced: bool):
        if isinstance(t, Var):
            if reduced and t.name not in flat and t.name not in out:
                out.append(t.name)
        elif hasattr(t, "op"):
            # inf_to_zero's argument too: what it is for is an infinite element
            inner = reduced or t.op in REDUCE or t.op in ("matmul", "inf_to_zero") or t.op.startswith("topk")
            for a in t.args:
                walk(a, inner)

    walk(rule.lhs, False)
    return tuple(out)


def _instance(rule: Rule, shapes: dict, axes: dict, axis: int, k: int = TOPK) -> RuleInstance | None:
    """The instance at one shape assignment, or None where a side does not build, a
    condition fails, or the pick is degenerate."""
    try:
        lhs, nodes = _build(rule, "lhs", shapes, axes, k)
        rhs, _ = _build(rule, "rhs", shapes, axes, k)
    except (RuleError, ValueError):
        return None
    if not (_holds(rule, nodes, axes) and _uses_axis(nodes, axis)):
        return None
    masked = tuple(v for v in masked_vars(rule) if v in lhs.inputs)
    finite = tuple(v for v in declared_finite(rule) if v in lhs.inputs)
    return RuleInstance(rule.name, lhs, rhs, _conditions(lhs, rhs) + _rule_conditions(rule, nodes, axes), masked,
                        finite, rule.f32_exempt)


def _first_failure(rule: Rule, bindings: list, free: list) -> str:
    """Why the rule builds nowhere, said after its error: the builder's error (naming the
    op) for the right side at the first assignment where the left builds, else the
    left's at the first assignment tried."""
    first = ""
    for axes, k in bindings:
        axis = min(axes.values(), default=-1)
        for choice in itertools.islice(itertools.product(_shapes(axis), repeat=len(free)), _EXPLAINED):
            shapes = dict(zip(free, choice))
            at = ", ".join(f"{v}{list(map(str, shape))}" for v, shape in shapes.items())
            for side in ("lhs", "rhs"):
                try:
                    _build(rule, side, shapes, axes, k)
                except (RuleError, ValueError) as err:
                    if side == "rhs":
                        return f"; where its lhs builds, at {at}, its rhs fails: {err}"
                    first = first or f"; at {at} its lhs fails: {err}"
                    break
    return first


_EXPLAINED = 2000  # assignments tried per binding to say why a rule builds nowhere


def _merges(shapes: dict) -> list[dict]:
    """`shapes` with some of their dims made equal to the first (N where present: the
    extent the rule reduces or contracts), in every way; the last makes all equal."""
    dims = [d for d in (N, M, P, B) if any(d in shape for shape in shapes.values())]
    return [{v: tuple(dims[0] if d in group else d for d in shape) for v, shape in shapes.items()}
            for k in range(1, len(dims)) for group in itertools.combinations(dims[1:], k)]


def _canonical(shapes: dict, axis: int, axes: dict | None = None, k: int = TOPK) -> tuple:
    """An assignment with its dims renamed in order of appearance (and the axes and
    top-k count it is built at)."""
    names: dict = {}
    return axis, tuple(tuple(names.setdefault(d, f"d{len(names)}") if isinstance(d, sympy.Symbol) else d for d in shape)
                       for shape in shapes.values()), tuple(sorted((axes or {}).items())), k


def _bindings(rule: Rule) -> list[tuple[dict, int]]:
    """(axis of each axis variable, top-k count): every assignment of -1 and -2 to the
    axis variables, not only all alike (a rule right only where two of them name one
    axis was proven so), and the counts TOPK and TOPK - 1 where the rule has a count
    variable (one right only at k = 3 was)."""
    names = rule.axis_vars()
    counts = (TOPK, TOPK - 1) if _int_vars(rule) else (TOPK,)
    if not names:
        return [({}, k) for k in counts]
    return [(dict(zip(names, picks)), k) for picks in itertools.product((-1, -2), repeat=len(names))
            for k in counts]


def _equal_dims(rule: Rule, shapes: dict, axes: dict, axis: int, k: int = TOPK) -> list[tuple[dict, RuleInstance]]:
    """(assignment, instance) for each way of making dims of `shapes` equal (_merges)
    at which the rule builds: x square in matmul(x, x); and, for a rule with a top-k,
    each dim made the count k: an operand along the axis then meets the top-k's output
    (`topk_values(add(x, c), k, a) => add(topk_values(x, k, a), c)` with c varying
    along a builds only there, where it is wrong; it was proven)."""
    merges = _merges(shapes)
    counted = [{v: tuple(k if d == dim else d for d in shape) for v, shape in shapes.items()}
               for dim in dict.fromkeys(d for shape in shapes.values() for d in shape if isinstance(d, sympy.Symbol))
               ] if _has_topk(rule) else []
    found = [(m, inst) for m in counted if (inst := _instance(rule, m, axes, axis, k)) is not None]
    # making dims equal never stops a side from building: if all equal does not build, nothing does
    if not merges or _instance(rule, merges[-1], axes, axis, k) is None:
        return found
    return [(m, inst) for m in merges if (inst := _instance(rule, m, axes, axis, k)) is not None] + found


def _has_topk(rule: Rule) -> bool:
    stack = [rule.lhs, rule.rhs]
    while stack:
        x = stack.pop()
        if hasattr(x, "op"):
            if x.op.startswith("topk"):
                return True
            stack.extend(x.args)
    return False


class OutOfTime(RuleError):
    """The verifier's time limit for a rule ran out (building its instances, or proving them)."""


# An instantiation of more shape assignments than this says so, and how far it is, as it goes.
ANNOUNCE_ASSIGNMENTS = 20000
PROGRESS_EVERY_S = 10.0


class _Progress:
    """Progress lines and the deadline of a long instantiation: each variable takes each
    candidate shape, so a rule of n free variables has 6^n or 7^n assignments per axis
    (7 variables and no axis variable: 1.1 million, half a minute; 9: most of an hour)."""

    def __init__(self, rule: Rule, total: int, deadline: float | None):
        self.rule, self.total, self.deadline, self.done = rule, total, deadline, 0
        self.loud = total > ANNOUNCE_ASSIGNMENTS
        self.next_line = time.perf_counter() + PROGRESS_EVERY_S
        if self.loud:
            from cleave.progress import report

            limit = f"; it stops at the verifier's time limit, {deadline - time.perf_counter():.0f} s from now" \
                if deadline is not None else ""
            report(f"[cleave] rule {rule.name}: building its instances over {total:,} shape assignments of its "
                   f"{len(rule.variables())} variables{limit}")

    def step(self) -> None:
        self.done += 1
        if self.done % 256:
            return
        now = time.perf_counter()
        if self.deadline is not None and now > self.deadline:
            raise OutOfTime(f"building its instances: {self.done:,} of {self.total:,} shape assignments done")
        if self.loud and now > self.next_line:
            from cleave.progress import report

            report(f"[cleave] rule {self.rule.name}: {self.done:,} of {self.total:,} shape assignments")
            self.next_line = now + PROGRESS_EVERY_S


def instantiate(rule: Rule, deadline: float | None = None) -> list[RuleInstance]:
    """Every distinct instance over the candidate shapes: each variable may broadcast,
    and dims may be equal where a side builds only so. OutOfTime past `deadline`
    (time.perf_counter()), with progress lines where the assignments are many."""
    ints = set(_int_vars(rule))
    tensors = [v for v in rule.variables() if v not in ints]
    sized = {c.args[0].name for c in rule.conditions if c.kind == "extent"}
    free = [v for v in tensors if v not in sized]
    elementwise = _elementwise(rule)
    built: dict = {}  # canonical assignment -> (assignment, instance)
    sides = [set(_walk_vars(rule.lhs)), set(_walk_vars(rule.rhs))] if elementwise else None
    outcomes: set = set()  # an elementwise rule's sides' output shapes, per instance built
    unbuilt = []  # the bindings at which nothing builds: the rule is unchecked there
    bindings = _bindings(rule)
    progress = _Progress(rule, sum(len(_shapes(a)) ** len(free) for axes, _ in bindings
                                   for a in ((-1, -2) if not axes else (min(axes.values()),))), deadline)
    for axes, k in bindings:
        count = len(built)
        axis = min(axes.values(), default=-1) if axes else None
        for axis in (-1, -2) if axis is None else (axis,):
            for choice in itertools.product(_shapes(axis), repeat=len(free)):
                progress.step()
                shapes = dict(zip(free, choice))
                if sides is not None:
                    # an elementwise side's shape is its variables' broadcast: an assignment
                    # whose sides come out as an earlier one's adds nothing, and building
                    # every one took a minute for five variables (6^5 assignments)
                    outcome = _broadcast_outcome(sides, shapes, axis)
                    if outcome is None or outcome in outcomes:
                        continue
                inst = _instance(rule, shapes, axes, axis, k)
                if inst is not None:
                    if sides is not None:
                        outcomes.add(outcome)
                    built.setdefault(_canonical(shapes, axis, axes, k), (shapes, inst))
                elif not elementwise and (axis == -1 or axes):
                    # Not for an elementwise rule: its values are its full-shape instance's at any
                    # dims. Not at axis -2 for a rule of literal axes: there it would only get batched
                    # copies of its axis -1 instances (x[B, N, N]), for 1.6 times the library's proofs.
                    for merged, inst in _equal_dims(rule, shapes, axes, axis, k):
                        built.setdefault(_canonical(merged, axis, axes, k), (merged, inst))
        if len(built) == count and not (sides is not None and outcomes):
            unbuilt.append(", ".join(f"{name} = {a}" for name, a in axes.items()) or f"k = {k}")
    # an assignment that another becomes with some dims made equal is that one's graph at
    # bindings where they are: leave it out
    special = {_canonical(m, key[0])[:2] + key[2:] for key, (shapes, _) in built.items() for m in _merges(shapes)}
    key = _shape_relation if elementwise else _texts
    out: dict = {}  # key(instance) -> the first instance with it
    for k, (_, inst) in built.items():
        if k not in special:
            out.setdefault(key(inst), inst)
    if not out:
        raise RuleError(f"{rule.source}: rule {rule.name}: no small instance builds on both sides "
                        f"(check the shapes its patterns imply{_first_failure(rule, bindings, free)})")
    if unbuilt:
        raise UnbuiltBinding(f"no small instance builds at {'; '.join(unbuilt)} (the verifier's shapes have "
                             f"rank 2 for axis -1 and rank 3 for -2), so the rule is unchecked there")
    return list(out.values())


class UnbuiltBinding(RuleError):
    """An axis binding of a rule at which no instance builds: the rule would be proven at
    the others only, and may be wrong there (the verdict is unknown)."""


def _broadcast_outcome(sides: list[set], shapes: dict, axis: int) -> tuple | None:
    """Each side's output shape as its variables' shapes broadcast (dims renamed in order
    of appearance), or None where they do not broadcast."""
    names: dict = {}
    out = []
    for names_used in sides:
        shape: tuple = ()
        for v in sorted(names_used):
            shape = _broadcast(shape, shapes.get(v, ()))
            if shape is None:
                return None
        out.append(tuple(names.setdefault(d, f"d{len(names)}") if isinstance(d, sympy.Symbol) else d for d in shape))
    return axis, tuple(out)


def _broadcast(a: tuple, b: tuple) -> tuple | None:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    dims = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            dims.append(x)
        elif x == 1:
            dims.append(y)
        else:
            return None
    return tuple(dims)


def _elementwise(rule: Rule) -> bool:
    """Whether both sides are elementwise ops over the variables (no size scalars):
    then an element at broadcast inputs is the element at full ones, read at other
    indices, and past the full-shape instance only the sides' shapes need checking."""
    if any(c.kind == "extent" for c in rule.conditions):
        return False
    stack = [rule.lhs, rule.rhs]
    while stack:
        t = stack.pop()
        if hasattr(t, "op"):
            if t.op not in ELEMENTWISE:
                return False
            stack.extend(t.args)
    return True


_SYMBOL = re.compile(r"\b(s_)?([BMNP])\b")  # a dim symbol, or the split count named after it


def _texts(inst: RuleInstance) -> str:
    """Both sides' text with the dim symbols renamed in order of appearance: x[N, P]
    alone is x[M, N] again (P exists to be a MatMul's other dim)."""
    names: dict[str, str] = {}
    return _SYMBOL.sub(lambda m: (m.group(1) or "") + names.setdefault(m.group(2), f"d{len(names)}"),
                       inst.lhs.text() + "\0" + inst.rhs.text())


def _shape_relation(inst: RuleInstance) -> tuple:
    """How the sides' output shapes relate, right-aligned, dim by dim (same, rhs 1,
    other) with the rank difference: an elementwise rule's values are its full-shape
    instance's, so one instance per relation checks what is left, its shapes."""
    lhs, rhs = inst.lhs.outputs[0].shape, inst.rhs.outputs[0].shape
    dims = tuple("same" if D.equal(a, b) else "rhs 1" if D.is_one(b) else "other"
                 for a, b in zip(lhs[::-1], rhs[::-1]))
    return dims, len(lhs) - len(rhs)


def _uses_axis(nodes: dict, axis: int) -> bool:
    """Rank-2 shapes for axis -1 and rank-3 ones for axis -2: skip degenerate picks."""
    return any(n.rank >= -axis + 1 for n in nodes.values() if n.op == "input")
