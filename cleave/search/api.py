"""`cleave.search(graph)`: saturate, extract the top-k candidates, verify each."""
from __future__ import annotations

import math
import numbers
import os
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cleave.ir import Graph, rebuild
from cleave.ir import dims as D
from cleave.ir.dtypes import DType
from cleave.ir.contracts import Candidate
from cleave.torch_state import under_torch_defaults

from . import extraction_cost as C
from .validate import CandidateMismatch, NoSmallBinding, Reference
from .encode import encode
from .extract import Index, distinct, explore, find_class, read, to_candidate
from .saturate import Budgets, saturate


@dataclass
class SearchResult:
    candidates: list[Candidate]
    stats: dict = field(default_factory=dict)

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


@under_torch_defaults
def search(graph: Graph, top_k: int = 5, rules=None, iterations: int | None = None, enodes: int | None = None,
           seconds: float | None = None, progress: bool = True, verify: bool = True,
           shapes: dict | None = None) -> SearchResult:
    """Equality saturation of `graph` under `rules`, then the `top_k` cheapest distinct
    candidates, each checked against the reference interpreter. `rules`: None (the
    library, cleave.rules.all_rules(); an empty list too, no rule files, as for
    cleave.compile), Rule objects to search with instead of it, or rule files (a path
    or a list of paths), searched beside the library as `cleave.compile(rules=...)` does. `shapes` (symbol of the graph -> int >= 0) ranks
    at, and verifies at, the user's shapes."""
    _check_graph(graph)
    _check_budgets(top_k=top_k, iterations=iterations, enodes=enodes, seconds=seconds)
    _check_shapes(graph, shapes)
    rules = _resolved_rules(rules)
    from cleave.verify import sound_rules

    # only proven rules reach saturation: UnsoundRule on a counterexample, UnprovenRuleWarning per unknown rule left out
    gate_start = time.perf_counter()
    rules = sound_rules(rules)
    # The budget clock starts after the gate: proving the library is a one-time cost
    # (cached), and charging it to one search would cut that search's extraction short.
    start = time.perf_counter()
    verify_seconds = start - gate_start
    d = Budgets()
    budgets = Budgets(iterations or d.iterations, enodes or d.enodes, seconds or d.seconds)
    enc = encode(graph)
    holds = _graph_conditions(enc)
    from cleave.rules import all_rules

    library = {r.name for r in all_rules()}
    _warn_own_rules_left_out(graph, rules, holds, library)
    rules = [r for r in rules if all(holds[c.kind] for c in r.conditions if c.kind in holds)]
    sat = saturate(enc, rules, budgets, progress)
    classes = read(sat.egraph)
    _release(sat)
    roots = [find_class(classes, t) for t in enc.outputs]
    # Self-attention's s is both kept (query rows) and reduced (softmax over keys): ranked
    # short, the two-pass softmax would look as cheap as the fused one.
    env = C.representative(graph, enc.reducible | graph.reduced_symbols(), shapes)
    left = max(1.0, budgets.seconds - (time.perf_counter() - start))
    found, extraction_stop = explore(enc, classes, roots, env, seconds=left, saturation_stop=sat.stop_note)
    stopped = "; ".join(s for s in (sat.stopped, extraction_stop) if s) or None
    index = Index(classes)
    candidates = [to_candidate(r, rules, enc.outputs, index) for r in distinct(found, top_k)]
    for c in candidates:
        c.graph.name = graph.name
        _keep_constraints(graph, c.graph)
        for origin, constraint in _nonempty_constraints(c.graph, rules, c.derivation):
            c.graph._constrain(constraint)
    ranked = candidates
    if verify:
        candidates = verified(graph, candidates, shapes, cancelling=_cancelling(rules, sat.fired),
                              decoded=enc.decode(enc.outputs)[0])
    kept = set(map(id, candidates))
    rejected = {name for c in ranked if id(c) not in kept for name in c.derivation}
    _warn_unused_own_rules(graph, rules, library, sat.fired, candidates, rejected, stopped)
    stats = {"seconds": round(time.perf_counter() - start, 3), "rule_check_seconds": round(verify_seconds, 3),
             "saturation_seconds": round(sat.seconds, 3),
             "enodes": sat.enodes, "eclasses": len(classes), "iterations": sat.iterations,
             "rules_fired": dict(sorted(sat.fired.items())), "visited": len(found), "stopped": stopped}
    return SearchResult(candidates, stats)


def _release(sat) -> None:
    """Frees the saturated e-graph now, not at the search's end: extraction and
    verification need only the classes read from it."""
    sat.egraph = None


def _warn_own_rules_left_out(graph: Graph, rules, holds: dict, library: set) -> None:
    """Say which of the user's own rules (not named in `library`) a condition on the whole
    graph leaves out of this search (the library's are left out quietly: that is what the
    conditions are for)."""
    out = [f"{r.name} ({', '.join(f'{c.kind}()' for c in r.conditions if not holds.get(c.kind, True))})"
           for r in rules if r.name not in library and any(not holds.get(c.kind, True) for c in r.conditions)]
    if out:
        warnings.warn(RuleNotUsed(f"search of {graph.name}: rule(s) {', '.join(out)} left out: the condition does not "
                                  f"hold for this graph (see docs/rules.md on graph conditions)"), stacklevel=3)


def _cancelling(rules, fired: dict) -> list[str]:
    """The rules that fired whose right side is one of their variables."""
    from cleave.rules.dsl import Var

    return sorted(r.name for r in rules if isinstance(r.rhs, Var) and fired.get(r.name))


class RuleNotUsed(UserWarning):
    """A rule of the user's never matched the graph, or fired yet no candidate's
    derivation lists it."""


def _warn_unused_own_rules(graph, rules, library: set, fired: dict, candidates, rejected: set,
                           stopped: str | None) -> None:
    """Say which of the user's own rules (not the library's) never matched (a typo in an
    op's name or a dtype the graph lacks, found only by reading the stats before), or
    fired without reaching a candidate, and why where it is known: a researcher's
    exp(x)·exp(y) => exp(x + y) fired and was never extracted (an exp of an operand that is no difference may
    overflow, so extraction leaves it out), and nothing said so; a rule whose candidate
    the check rejected (`rejected`) was said to "cost more". A rule whose right side is
    one of its variables only cancels terms: derivations never list it."""
    from cleave.rules.dsl import Var

    budget = f"; the search stopped at a budget ({stopped})" if stopped else ""
    never = [r.name for r in rules if r.name not in library and not fired.get(r.name)]
    if never:
        warnings.warn(RuleNotUsed(
            f"search of {graph.name}: rule(s) {', '.join(never)} never matched: no term of the graph, nor of any "
            f"form the other rules derived from it, matches their left side where their conditions hold{budget}"),
            stacklevel=3)
    builds = {r.name for r in rules if not isinstance(r.rhs, Var)}
    used = {name for c in candidates for name in c.derivation}
    unused = sorted(n for n in fired if n in builds and n not in library and n not in used)
    refused = [n for n in unused if n in rejected]
    if refused:
        warnings.warn(RuleNotUsed(
            f"search of {graph.name}: rule(s) {', '.join(refused)} fired, but the check against the reference "
            "interpreter rejected their candidates (the CandidateRejected warning says where they differ)"),
            stacklevel=3)
    unused = [n for n in unused if n not in rejected]
    if unused:
        ranked = ", so they may not have been ranked" if stopped else ""
        warnings.warn(RuleNotUsed(
            f"search of {graph.name}: rule(s) {', '.join(unused)} fired, but no candidate kept uses them: "
            "their results cost more than the candidates kept, or are forms the extraction leaves out (an exp "
            f"or exp2 of an operand that is not a difference x - m, which may overflow; docs/rules.md){budget}{ranked}"),
            stacklevel=3)


class CandidateRejected(UserWarning):
    """A candidate left out: it differs from the input graph (a bug in a rule of its
    derivation, or in the search) or could not be checked."""


def verified(graph: Graph, candidates: list[Candidate], shapes: dict | None = None,
             cancelling: list[str] = (), decoded: Graph | None = None) -> list[Candidate]:
    """The candidates that interpret equal to `graph` at a small binding, and at `shapes`
    when given. Those that differ, or that no binding lets the check interpret, are left
    out with one CandidateRejected warning naming the rules of each one's derivation, and
    the rules that fired whose right side is a bare variable (`cancelling`: derivations
    never list them); the graph as written stands in when none is left (it computes what
    the program does). `decoded`: the input graph under the search's precision policy
    (validate.Reference)."""
    reference = Reference(graph, decoded=decoded)
    kept, rejected = [], {}
    unlisted = f"rules derivations do not list ({', '.join(cancelling)}, which cancel terms)" if cancelling \
        else "no rule (the input graph, decoded)"
    for cand in candidates:
        try:
            _check(reference, cand.graph, shapes)
        except CandidateMismatch as err:
            reason = f"{type(err).__name__}: {str(err).splitlines()[0]}"
            derived = " + ".join(cand.derivation)
            rejected.setdefault(reason, []).append(
                f"{derived} and perhaps {unlisted}" if derived and cancelling else derived or unlisted)
            continue
        kept.append(cand)
    if rejected:
        left_out = "; ".join(f"derived by {', '.join(rules)} ({reason})" for reason, rules in rejected.items())
        using = f"{len(kept)} other candidate(s) kept" if kept else "the graph as written stands in"
        warnings.warn(CandidateRejected(f"search of {graph.name}: left out the candidate(s) {left_out}; {using}"),
                      stacklevel=3)
    return kept or [Candidate(rebuild(graph), cost=C.cost(graph))]


def _check(reference: Reference, cand: Graph, shapes: dict | None) -> None:
    """At a small binding; where no small values meet the constraints, at `shapes` alone."""
    try:
        reference.check(cand)
    except NoSmallBinding:
        if not shapes:
            raise
    if shapes:
        reference.check(cand, shapes)


def _graph_conditions(enc) -> dict[str, bool]:
    """Whether each condition on the whole graph holds, decided once per search:
    `wide_operands()` leaves out rules that move a factor into a MatMul operand where
    the operands are f16 (an fp16 attention scaled by 100 overflowed q * 100 to inf and
    returned NaN); `moderate_values()` leaves out the base-2 rewrites where an exponent
    may hold values near f32's range (a T5 mask, `(1 - m) * finfo.min`, became
    `(1 - m) * -inf` and every row NaN)."""
    return {"wide_operands": enc.lowp is not DType.f16,
            "moderate_values": not _huge_constants(enc.graph) and not _full_scale_exponents(enc.graph),
            "unshifted_operands": enc.lowp is None or not _shifted_operands(enc.graph)}


# Ops a row shift passes through unchanged on its way into a MatMul operand (a reshape
# that keeps the last axis: linear's flattening of the leading ones).
_PASS_THROUGH = {"cast", "neg", "reshape"}


def _shifted_operands(graph) -> list:
    """The MatMuls whose left operand is a row shift times row scales, (a - m) c with m
    and c flat along the contracted axis, through casts, negations and reshapes that
    keep the last axis: the operand that
    `unshifted_operands()` keeps a rule from leaving to the MatMul's rounding."""
    def flat(node) -> bool:
        return node.rank == 0 or D.equal(node.shape[-1], 1)

    out = []
    for mm in (n for n in graph.live_nodes() if n.op == "matmul"):
        node, scaled = mm.inputs[0], False
        while True:
            if node.op in _PASS_THROUGH and node.rank and D.equal(node.shape[-1], node.inputs[0].shape[-1]):
                node = node.inputs[0]
            elif node.op in ("mul", "div") and flat(node.inputs[1]) and not flat(node.inputs[0]):
                node, scaled = node.inputs[0], True
            elif node.op == "mul" and flat(node.inputs[0]) and not flat(node.inputs[1]):
                node, scaled = node.inputs[1], True
            else:
                break
        if scaled and node.op in ("sub", "add") and sum(map(flat, node.inputs)) == 1:
            out.append(mm)
    return out


HUGE = 2.0 ** 127  # f32's largest finite value is just under 2^128


def _huge_constants(graph) -> list:
    """The graph's finite constants that a factor of 2 would overflow in f32."""
    out = []
    for n in graph.live_nodes():
        if n.op == "const" and n.attrs.get("value") is not None:
            value = float(n.attrs["value"])
            if math.isfinite(value) and abs(value) >= HUGE:
                out.append(n)
    return out


# Ops whose result may hold an operand's values unscaled: moved, selected, added, rounded.
_KEEP_SCALE = {"cast", "neg", "abs", "broadcast", "reshape", "permute", "slice", "gather", "take", "concat",
               "split", "add", "sub", "max", "min", "where", "floor", "ceil", "trunc", "round"}


def _full_scale_exponents(graph) -> list:
    """The exp and exp2 nodes whose argument may hold a graph input's values at full
    scale, as an additive mask holds finfo.min (HF's, T5's, passed in): log2(e) > 1
    folded into such an argument overflows it to -inf, and a fully masked row, finite
    and uniform eagerly, is -inf - -inf = NaN. Scores out of a MatMul, a mask the
    graph builds from iota, and an input scaled by at most ln 2 (log2(e) times that is
    at most 1) are not: a scale input multiplies the scores, it adds nothing. A
    constant of LARGE or more (a -1e38 fill) is large: finite times log2(e), but full
    scale once amplified (`masked_fill(-1e38) * 2.5`, or times a temperature passed in,
    overflowed to -inf and the padded row was NaN)."""
    full: set[int] = set()
    large: set[int] = set()
    nodes = graph.live_nodes()
    for n in nodes:
        operands = n.inputs[1:] if n.op == "where" else n.inputs
        if n.op == "input":
            takes = n.dtype.is_float
        elif n.op == "const":
            takes = False
            if _magnitude(n) >= LARGE:
                large.add(n.id)
        elif n.op in _KEEP_SCALE or n.op == "reduce" and n.attrs["op"] in ("max", "min"):
            takes = any(i.id in full for i in operands)
            if any(i.id in large for i in operands):
                large.add(n.id)
        elif n.op in ("mul", "div"):
            takes = _amplified(n, full) or _amplified(n, large, by=full | large)
            if not takes and any(i.id in large for i in n.inputs):
                large.add(n.id)
        else:
            takes = False
        if takes:
            full.add(n.id)
    return [n for n in nodes if n.op in ("exp", "exp2") and n.inputs[0].id in full]


# A constant this large is finite times log2(e) but not amplified much further: 2^28
# times it (a temperature, a scale passed in) reaches f32's range.
LARGE = 2.0 ** 100


def _amplified(n, full: set, by: set | None = None) -> bool:
    """Whether a product or quotient may hold a full-scale operand's values times more
    than ln 2: times another full-scale value (a 0/1 mask times a -1e38 scalar input, a
    masked score times a scale input) or a constant over ln 2; over anything but a
    constant of at least 1 / ln 2. A scale input times the scores is not: the scores
    are not full scale. `by`: the values that amplify as full-scale ones do (default
    `full`)."""
    by = full if by is None else by
    a, b = n.inputs
    if n.op == "div":
        return a.id in full and not _magnitude(b) >= 1 / math.log(2)
    return any(x.id in full and (y.id in by or _magnitude(y) > math.log(2)) for x, y in ((a, b), (b, a)))


def _magnitude(node) -> float:
    """A constant's magnitude; NaN (which compares false) for anything else."""
    if node.op == "const" and node.attrs.get("value") is not None:
        return abs(float(node.attrs["value"]))
    return math.nan


def _check_budgets(*, seconds, **counts) -> None:
    """Counts are positive ints and seconds a positive finite number (None: the default):
    a string or a bool is a caller's mistake, said before the search starts."""
    for name, value in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(f"search: {name} must be a positive integer, got {value!r}")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, numbers.Real)
                                or not 0 < seconds < math.inf):
        raise ValueError(f"search: seconds must be a finite number > 0, got {seconds!r}")


def _check_graph(graph) -> None:
    if not isinstance(graph, Graph):
        raise TypeError(f"search: graph must be a cleave Graph (from cleave.capture(fn, *inputs), "
                        f"cleave.parse_graph(text) or cleave.Graph), got {type(graph).__name__} {graph!r:.80}")
    if not graph.outputs:  # else a candidate of cost 0 that computes nothing, first among any others
        raise ValueError(f"search: graph {graph.name!r} has no outputs (give it some with graph.output(...))")


def _check_shapes(graph: Graph, shapes) -> None:
    """A dict of the graph's symbols to ints >= 0 (0: an empty axis, which the search
    ranks and checks), or None: a misspelt symbol would be ignored silently."""
    if shapes is None:
        return
    if not isinstance(shapes, Mapping):
        raise ValueError(f"search: shapes must be a dict {{symbol: extent}}, got {shapes!r}")
    # an input no output reads still has dims the check binds
    known = {s.name for s in graph.symbols()} | {s.name for n in graph.inputs.values()
                                                 for s in D.free_symbols(n.shape)}
    for name, value in shapes.items():
        if name not in known:
            raise ValueError(f"search: shapes names {name!r}, which is not a symbol of graph {graph.name!r} "
                             f"(its symbols: {', '.join(sorted(known)) or 'none, every dim is static'})")
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"search: shapes[{name!r}] must be an integer >= 0, got {value!r}")
    for c in graph.constraints:  # else the check at these shapes rejects every candidate, blaming rules
        try:
            holds = c.holds(dict(shapes))
        except KeyError:  # a constraint on symbols the shapes leave open
            continue
        if not holds:
            raise ValueError(f"search: shapes {dict(shapes)} break the graph's constraint {c}")


def _resolved_rules(rules) -> list:
    """The rules to search with: the library (None, or an empty list: no rule files, as
    cleave.compile(rules=[]) reads it), the Rule objects given, or the library plus the
    rules of rule files, proven as cleave.compile(rules=...) proves them."""
    from cleave.rules import Rule, all_rules

    if rules is None:
        return all_rules()
    if isinstance(rules, (str, os.PathLike)):
        rules = [rules]  # one path, as cleave.compile takes it
    if not isinstance(rules, Iterable):
        raise TypeError(f"search: rules must be a list of Rule objects or of rule file paths, got {rules!r}")
    rules = list(rules)
    if not rules:  # it searched with no rule at all, where cleave.compile(rules=[]) has the library
        return all_rules()
    paths = [r for r in rules if isinstance(r, (str, os.PathLike))]
    if paths and len(paths) == len(rules):
        from cleave.runtime.compile import _proven_rules

        return _proven_rules(paths)
    neither = next((r for r in rules if not isinstance(r, (Rule, str, os.PathLike))), None)
    if neither is not None:
        raise TypeError(f"search: rules must be Rule objects or rule file paths, got {neither!r}")
    if paths:
        raise TypeError(f"search: rules mixes Rule objects and rule file paths ({paths[0]!r}); give one kind "
                        f"(cleave.rules.load_file(path) reads a file's rules)")
    return rules


def _keep_constraints(graph: Graph, candidate: Graph) -> None:
    """The input graph's own constraints (torch's range guards, size decisions, a graph
    file's `require` lines) hold for its candidates too: a candidate is rebuilt from the
    e-graph, whose nodes carry none of them, and its plans served bindings the graph
    refuses (`x[-(n // 2):]` at n = 1)."""
    symbols = set(candidate.symbols())
    for c in graph.constraints:
        if c.free_symbols <= symbols:
            candidate._constrain(c)


def _nonempty_constraints(g: Graph, rules, derivation):
    """Rules with a `nonempty` condition leave the split count a constraint: no chunk all padding."""
    from cleave.ir.graph import Constraint

    needs = {r.name for r in rules if r.name in derivation and any(c.kind == "nonempty" for c in r.conditions)}
    if not needs:
        return []
    out = []
    for n in g.live_nodes():
        if n.op == "split" and n.attrs["pad"] == float("-inf"):
            extent, s = n.inputs[0].shape[n.attrs["axis"]], n.attrs["count"]
            from cleave.ir import cdiv

            lhs = (s - 1) * cdiv(extent, s) + 1
            out.append((n.id, Constraint("le", lhs, extent, f"no empty chunk ({', '.join(sorted(needs))}) %{n.id}")))
    return out
