"""Candidate verification against the reference interpreter (fp64, random inputs).

Both graphs are interpreted in fp64 with every narrowing cast rounding, except the
MatMul operand roundings of the input graph's precision (encode.operand_roundings),
which rules may move: those are identities in both. Each output is rounded to its
own dtype, as the kernel's store rounds it. What remains must agree to fp64
accuracy: a deleted or moved rounding (`x.to(bf16).float()` turned into `x`) is a
mismatch."""
from __future__ import annotations

import math
import warnings

import sympy
import torch

from cleave.interpreter import TORCH_DTYPES, interpret
from cleave.ir import BindingError, CleaveError, Graph, Node
from cleave.ir import dims as D
from cleave.ir.dtypes import DType
from cleave.ir.graph import Constraint

from .encode import operand_roundings

SMALL = (5, 7, 6, 9, 11, 10, 13)


class CandidateMismatch(CleaveError):
    """A candidate computes something else than the graph it came from: a bug in a rule or in the search."""


class NoSmallBinding(CandidateMismatch):
    """No small values of the symbols meet the graph's constraints (or the input graph
    fails in the interpreter at them): it can be checked at the user's shapes only."""


def small_binding(naive: Graph, cand: Graph, shapes: dict | None = None) -> dict[str, int]:
    """Small odd values for the symbols (or the user's), then split counts that leave a
    ragged, non-empty last chunk; bumped until every constraint holds."""
    # an input no output reads (an unused argument) still gets a tensor: its dims need values
    unread = {s.name for n in naive.inputs.values() for s in D.free_symbols(n.shape)}
    syms = sorted({s.name for g in (naive, cand) for s in g.symbols()} | unread)
    plain = [s for s in syms if not s.startswith("s_")]
    free = set(plain) - set(shapes or {})
    for scale in (1, 2, 4, 8):
        env = {s: (shapes or {}).get(s, SMALL[i % len(SMALL)] * scale) for i, s in enumerate(plain)}
        _meet_divisions(naive.constraints + cand.constraints, env, free)
        bounds = index_bounds(naive, env)
        _meet_bounds(naive.constraints + cand.constraints + bounds + size_index_bounds(naive), env, free)
        for s in syms:
            if s.startswith("s_"):
                env[s] = _ragged_count(_extent_of(cand, s, env))
        try:
            naive.check(env)
            cand.check(env)
            for c in bounds:
                if not c.holds(env):
                    raise BindingError(f"constraint {c} fails")
            return env
        except (BindingError, KeyError) as err:
            last = f"at {env}: {err}"
    raise NoSmallBinding(f"no small binding satisfies the constraints of {cand.name} ({last})"
                         + "".join("\n" + str(c) for c in naive.constraints + cand.constraints + bounds))


def _meet_divisions(constraints, env: dict, free: set) -> None:
    """Make a free symbol that an equality divides (a reshape of d into h heads of
    floor(d/h): d = h * floor(d/h)) a multiple of its divisor, or, dividing a number
    (10 channels into g groups), the divisor of that number nearest its value."""
    for c in constraints:
        if c.kind != "eq":
            continue
        for part in (D.dim(c.lhs), D.dim(c.rhs)):
            for fl in part.atoms(sympy.floor):
                num, den = sympy.fraction(sympy.together(fl.args[0]))
                if num.is_Symbol and num.name in free and not den.free_symbols & {num}:
                    try:
                        env[num.name] *= D.evaluate(den, env)
                    except KeyError:
                        continue
                elif num.is_Integer and den.is_Symbol and den.name in free:
                    env[den.name] = min(sympy.divisors(int(num)), key=lambda d: (abs(d - env[den.name]), -d))


def _meet_bounds(constraints, env: dict, free: set) -> None:
    """Move a free symbol that a constraint bounds into its bound: up to a bound from
    below (`s7 <= s13`, a gather's index no longer than its input), down to one from
    above (`n <= 4`, the branch `if x.shape[0] <= 4` traced): values given in symbol
    order may break them at every scale."""
    for _ in range(len(constraints) + 1):
        moved = False
        for c in constraints:
            if c.kind != "le":
                continue
            for side, other, raise_it in ((D.dim(c.rhs), c.lhs, True), (D.dim(c.lhs), c.rhs, False)):
                if not side.is_Symbol or side.name not in free:
                    continue
                try:
                    bound = D.evaluate(other, env)
                except KeyError:
                    continue
                if (env[side.name] < bound) if raise_it else (bound >= 1 and env[side.name] > bound):
                    env[side.name], moved = bound, True
            moved |= _meet_linear(c, env, free) or _meet_product(c, env, free)
        if not moved:
            return


def _meet_linear(c, env: dict, free: set) -> bool:
    """Meet a bound on a sum of free symbols (`s + t <= 8`, a cache kept to its last 8
    rows while it is shorter): lower the symbols it adds, each to 1 at least, then
    raise those it subtracts. Whether it moved any."""
    f = sympy.expand(D.dim(c.lhs) - D.dim(c.rhs))
    syms = sorted((x for x in f.free_symbols if x.name in free), key=lambda x: x.name)
    try:
        excess = D.evaluate(f, env)
    except (KeyError, TypeError):
        return False
    # linear in them only (a floor, a Mod or a product of two is left to the scaling)
    if excess <= 0 or not syms or not f.is_polynomial(*syms) or sympy.Poly(f, *syms).total_degree() != 1:
        return False
    coefs = [(x, f.coeff(x)) for x in syms]
    if any(not k.is_Number or k == 0 for _, k in coefs):
        return False
    moved = False
    for x, k in [(x, k) for x, k in coefs if k > 0] + [(x, k) for x, k in coefs if k < 0]:
        step = -(-excess // abs(k))
        new = max(1, env[x.name] - step) if k > 0 else env[x.name] + step
        excess -= k * (env[x.name] - new)
        moved |= new != env[x.name]
        env[x.name] = int(new)
        if excess <= 0:
            break
    return moved


def _meet_product(c, env: dict, free: set) -> bool:
    """Meet a bound between products of symbols (`b*(t-1) <= B*(T-1)`: a shifted
    cross-entropy's labels no longer than its logits, each batch and length a symbol of
    its own under dynamo), which _meet_linear leaves: lower a free symbol only the
    bounded side holds, else raise one only the bounding side holds, each to the value
    nearest its own where the bound holds. Whether it moved any."""
    lhs, rhs = D.dim(c.lhs), D.dim(c.rhs)

    def holds() -> bool:
        return D.evaluate(lhs, env) <= D.evaluate(rhs, env)

    try:
        if holds():
            return False
    except (KeyError, TypeError):
        return False
    lower = sorted(x.name for x in lhs.free_symbols - rhs.free_symbols if x.name in free)
    higher = sorted(x.name for x in rhs.free_symbols - lhs.free_symbols if x.name in free)
    tries = [(s, range(env[s] - 1, 0, -1)) for s in lower] + [(s, range(env[s] + 1, 4 * env[s] + 64)) for s in higher]
    for s, values in tries:
        old = env[s]
        for v in values:
            env[s] = v
            if holds():
                return True
        env[s] = old
    return False


def index_bounds(g: Graph, env: dict) -> list[Constraint]:
    """Each gather or take whose indices are constants (a channel shuffle's permutation,
    `torch.gather(x, 1, tensor([[9]]))`) bounds the axis it reads from below: the
    check's small binding must keep those indices in range, as the program's own
    sizes do. The indices are evaluated at `env` (they may take its shapes)."""
    out = []
    for n in g.live_nodes():
        if n.op not in ("gather", "take"):
            continue
        below = _ancestors(n.inputs[1])
        if any(x.op == "input" for x in below.values()):
            continue
        try:
            index = _value(n.inputs[1], below, env)
        except (BindingError, KeyError, RuntimeError):
            continue  # not at this binding (a reshape it does not divide): its constraint says why
        if index.numel():  # a negative index counts from the end
            low, high, axis = int(index.min()), int(index.max()), n.attrs["axis"]
            out.append(Constraint("le", D.dim(max(high + 1, -low)), n.inputs[0].shape[axis],
                                  f"{n.op} %{n.id}: constant indices {low}..{high} along its operand's dim {axis}"))
    return out


def size_index_bounds(g: Graph) -> list[Constraint]:
    """Each gather or take whose indices follow from sizes (`emb[logits.argmax(-1)]`: 0 up
    to the vocab) bounds the axis it reads from below, where that axis is another size.
    A bound to meet where the binding can, not to require: the range is not tight (an
    argmax's reaches its axis' extent, which only an empty axis gives), and over the
    axis the indices came from (`x.gather(1, x.argmax(1, keepdim=True))`) it never holds."""
    out, ranges = [], {}
    for n in g.live_nodes():
        if n.op not in ("gather", "take"):
            continue
        span = _value_range(n.inputs[1], ranges)
        extent = n.inputs[0].shape[n.attrs["axis"]]
        if span is None or D.dim(extent).free_symbols & (span[0].free_symbols | span[1].free_symbols):
            continue
        low, high = span
        out.append(Constraint("le", sympy.Max(high + 1, -low), extent,
                              f"{n.op} %{n.id}: indices {D.fmt(low)}..{D.fmt(high)} along its operand's dim "
                              f"{n.attrs['axis']}"))
    return out


# Ops whose every value is one of their first operand's values
_VALUE_KEEPING = ("reshape", "permute", "broadcast", "slice", "gather", "take", "concat")


def _value_range(node: Node, memo: dict) -> tuple | None:
    """Lowest and highest value of an integer node, in the graph's symbols, wherever it
    follows from sizes alone (an iota, an argmax's index of the extreme, a size, their
    sums and selections), else None (an integer input holds anything)."""
    if node.id in memo:
        return memo[node.id]
    op, ins = node.op, node.inputs
    spans = None
    if not node.dtype.is_float:
        if op == "iota":
            spans = (sympy.Integer(0), D.dim(node.attrs["shape"][node.attrs["axis"]]) - 1)
        elif op == "size":
            spans = (D.dim(node.attrs["value"]),) * 2
        elif op == "const" and float(node.attrs["value"]).is_integer():
            spans = (sympy.Integer(int(node.attrs["value"])),) * 2
        elif op == "slice" and ins[0].op == "iota" and node.attrs["axis"] == ins[0].attrs["axis"] \
                and node.attrs["step"] == 1 and D.dim(node.attrs["start"]).is_number:
            # the iota's own slice: start .. stop - 1 of it
            whole = _value_range(ins[0], memo)
            spans = (D.dim(node.attrs["start"]), sympy.Min(D.dim(node.attrs["stop"]) - 1, whole[1]))
        elif op in _VALUE_KEEPING or (op == "cast" and not ins[0].dtype.is_float) or \
                (op == "reduce" and node.attrs["op"] in ("max", "min")):
            parts = [_value_range(x, memo) for x in (ins if op == "concat" else ins[:1])]
            spans = None if None in parts else (sympy.Min(*[p[0] for p in parts]), sympy.Max(*[p[1] for p in parts]))
        elif op == "where":
            a, b = _value_range(ins[1], memo), _value_range(ins[2], memo)
            spans = None if a is None or b is None else (sympy.Min(a[0], b[0]), sympy.Max(a[1], b[1]))
        elif op in ("add", "sub"):
            a, b = _value_range(ins[0], memo), _value_range(ins[1], memo)
            if a is not None and b is not None:
                spans = (a[0] + b[0], a[1] + b[1]) if op == "add" else (a[0] - b[1], a[1] - b[0])
        elif op == "topk" and node.attrs["which"] == "indices":
            spans = (sympy.Integer(0), ins[0].shape[node.attrs["axis"]] - 1)
    memo[node.id] = spans
    return spans


def _ancestors(node: Node) -> dict[int, Node]:
    """The node and every node it reads, by id."""
    found, stack = {}, [node]
    while stack:
        n = stack.pop()
        if n.id not in found:
            found[n.id] = n
            stack.extend(n.inputs)
    return found


def _value(node: Node, below: dict[int, Node], env: dict) -> torch.Tensor:
    """The value at env of a node that reads no input (`below`: it and its ancestors)."""
    g, copies = Graph(f"value of %{node.id}"), {}
    for i in sorted(below):  # ids are in build order: operands first
        n = below[i]
        copies[i] = g.add(n.op, *(copies[x.id] for x in n.inputs), **n.attrs)
    g.output(copies[node.id])
    return interpret(g, {}, env=env)[0]


def _extent_of(g: Graph, count: str, env) -> int:
    for n in g.live_nodes():
        if n.op == "split" and str(n.attrs["count"]) == count:
            return D.evaluate(n.inputs[0].shape[n.attrs["axis"]], env)
    return 2


def _ragged_count(n: int) -> int:
    for c in range(3, n):
        chunk = -(-n // c)
        if n % c and (c - 1) * chunk < n:
            return c
    return max(1, min(2, n))


def inputs_for(g: Graph, env: dict, seed: int, positive: bool = False,
               index_range: int | None = None) -> dict[str, torch.Tensor]:
    """Random inputs in fp64 holding values of each input's own dtype (a bf16 input
    gets bf16 values): normal, or in [0.5, 1.5) with `positive` (log's and sqrt's domain);
    integers in [0, index_range) where given."""
    gen = torch.Generator().manual_seed(seed)
    out, indices = {}, index_range or _index_range(g, env)
    for name, node in g.inputs.items():
        shape = [D.evaluate(d, env) for d in node.shape]
        if node.dtype.is_float:
            x = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5 if positive else \
                torch.randn(shape, generator=gen, dtype=torch.float64)
            out[name] = x.to(TORCH_DTYPES[node.dtype]).double()
        else:
            high = 2 if node.dtype.value == "bool" else indices
            out[name] = torch.randint(0, high, shape, generator=gen).to(TORCH_DTYPES[node.dtype])
    return out


def _index_range(g: Graph, env: dict) -> int:
    """Integer inputs take values in [0, this): 4, or less where a gather or take reads
    a shorter axis (`x[:, idx]` of 3 columns), whose eager form fails past its end."""
    extents = [D.evaluate(n.inputs[0].shape[n.attrs["axis"]], env) for n in g.nodes if n.op in ("gather", "take")]
    return max(1, min([4, *extents]))


class CandidateCheckSkipped(UserWarning):
    """A candidate too large to interpret at its only binding (every dim static and
    large): it rests on its rules' proofs alone."""


# Multiply-adds and elements one interpretation may take (~1 s in fp64 on a small
# CPU). A graph with symbols is checked where they are small; only an all-static
# graph (a whole layer at its real widths) can exceed it.
CHECK_BUDGET = 5e8


def interpretation_cost(graph: Graph, env: dict) -> float:
    """Multiply-adds of its MatMuls plus elements of its other nodes, at env."""
    total = 0.0
    for n in graph.live_nodes():
        elements = float(math.prod(graph.concrete_shape(n, env)))
        total += elements * (D.evaluate(n.inputs[0].shape[-1], env) if n.op == "matmul" else 1)
    return total


def check_candidate(naive: Graph, cand: Graph, shapes: dict | None = None, seed: int = 0) -> dict | None:
    """Raise CandidateMismatch unless `cand` interprets equal to `naive` at a small binding
    (or at the user's `shapes`: symbol -> value), on normal and on positive inputs (log
    and rsqrt of normal ones are NaN: NaN must match NaN). Returns the binding used, or
    None when the check was skipped (CandidateCheckSkipped) as over CHECK_BUDGET."""
    return Reference(naive, seed).check(cand, shapes)


class Reference:
    """The input graph as candidates are checked against it: its compared values,
    interpreted once per binding and input set, however many candidates are checked.

    `decoded` is the input graph as the search decodes it, under the precision policy
    that computes a chain of half ops in f32 where eager rounds each op (rules/lower.py):
    every candidate computes so. Where the input graph and `decoded` differ only by
    those roundings (a relative error within the half output's machine epsilon), a
    candidate equal to `decoded` is kept: a bf16 GPT-2's logits flip by an ulp here and
    there, and every rewrite was rejected over it."""

    def __init__(self, naive: Graph, seed: int = 0, decoded: Graph | None = None):
        self.naive, self.seed, self.decoded = naive, seed, decoded
        self.wanted: dict = {}
        self.policy: dict = {}  # binding and input set -> decoded's values, or None where they are not close

    def check(self, cand: Graph, shapes: dict | None = None) -> dict | None:
        """check_candidate of one candidate."""
        env = small_binding(self.naive, cand, shapes)
        if self._over_budget(env):
            return None
        for positive in (False, True):
            ins, want = self._values(env, positive)
            got = _interpreted(cand, ins, env, self.naive, CandidateMismatch)
            if all(map(_same, want, got)) or self._as_decoded(env, positive, got):
                continue
            for name, w, g in zip(self.naive.output_names, want, got):
                if not _same(w, g):
                    raise CandidateMismatch(
                        f"candidate of {self.naive.name} differs on output {name!r} at {_binding(env)}"
                        + (" (positive inputs)" if positive else "")
                        + f"\n--- input graph ---\n{self.naive.text()}--- candidate ---\n{cand.text()}")
        return env

    def _as_decoded(self, env: dict, positive: bool, got: list) -> bool:
        """Whether `got` is the decoded input graph's values, and those are the input
        graph's up to the policy's roundings."""
        if self.decoded is None:
            return False
        key = (tuple(sorted(env.items())), positive)
        if key not in self.policy:
            ins, want = self._values(env, positive)
            values = _interpreted(self.decoded, ins, env, self.naive, CandidateMismatch)
            close = all(_within_rounding(w, v, o.dtype) for w, v, o in zip(want, values, self.naive.outputs))
            self.policy[key] = values if close else None
        values = self.policy[key]
        return values is not None and all(map(_same, values, got))

    def _over_budget(self, env: dict) -> bool:
        cost = interpretation_cost(self.naive, env)
        if cost <= CHECK_BUDGET:
            return False
        dynamic = any(not k.startswith("s_") for k in env)  # not only the split counts
        advice = ("its static dims alone are over the budget" if dynamic else
                  "declare an axis dynamic to have it checked at small sizes")
        warnings.warn(f"candidate of {self.naive.name}: not interpreted against the input graph, which costs "
                      f"{cost:.2g} operations at its smallest binding {env} (budget {CHECK_BUDGET:.0e}): it "
                      f"rests on its rules' proofs; {advice}", CandidateCheckSkipped, stacklevel=5)
        return True

    def _values(self, env: dict, positive: bool) -> tuple[dict, list]:
        key = (tuple(sorted(env.items())), positive)
        if key not in self.wanted:
            self.wanted[key] = self._first_that_runs(env, positive)
        return self.wanted[key]

    def _first_that_runs(self, env: dict, positive: bool) -> tuple[dict, list]:
        """Inputs the input graph runs on, and its values there. Integers are drawn in the
        index range first, then as 0/1 (a mask), then all 0: an index the program computes
        from its integer inputs (positions as a mask's cumsum, into a table of rotary
        angles) may fall past its table for random values that the program never gets.
        The binding meets every constraint the check knows of: where no integers make the
        program run (an index read off the data), it raises NoSmallBinding."""
        integers = any(not n.dtype.is_float for n in self.naive.inputs.values())
        failure = None
        for index_range in (None, 2, 1) if integers else (None,):
            ins = inputs_for(self.naive, env, self.seed, positive, index_range)
            try:
                return ins, _interpreted(self.naive, ins, env, None, NoSmallBinding)
            except NoSmallBinding as err:
                failure = failure or err
        raise failure


def _interpreted(graph: Graph, ins: dict, env: dict, source: Graph | None, error: type) -> list:
    """compared_values, with the reference interpreter's failure raised as `error`,
    naming the graph and the binding."""
    try:
        return compared_values(graph, ins, env, source)
    except (RuntimeError, IndexError) as err:
        what = f"a candidate of {source.name}" if source else f"the input graph {graph.name}"
        raise error(f"{what} cannot be interpreted at {_binding(env)}: {type(err).__name__}: {err}") from err


def _same(want: torch.Tensor, got: torch.Tensor) -> bool:
    if want.shape != got.shape:
        return False
    if not want.is_floating_point():
        return torch.equal(want, got)
    return torch.allclose(want, got.to(want.dtype), rtol=1e-7, atol=1e-9, equal_nan=True)


def _within_rounding(want: torch.Tensor, got: torch.Tensor, dtype) -> bool:
    """Equal, or for a half output equal in its non-finite elements and within the
    type's machine epsilon in relative L2 over the others."""
    if _same(want, got):
        return True
    if dtype not in (DType.bf16, DType.f16) or want.shape != got.shape:
        return False
    finite = want.isfinite()
    if not torch.equal(finite, got.isfinite()) or not torch.equal(want[~finite].nan_to_num(), got[~finite].nan_to_num()):
        return False
    error = (want[finite] - got[finite]).norm()
    return bool(error <= torch.finfo(TORCH_DTYPES[dtype]).eps * want[finite].norm())


def _binding(env: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "its static shapes"


def compared_values(graph: Graph, inputs: dict[str, torch.Tensor], env: dict,
                    source: Graph | None = None) -> list[torch.Tensor]:
    """The graph's outputs as the candidate check compares them: in fp64, MatMul
    operand roundings (of `source`'s precision, the input graph a candidate was decoded
    from) as identities, each float output rounded to its dtype."""
    values = interpret(graph, inputs, torch.float64, env, exact=operand_roundings(graph, source))
    return [v.to(TORCH_DTYPES[o.dtype]).double() if v.is_floating_point() else v for v, o in zip(values, graph.outputs)]
