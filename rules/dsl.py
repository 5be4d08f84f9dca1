"""The cleave rule DSL: each rewrite rule is written once, as text, and compiled
both to egglog (by cleave.search) and to IR graph instances (for cleave.verify).

A rule file holds blocks like

    family normalization

    rule rowscale-after-matmul: matmul(mul(x, c), y) => mul(matmul(x, y), c)
      if flat(c, -1)
      why: a per-row scale commutes with contracting the row's columns
      rewrites: matmul(mul(x, c), w) with x[m, k], c[m, 1], w[k, n]
      keeps: matmul(mul(x, c), w) with x[m, k], c[1, k], w[k, n]

`family NAME phase P` names a new family and the saturation phase(s) it runs in
(`phase rewrite, cleanup`); the library's families have theirs in cleave.rules.

Patterns use the search's tensor terms (see OPS): IR ops, plus `squeeze`,
`unsqueeze` and `swap` for the axis bookkeeping a split needs, and `const(v)`, an f32
scalar: a number, `inf`, `-inf` or `log2e` (cleave.ir.ops.LOG2E). A variable used
as a `where`'s condition stands for a bool tensor. Axes count from
the right (-1 is the last axis), so broadcasting never shifts them: a literal axis is
negative (squeeze's and unsqueeze's may be 0, the slot past the last axis). Lower-case
names are pattern variables, each a tensor, an axis or a top-k count (never two);
`a`, `b` in axis positions are axis variables and may carry an offset (`a-1`). The
integer ops (INTEGER_OPS) are refused: the search rewrites float values only. Conditions:

    flat(c, a)          c has extent 1 along axis a, or lacks it (c is constant along a)
    splittable(x, a)    axis a of x is reducible: its dim is absent from the graph's outputs
    extent(n, x, a)     the scalar n equals the extent of axis a of x
    nonempty(x, a)      a binding must leave no split chunk of axis a of x all padding
                        (a constraint on the split count, recorded on the candidate graph)
    finite(x)           x holds no infinity: no mask fill, division, log or exp reaches it
                        from the program's inputs (cleave/search/finite.py)
    nonzero(c)          c is never 0 nor infinite where the inputs are finite: a non-zero
                        constant, a size, a softmax's denominator (cleave/search/finite.py);
                        a rule moving or cancelling a divisor needs it (an input may hold 0)
    unrounded(x)        no MatMul rounds x to its operand precision (an f32 value cast to
                        the f16 its MatMuls take): the search leaves that rounding to
                        the lowering, which makes it on MatMul operands only, so a rule
                        moving x out of every MatMul needs this or loses it
    within(c, x)        c broadcasts to x's shape without widening it (each axis of c has
                        extent 1 or x's, and c has no more axes): a rhs that drops c keeps
                        the lhs's shape. Known where c and x meet in an elementwise op of
                        the input graph
    wide_operands()     the graph's MatMul operands are not f16: a factor moved into one is
                        rounded to it, and f16's range (65504) would overflow where the
                        product did not (a graph condition: the rule is left out otherwise)
    moderate_values()   no finite constant of the graph is within a factor 2 of f32's
                        range, and no exp's argument may hold an input's values at full
                        scale (an additive mask passed in, scaled by more than ln 2 if at
                        all; a constant of 2^100 or more amplified so): a rule scaling
                        values by log2(e) would overflow a mask's
                        finfo.min to -inf, and 0 * -inf or -inf - -inf is NaN where the
                        program's values were finite (a graph condition, as wide_operands)
    unshifted_operands() no f16/bf16 MatMul of the graph takes a row shift times row scales,
                        (a - m) c with m and c one value per row (a LayerNorm without
                        affine weight before a projection): a rule moving c out of the
                        MatMul leaves a - m its rounded operand, whose rounding errors,
                        a on the half grid and m one number a row, are one offset per
                        binade, which a weight row with a non-zero sum adds up (3-6x
                        eager's error; a graph condition, as wide_operands)
A rule exact in the reals but not in f32 (it overflows or cancels where its left side
does not) is refused by the numeric gate's f32 leg; a line `f32: WHY` exempts it, WHY
saying why no kernel computes the form that loses (the verdict notes the exemption).
Examples are concrete terms (literal axes) over declared inputs: `x[m, k]` an f32
input of that shape (`c[]` a scalar), `n = k` a scalar equal to the extent k. The
rule must fire on each `rewrites:` term and must not on each `keeps:` term
(cleave.search.examples runs them).
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from cleave.ir import CleaveError, RuleInstance
from cleave.ir.ops import BINARY, BITWISE, LOG2E, REDUCE_OPS, UNARY

REDUCE = {"r" + op: op for op in REDUCE_OPS}  # rsum: a reduce with op=sum
# name -> argument kinds: t tensor, a axis, k int, p pad, c a constant's value
OPS = {**{u: "t" for u in UNARY}, **{b: "tt" for b in BINARY}, **{r: "ta" for r in REDUCE},
       "where": "ttt", "matmul": "tt", "split": "tap", "squeeze": "ta", "unsqueeze": "ta", "swap": "t",
       "topk_values": "tka", "topk_indices": "tka", "const": "c"}
CONDITIONS = {"flat": "ta", "splittable": "ta", "extent": "tta", "nonempty": "ta", "finite": "t", "nonzero": "t", "within": "tt",
              "unrounded": "t", "wide_operands": "", "moderate_values": "", "unshifted_operands": ""}
GRAPH_CONDITIONS = {"wide_operands", "moderate_values", "unshifted_operands"}  # decided once per graph, by cleave.search, not per match
PADS = {"-inf": float("-inf"), "0": 0.0}
# Ops of integers: the search encodes only float values as terms (cleave/search/encode.py)
# and the verifier's instances are f32, so a rule using one could never fire nor be proven.
INTEGER_OPS = (*BITWISE, "idiv")
# Their axis names the slot right of the axis they remove or insert: 0 is past the last axis.
SLOT_AXIS_OPS = ("squeeze", "unsqueeze")
# An argument kind (OPS, CONDITIONS) as the variable kind it gives a variable.
VARIABLE_KINDS = {"t": "a tensor", "a": "an axis", "k": "a top-k count"}
CONSTANTS = {"inf": math.inf, "log2e": LOG2E}  # names a `const(...)` may use


def const_value(value: float) -> str:
    """A constant's value as a `const` term holds it: the float's repr, one spelling per value."""
    return repr(float(value))


class RuleError(CleaveError):
    """A rule's text is malformed, or it cannot be instantiated."""


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Axis:
    """An axis counted from the right: a literal (`var` None) or a variable plus offset."""
    var: str | None
    offset: int = 0

    def value(self, env: dict[str, int]) -> int:
        return self.offset + (env[self.var] if self.var else 0)

    def __str__(self) -> str:
        if self.var is None:
            return str(self.offset)
        return self.var + (f"{self.offset:+d}" if self.offset else "")


def _cached_hash(term, fields: tuple) -> int:
    """A term's hash, computed once: a concrete term shares its subterms (a layer's
    residual stream feeds every later op), so as a tree it is exponentially larger than
    as a DAG, and a hash recomputed through the tree took minutes for two layers."""
    h = term.__dict__.get("_hash")
    if h is None:
        h = hash(fields)
        object.__setattr__(term, "_hash", h)
    return h


@dataclass(frozen=True)
class Term:
    """A pattern (or a concrete search term): op and its arguments in OPS order."""
    op: str
    args: tuple

    def __hash__(self) -> int:
        return _cached_hash(self, (self.op, self.args))

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if not isinstance(other, Term) or hash(self) != hash(other):
            return False
        return _same_dag(self, other)

    def __str__(self) -> str:
        return f"{self.op}({', '.join(str(a) for a in self.args)})"


def _same_dag(a: Term, b: Term) -> bool:
    """Structural equality compared as DAGs: each pair of shared subterms once (a
    recursive compare walks the tree, exponentially larger for a stack of layers)."""
    seen, stack = set(), [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y or (id(x), id(y)) in seen:
            continue
        seen.add((id(x), id(y)))
        if isinstance(x, Term) and isinstance(y, Term):
            if hash(x) != hash(y) or x.op != y.op or len(x.args) != len(y.args):
                return False
            stack.extend(zip(x.args, y.args))
        elif type(x) is not type(y) or x != y:
            return False
    return True


@dataclass(frozen=True)
class Leaf:
    """A concrete node outside the rewritable vocabulary (inputs, consts, opaque ops), by key."""
    key: int
    args: tuple = ()

    def __hash__(self) -> int:
        return _cached_hash(self, (self.key, self.args))

    def __str__(self) -> str:
        return f"leaf{self.key}" + (f"({', '.join(str(a) for a in self.args)})" if self.args else "")


@dataclass(frozen=True)
class Condition:
    kind: str
    args: tuple

    def __str__(self) -> str:
        return f"{self.kind}({', '.join(str(a) for a in self.args)})"


@dataclass(frozen=True)
class Example:
    """A term the rule must rewrite (kind "rewrites") or must leave alone ("keeps")."""
    kind: str
    term: Term
    tensors: tuple  # (name, dims): f32 inputs
    sizes: tuple  # (name, dim): scalars equal to an extent
    text: str
    source: str


@dataclass
class Rule:
    name: str
    family: str
    reason: str
    lhs: Term
    rhs: Term
    conditions: list[Condition] = field(default_factory=list)
    source: str = ""
    phases: tuple = ()  # declared by its file (`family NAME phase P`); else the library's table
    examples: list[Example] = field(default_factory=list)
    f32_exempt: str = ""  # `f32: WHY`: exact in the reals only, and why no kernel computes the overflowing form

    def variables(self) -> list[str]:
        """Tensor variables in order of first appearance (lhs first)."""
        out: list[str] = []
        for t in (self.lhs, self.rhs, *self.conditions):
            for v in _walk_vars(t):
                if v not in out:
                    out.append(v)
        return out

    def axis_vars(self) -> list[str]:
        out: list[str] = []
        for t in (self.lhs, self.rhs, *self.conditions):
            for a in _walk_axes(t):
                if a.var and a.var not in out:
                    out.append(a.var)
        return out

    def text(self) -> str:
        cond = f"\n  if {' and '.join(str(c) for c in self.conditions)}" if self.conditions else ""
        f32 = f"\n  f32: {self.f32_exempt}" if self.f32_exempt else ""
        return f"rule {self.name}: {self.lhs} => {self.rhs}{cond}\n  why: {self.reason}{f32}"

    def instances(self, deadline: float | None = None) -> list[RuleInstance]:
        """Its instances for the verifier; instances.OutOfTime past `deadline` (time.perf_counter())."""
        from .instances import instantiate

        return instantiate(self, deadline)

    def __repr__(self) -> str:
        return f"<rule {self.name} ({self.family})>"


def _walk_vars(t):
    if isinstance(t, Var):
        yield t.name
    elif isinstance(t, (Term, Condition)):
        for a in t.args:
            yield from _walk_vars(a)


def _walk_axes(t):
    if isinstance(t, Axis):
        yield t
    elif isinstance(t, (Term, Condition)):
        for a in t.args:
            yield from _walk_axes(a)


def _parse_axis(node, where: str, op: str) -> Axis:
    if _int_constant(node):
        return _literal_axis(node.value, where, op)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _int_constant(node.operand):
        return _literal_axis(-node.operand.value, where, op)
    if isinstance(node, ast.Name):
        return Axis(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.left, ast.Name) and _int_constant(node.right):
        sign = {ast.Sub: -1, ast.Add: 1}.get(type(node.op))
        if sign:
            return Axis(node.left.id, sign * node.right.value)
    raise RuleError(f"{where}: cannot read an axis from {ast.unparse(node)!r} (use -1, a, a-1)")


def _int_constant(node) -> bool:
    """An int literal (not a bool, a float or a string: -1.5 was read as axis -1)."""
    return isinstance(node, ast.Constant) and type(node.value) is int


def _literal_axis(value: int, where: str, op: str) -> Axis:
    last = 0 if op in SLOT_AXIS_OPS else -1
    if value > last:
        slot = " (0 only for squeeze and unsqueeze: the slot past the last axis)" if op in SLOT_AXIS_OPS else ""
        raise RuleError(f"{where}: {op} axis {value}: axes count from the right (-1 is the last axis), "
                        f"so a literal axis is negative{slot}")
    return Axis(None, value)


def _parse_arg(kind: str, node, where: str, op: str):
    if kind == "t":
        return _parse_term(node, where)
    if kind == "a":
        return _parse_axis(node, where, op)
    if kind == "c":
        return const_value(_constant(node, where))
    if kind == "k":
        if isinstance(node, ast.Name):
            return Var(node.id)
        if _int_constant(node) and node.value >= 1:
            return node.value
        raise RuleError(f"{where}: a top-k count is a variable or an int of at least 1, not {ast.unparse(node)!r}")
    text = ast.unparse(node).replace(" ", "")
    if text not in PADS:
        raise RuleError(f"{where}: a split pad is one of {', '.join(PADS)}, not {text!r}")
    return text


def _constant(node, where: str) -> float:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_constant(node.operand, where)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id in CONSTANTS:
        return CONSTANTS[node.id]
    raise RuleError(f"{where}: a constant is a number or one of {', '.join(CONSTANTS)} (or its negation), "
                    f"not {ast.unparse(node)!r}")


def _parse_term(node, where: str):
    if isinstance(node, ast.Name):
        return Var(node.id)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise RuleError(f"{where}: expected op(args) or a variable, got {ast.unparse(node)!r}")
    op = node.func.id
    if op in INTEGER_OPS:
        raise RuleError(f"{where}: {op} is an op of integers, and rules rewrite float values only: the search "
                        "keeps integer values opaque and the verifier proves over f32, so no rule can use it")
    if op not in OPS:
        raise RuleError(f"{where}: unknown op {op!r}; known: {', '.join(o for o in OPS if o not in INTEGER_OPS)}")
    kinds = OPS[op]
    if len(node.args) != len(kinds):
        raise RuleError(f"{where}: {op} takes {len(kinds)} arguments, got {len(node.args)}")
    return Term(op, tuple(_parse_arg(k, a, where, op) for k, a in zip(kinds, node.args)))


def _parse_condition(text: str, where: str) -> Condition:
    node = _expr(text, where)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CONDITIONS):
        raise RuleError(f"{where}: unknown condition {text!r}; known: {', '.join(CONDITIONS)}")
    kinds = CONDITIONS[node.func.id]
    if len(node.args) != len(kinds):
        raise RuleError(f"{where}: {node.func.id} takes {len(kinds)} arguments")
    args = tuple(Var(a.id) if k == "t" and isinstance(a, ast.Name) else _parse_arg(k, a, where, node.func.id)
                 for k, a in zip(kinds, node.args))
    if any(k == "t" and not isinstance(a, Var) for k, a in zip(kinds, args)):
        raise RuleError(f"{where}: conditions name pattern variables, not terms")
    return Condition(node.func.id, args)


def _expr(text: str, where: str):
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as err:
        hint = ("; a rule's conditions go on a line of their own below it ('  if flat(c, -1)')"
                if re.search(r"\sif\s", f" {text} ") else "")
        raise RuleError(f"{where}: cannot parse {text.strip()!r}: {err.msg}{hint}") from None


_RULE = re.compile(r"^rule\s+([\w.-]+)\s*:\s*(.+)$")
_FAMILY = re.compile(r"^family\s+([\w.-]+)(?:\s+phases?\s+(.+))?$")
_EXAMPLE = re.compile(r"^(rewrites|keeps)\s*:\s*(.+?)(?:\s+with\s+(.+))?$")
_DECL = re.compile(r"\s*(\w+)\s*(?:\[([^\]]*)\]|=\s*(\w+))\s*(?:,|$)")


def _dim(text: str, where: str):
    text = text.strip()
    if text.isdigit():
        return int(text)
    if not text.isidentifier():
        raise RuleError(f"{where}: a dim is an integer or a symbol name, not {text!r}")
    return text


def _parse_example(kind: str, term: str, decls: str | None, where: str) -> Example:
    node = _expr(term, where)
    t = _parse_term(node, where)
    if any(a.var for a in _walk_axes(t)):
        raise RuleError(f"{where}: an example's axes are integers (-1, -2), not variables")
    tensors, sizes, pos, decls = [], [], 0, (decls or "").strip()
    while pos < len(decls):
        m = _DECL.match(decls, pos)
        if not m:
            raise RuleError(f"{where}: cannot read a declaration from {decls[pos:].strip()!r} "
                            "(declare x[m, k] for an input, n = k for a scalar extent)")
        name, shape, size = m.groups()
        if shape is not None:
            tensors.append((name, tuple(_dim(d, where) for d in shape.split(",") if d.strip())))
        else:
            sizes.append((name, _dim(size, where)))
        pos = m.end()
    declared = [n for n, _ in tensors + sizes]
    used = set(_walk_vars(t))
    missing, unused = sorted(used - set(declared)), sorted(set(declared) - used)
    if missing or unused or len(declared) != len(set(declared)):
        raise RuleError(f"{where}: {kind} example: declare each variable once after 'with' "
                        f"(undeclared: {', '.join(missing) or '-'}; unused: {', '.join(unused) or '-'})")
    return Example(kind, t, tuple(tensors), tuple(sizes), term.strip(), where)


def _lines_before(text: str, source: str) -> int:
    """The lines of `source` before `text`, where source is a Python module holding the
    rules as a string (the library's `parse_rules(text, source=__file__)`), so
    that a rule's line is its module's; 0 for a rule file, whose text is the file."""
    if not source.endswith(".py"):
        return 0
    try:
        whole = Path(source).read_text()
    except OSError:
        return 0
    at = whole.find(text)
    return whole.count("\n", 0, at) if at > 0 else 0


def parse_rules(text: str, family: str | None = None, source: str = "<rules>") -> list[Rule]:
    """Read rule blocks; `family NAME` lines set the family of the rules after them."""
    rules: list[Rule] = []
    current = None
    phases: tuple = ()
    for lineno, raw in enumerate(text.splitlines(), start=1 + _lines_before(text, source)):
        line = raw.split("#", 1)[0].strip()
        where = f"{source}:{lineno}"
        if not line:
            continue
        if line.startswith("family "):
            m = _FAMILY.match(line)
            if not m:
                raise RuleError(f"{where}: expected 'family NAME' or 'family NAME phase P', got {line!r}")
            family = m.group(1)
            phases = tuple(p.strip() for p in (m.group(2) or "").split(",") if p.strip())
            continue
        m = _RULE.match(line)
        if m:
            if family is None:
                raise RuleError(f"{where}: rule {m.group(1)} has no family (add a 'family NAME' line)")
            arrows = m.group(2).count("=>")
            if arrows != 1:
                raise RuleError(f"{where}: rule {m.group(1)} needs one 'LHS => RHS', "
                                f"got {arrows} '=>' in {m.group(2)!r}")
            lhs, rhs = m.group(2).split("=>")
            current = Rule(m.group(1), family, "", _parse_term(_expr(lhs, where), where),
                           _parse_term(_expr(rhs, where), where), [], where, phases)
            rules.append(current)
        elif current is None:
            raise RuleError(f"{where}: expected 'rule NAME: LHS => RHS', got {line!r}")
        elif line.startswith("if "):
            current.conditions += [_parse_condition(c, where) for c in line[3:].split(" and ")]
        elif line.startswith("why:"):
            current.reason = line[4:].strip()
        elif line.startswith("f32:"):
            current.f32_exempt = line[4:].strip()
        elif _EXAMPLE.match(line):
            current.examples.append(_parse_example(*_EXAMPLE.match(line).groups(), where))
        else:
            raise RuleError(f"{where}: expected 'if ...', 'why: ...', 'f32: ...', 'rewrites: ...' or 'keeps: ...' "
                            f"under rule {current.name}, got {line!r}")
    for r in rules:
        _check(r)
    return rules


def _check(rule: Rule) -> None:
    """What the parser cannot see line by line: each variable has one kind, and every
    variable the rhs and the conditions use is bound by the lhs, which is an op (a bare
    variable matches every term, and egglog cannot ground the variables of a rule
    without an op to match)."""
    where = f"{rule.source}: rule {rule.name}"
    if not rule.reason:
        raise RuleError(f"{rule.source}: rule {rule.name} needs a one-line 'why:'")
    if isinstance(rule.lhs, Var):
        raise RuleError(f"{where}: the left-hand side must be an op, not the bare variable {rule.lhs.name!r}")
    _one_kind_each(rule, where)
    lhs_vars = set(_walk_vars(rule.lhs))
    lhs_axes = {a.var for a in _walk_axes(rule.lhs)}
    shifted = sorted(lhs_axes - {a.var for a in _walk_axes(rule.lhs) if a.offset == 0} - {None})
    if shifted:  # egglog binds a variable only where it matches bare ("Variable _a is ungrounded")
        raise RuleError(f"{where}: axis variable(s) {', '.join(shifted)} appear on the left only with an offset "
                        f"({', '.join(str(a) for a in _walk_axes(rule.lhs) if a.var in shifted)}): a pattern binds "
                        f"an axis variable where it stands alone; write it bare there (b for a-1, and b+1 for a)")
    _unbound(where, "rhs variable(s)", _walk_vars(rule.rhs), lhs_vars)
    _unbound(where, "rhs axis variable(s)", (a.var for a in _walk_axes(rule.rhs) if a.var), lhs_axes)
    for c in rule.conditions:
        shown = f"{where}: condition {_shown(c)}"
        _unbound(shown, "variable(s)", _walk_vars(c), lhs_vars)
        _unbound(shown, "axis variable(s)", (a.var for a in _walk_axes(c) if a.var), lhs_axes)


def _one_kind_each(rule: Rule, where: str) -> None:
    """A variable is a tensor, an axis or a top-k count, never two: egglog types each
    variable once (a tensor and an i64 under one name is an error deep inside it), and
    the verifier binds tensors, axes and counts separately."""
    first: dict[str, tuple[str, object]] = {}  # variable -> (its kind, the term or condition using it)
    for part in (rule.lhs, rule.rhs, *rule.conditions):
        for name, kind, user in _variable_uses(part):
            seen_kind, seen_user = first.setdefault(name, (kind, user))
            if seen_kind != kind:
                raise RuleError(f"{where}: variable {name!r} is used as {VARIABLE_KINDS[seen_kind]} in "
                                f"{_shown(seen_user)} and as {VARIABLE_KINDS[kind]} in {_shown(user)}; "
                                "give each use its own name")


def _shown(t) -> str:
    """A pattern or condition as the rule file writes it (variables by name)."""
    if isinstance(t, Var):
        return t.name
    if isinstance(t, (Term, Condition)):
        name = t.op if isinstance(t, Term) else t.kind
        return f"{name}({', '.join(_shown(a) for a in t.args)})"
    return str(t)


def _variable_uses(t, kind: str = "t", user=None):
    """(variable, its kind as an argument kind, the term or condition using it) for
    each variable in t, t itself taken as an argument of that kind."""
    if isinstance(t, Var):
        yield t.name, kind, user or t
    elif isinstance(t, Axis):
        if t.var:
            yield t.var, kind, user
    elif isinstance(t, (Term, Condition)):
        kinds = OPS[t.op] if isinstance(t, Term) else CONDITIONS[t.kind]
        for arg_kind, arg in zip(kinds, t.args):
            yield from _variable_uses(arg, arg_kind, t)


def _unbound(where: str, what: str, used, bound: set) -> None:
    extra = sorted(set(used) - bound)
    if extra:
        raise RuleError(f"{where}: {what} {', '.join(extra)} do not appear in the lhs")
