"""Top-k distinct candidates out of the saturated e-graph.

The e-graph is read once (egglog's serialized form). Extractions are DAGs: one
e-node per reachable e-class, the same choice wherever a class is used. They are
ranked by the cost of the decoded graph at a representative binding
(extraction_cost.py): all of them when there are few enough, else a beam search over
the choice points.
Each candidate then records the rule applications it shows and its separability facts.
"""
from __future__ import annotations

import itertools
import json
import operator
import time
import warnings
from dataclasses import dataclass

from cleave.ir import CleaveError, ShapeError, rebuild
from cleave.ir.contracts import Candidate, Separable
from cleave.rules.dsl import Axis, Leaf, RuleError, Term, Var

from . import extraction_cost as C
from . import regions
from .egraph import CONSTRUCTORS, enode_of, from_node
from .encode import Encoded
from .saturate import BudgetWarning

INF = float("inf")
# exp-like op -> the rule proving exp(x - y) = exp(x) * exp(-y), which makes it separable
SEPARATE = {"exp": "exp-sub-separate", "exp2": "exp2-sub-separate"}
_OFFSET = operator.attrgetter("offset")  # a concrete axis's e-node argument


@dataclass
class ENode:
    id: str
    op: str
    args: list  # ("class", name) for tensors, Python values for primitives
    cls: str


def read(eg) -> dict[str, list[ENode]]:
    data = json.loads(eg._serialize().to_json())["nodes"]
    classes: dict[str, list[ENode]] = {}

    def value(nid):
        op = data[nid]["op"]
        if op.startswith('"'):
            return json.loads(op)
        return int(op)

    for nid, node in data.items():
        if node["op"] not in CONSTRUCTORS:
            continue
        args = [("class", data[c]["eclass"]) if data[c]["op"] in CONSTRUCTORS else value(c) for c in node["children"]]
        classes.setdefault(node["eclass"], []).append(ENode(nid, node["op"], args, node["eclass"]))
    return classes


class Index:
    """Looks up the e-class of a concrete term by its e-nodes (hash-consing)."""

    def __init__(self, classes):
        self.classes = classes
        self.nodes = {(n.op, tuple(n.args)): cls for cls, ns in classes.items() for n in ns}
        # id(term) -> (term, class): by identity, each object resolved once from its
        # children's classes. Keyed by the term itself, every lookup of an equal but
        # distinct term (a candidate's against the input's) compared the two whole DAGs.
        # The term is held so that its id is not reused.
        self.memo: dict = {}

    def find(self, t) -> str | None:
        hit = self.memo.get(id(t))
        if hit is None:
            try:
                op, args = enode_of(t, self._child, _OFFSET)
                cls = self.nodes.get((op, tuple(args)))
            except LookupError:
                cls = None
            hit = self.memo[id(t)] = (t, cls)
        return hit[1]

    def _child(self, t) -> tuple:
        cls = self.find(t)
        if cls is None:
            raise LookupError(t)
        return "class", cls


def find_class(classes, term) -> str:
    """The e-class holding a concrete term of the input graph."""
    cls = Index(classes).find(term)
    if cls is None:
        raise CleaveError(f"search: the encoded term {term} is missing from the e-graph")
    return cls


def best_choice(classes, banned: frozenset) -> tuple[dict, dict]:
    """Tree-size costs per class and the cheapest allowed e-node of each."""
    costs = {c: INF for c in classes}
    choice: dict[str, ENode] = {}
    changed = True
    while changed:
        changed = False
        for cls, nodes in classes.items():
            for n in nodes:
                if n.id in banned:
                    continue
                c = 1 + sum(costs[a[1]] for a in n.args if isinstance(a, tuple))
                if c < costs[cls]:
                    costs[cls], choice[cls] = c, n
                    changed = True
    return costs, choice


def build_term(cls: str, choice: dict, memo: dict):
    if cls in memo:
        return memo[cls]
    n = choice[cls]
    args = [build_term(a[1], choice, memo) if isinstance(a, tuple) else a for a in n.args]
    memo[cls] = t = from_node(n.op, args)
    return t


@dataclass
class Realized:
    terms: list
    graph: object  # as decoded (renumbered by `final()` for the chosen few)
    rank: float  # the cost at the ranking binding
    choice: dict  # e-class -> chosen ENode, for the classes the candidate uses
    roots: list

    def final(self):
        self.graph = rebuild(self.graph)
        return self


def _used(roots, choice) -> set:
    used, stack = set(), list(roots)
    while stack:
        c = stack.pop()
        if c not in used:
            used.add(c)
            stack.extend(a[1] for a in choice[c].args if isinstance(a, tuple))
    return used


class Extractor:
    """Decodes and ranks extractions; each distinct DAG of choices once."""

    def __init__(self, enc: Encoded, classes, roots, env, region: bool = False):
        self.enc, self.classes, self.roots, self.env, self.region = enc, classes, roots, env, region
        self.by_dag: dict[frozenset, Realized | None] = {}
        self.unshifted = _unshifted_exps(enc.graph)

    def forced(self, forced: dict) -> Realized | None:
        """The forced classes take their e-node, every other class its smallest tree
        under that constraint (a cycle leaves the roots unreachable: None)."""
        bans = frozenset(n.id for c, keep in forced.items() for n in self.classes[c] if n is not keep)
        costs, choice = best_choice(self.classes, bans)
        if any(costs[r] == INF for r in self.roots):
            return None
        return self.dag({c: choice[c] for c in _used(self.roots, choice)})

    def dag(self, choice: dict) -> Realized | None:
        """An acyclic choice for exactly the classes reachable from the roots."""
        key = frozenset((c, n.id) for c, n in choice.items())
        if key not in self.by_dag:
            self.by_dag[key] = self._decode(choice)
        return self.by_dag[key]

    def _decode(self, choice) -> Realized | None:
        memo: dict = {}
        terms = [build_term(r, choice, memo) for r in self.roots]
        try:
            g, _ = self.enc.decode(terms, region=self.region)
        except (RuleError, ShapeError):  # a combination whose shapes do not fit
            return None
        if _unshifted_exps(g) > self.unshifted:  # exp(x)*exp(-m) proves separability; computing it overflows
            return None
        return Realized(terms, g, C.rank(g, self.env), choice, self.roots)

    def ranked(self) -> list[Realized]:
        # Equal costs are common at the representative binding: break ties by size (an
        # equally cheap rewrite that only adds nodes is not taken), then by the graph's
        # structural hash, never by the e-graph's enumeration order (which varies
        # between processes). The hash prints the graph: only ties pay for it.
        found = sorted((r for r in self.by_dag.values() if r is not None), key=lambda r: r.rank)
        out = []
        for _, tied in itertools.groupby(found, key=lambda r: r.rank):
            tied = list(tied)
            out += sorted(tied, key=lambda r: (len(r.graph.live_nodes()), r.graph.key())) if len(tied) > 1 else tied
        return out


def _unshifted_exps(g) -> int:
    """exp (exp2) nodes whose operand is not a difference (x - m): the ones that can overflow."""
    def base(n):
        return base(n.inputs[0]) if n.op == "cast" else n
    return sum(1 for n in g.live_nodes() if n.op in SEPARATE and base(n.inputs[0]).op != "sub")


def _extractable(classes, enc: Encoded) -> dict:
    """`classes` without the exp (exp2) e-nodes whose operand has no difference in its
    e-class, unless the input graph has them: exp(x)·exp(-m) proves separability but
    is never extracted (Extractor._decode rejects an unshifted exp), and those e-nodes
    multiplied the choices to enumerate (GQA decode's past the exhaustive bound once
    exp2 had its own). A class left empty takes its users' e-nodes with it."""
    index = Index(classes)
    naive = set()
    for t in subterms(enc.terms.values()):
        op, args = enode_of(t, lambda x: ("class", index.find(x)), _OFFSET)
        naive.add((op, tuple(args)))

    def shifted(n: ENode) -> bool:
        if n.op != "Un" or n.args[0] not in SEPARATE or (n.op, tuple(n.args)) in naive:
            return True
        return any(m.op == "Bin" and m.args[0] == "sub" for m in classes[n.args[1][1]])

    out = {c: [n for n in nodes if shifted(n)] for c, nodes in classes.items()}
    dead = {c for c, nodes in out.items() if not nodes}
    while dead:
        out = {c: [n for n in nodes if not any(isinstance(a, tuple) and a[1] in dead for a in n.args)]
               for c, nodes in out.items() if c not in dead}
        dead = {c for c, nodes in out.items() if not nodes}
    return out


def enumerate_dags(classes, roots, limit: int, expired=lambda: False):
    """Every acyclic choice of one e-node per reachable e-class, or None past `limit` (or
    once `expired()`). Classes left with one possible e-node are assigned in a loop:
    recursion is as deep as the choice points, not the classes (a model of many layers
    has thousands)."""
    out: list[dict] = []
    cycles = regions.cyclic_components(regions.successors(classes, roots))

    def closes_cycle(assign, node, c) -> bool:
        return c in cycles and any(cycles.get(k) == cycles[c] and reaches(assign, k, c) for k in kids(node))

    def reaches(assign, start, target) -> bool:
        stack, seen = [start], set()
        while stack:
            c = stack.pop()
            if c == target:
                return True
            if c not in seen and c in assign:
                seen.add(c)
                stack.extend(a[1] for a in assign[c].args if isinstance(a, tuple))
        return False

    def kids(node) -> list:
        return [a[1] for a in node.args if isinstance(a, tuple)]

    def go(assign, todo: list) -> bool:
        forced = []
        try:
            while todo:
                c = todo.pop()
                if c in assign:
                    continue
                nodes = [n for n in classes[c] if not closes_cycle(assign, n, c)]
                if len(nodes) == 1:
                    assign[c] = nodes[0]
                    forced.append(c)
                    todo.extend(reversed(kids(nodes[0])))
                    continue
                for node in nodes:  # none: every e-node closes a cycle, a dead end
                    if expired():
                        return False
                    assign[c] = node
                    ok = go(assign, todo + list(reversed(kids(node))))
                    del assign[c]
                    if not ok:
                        return False
                return True
            out.append(dict(assign))
            return len(out) <= limit
        finally:
            for c in forced:
                del assign[c]

    return out if go({}, list(reversed(roots))) else None


class Clock:
    """The extraction's time budget; `cut` once it ended some work early."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds
        self.cut = False

    def expired(self) -> bool:
        self.cut = self.cut or time.perf_counter() > self.end
        return self.cut


def explore(enc: Encoded, classes, roots, env, exhaustive: int = 2000, beam: int = 16,
            seconds: float = 20.0, saturation_stop: str | None = None) -> tuple[list[Realized], str | None]:
    """Candidates ranked at `env`, cheapest first (distinct DAGs; `distinct` dedupes graphs),
    and the budget the extraction stopped at (None where it finished).

    When the e-graph holds at most `exhaustive` acyclic extractions (every suite workload
    but the largest), all are ranked: the best is the optimum of the cost, however many
    coordinated choices it takes (FlashDecoding needs a split max, sum and MatMul at once).
    Larger programs (a model of several layers) are first split at dominating e-classes
    (regions.py): each region below one, such as the layers under a hidden state, is
    ranked on its own and keeps its best choice, until the rest enumerates. Otherwise a
    beam search over the choice points: a state forces some e-classes to one e-node (the
    rest extracted as smallest trees) and expands by deciding its candidate's next open
    choice every way; the `beam` cheapest states survive each round.

    Past `seconds` each stage stops where it is and the ranking keeps what it decoded,
    with the input graph's own extraction (always a valid candidate). A budget this or
    the saturation before it stopped at (`saturation_stop`) is reported in one
    BudgetWarning."""
    clock = Clock(seconds)
    classes = extractable = _extractable(classes, enc)
    dags = enumerate_dags(classes, roots, exhaustive, clock.expired)  # once: settle's check and the ranking share it

    def region_best(narrowed, cls, owned) -> Realized | None:
        # What the region reads but does not own (the rope tables every layer reads) is
        # pinned to its smallest tree: its choice is made above, not once per region.
        _, smallest = best_choice(narrowed, frozenset())
        pinned = {c: nodes if c in owned or c not in smallest else [smallest[c]] for c, nodes in narrowed.items()}
        ex = Extractor(enc, pinned, [cls], env, region=True)
        _realize(ex, pinned, [cls], enumerate_dags(pinned, [cls], exhaustive, clock.expired), beam, clock)
        found = ex.ranked()
        return found[0] if found else None

    if dags is None:  # known too large whole
        classes = regions.settle(classes, roots, lambda *_: False, region_best, expired=clock.expired)
        dags = enumerate_dags(classes, roots, exhaustive, clock.expired)
    ex = Extractor(enc, classes, roots, env)
    _realize(ex, classes, roots, dags, beam, clock)
    if clock.cut:  # settle narrowed a copy: the input graph's e-nodes are all in `extractable`
        ex.dag(_naive_choice(extractable, roots, enc))
    found = ex.ranked()
    if not found:
        raise CleaveError(f"search of {enc.graph.name}: no candidate could be extracted")
    stop = EXTRACTION_CUT if clock.cut else None
    _warn_budgets(enc.graph.name, saturation_stop, stop, len(found))
    return found, stop


def _naive_choice(classes, roots, enc: Encoded) -> dict:
    """The extraction of the input graph's own e-nodes. A class holding two of its terms
    (x and x*1, once a rule joined them) takes the innermost: every term's children
    come before it in `subterms`, so the choice closes no cycle."""
    index = Index(classes)
    choice: dict = {}
    for t in subterms(enc.outputs):
        cls = index.find(t)
        if cls not in choice:
            op, args = enode_of(t, lambda x: ("class", index.find(x)), _OFFSET)
            choice[cls] = next(n for n in classes[cls] if n.op == op and n.args == args)
    return {c: choice[c] for c in _used(roots, choice)}


EXTRACTION_CUT = "the time budget ended the extraction early"


def _warn_budgets(name: str, saturation_stop: str | None, extraction_stop: str | None, ranked: int) -> None:
    """One warning for every budget the search stopped at: saturation's, then extraction's."""
    stops = [s for s in (saturation_stop, extraction_stop) if s]
    if stops:
        kept = f"the best of {ranked} extractions ranked" + (", the input graph among them" if extraction_stop else "")
        warnings.warn(BudgetWarning(f"search of {name}: {'; '.join(stops)}; returning {kept}"), stacklevel=4)


def _realize(ex: Extractor, classes, roots, dags: list | None, beam: int, clock: Clock) -> None:
    """Decodes every extraction in `dags` (None: too many: the beam search's), or as many
    as `clock` leaves time for (at least one), for `ex.ranked()`."""
    if dags is not None:
        for i, choice in enumerate(dags):
            if i and clock.expired():
                break
            ex.dag(choice)
    else:
        _beam(ex, classes, roots, beam, clock)


def _beam(ex: Extractor, classes, roots, width: int, clock: Clock) -> None:
    first = ex.forced({})
    states = [({}, first)] if first else []
    while states and not clock.expired():
        children = []
        for forced, r in states:
            cls = _next_decision(classes, r, forced)
            for node in classes[cls] if cls else ():
                child = ex.forced({**forced, cls: node})
                if child is not None:
                    children.append(({**forced, cls: node}, child))
        children.sort(key=lambda s: (s[1].rank, s[1].graph.key()))
        states = children[:width]


def _next_decision(classes, r: Realized, forced: dict) -> str | None:
    """The first class of the candidate (depth first from the roots) with a choice left."""
    seen, stack = set(), list(reversed(r.roots))
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        if c not in forced and len(classes[c]) > 1:
            return c
        stack.extend(reversed([a[1] for a in r.choice[c].args if isinstance(a, tuple)]))
    return None


def distinct(found: list[Realized], k: int) -> list[Realized]:
    """The k cheapest candidates with distinct graphs (renumbered)."""
    out, keys = [], set()
    for r in found:
        r = r.final()
        key = r.graph.key()
        if key not in keys:
            keys.add(key)
            out.append(r)
            if len(out) == k:
                break
    return out


# -- what each candidate records -------------------------------------------------

def match(pattern, term, env) -> bool:
    if isinstance(pattern, Var):
        if pattern.name in env:
            return env[pattern.name] == term
        env[pattern.name] = term
        return True
    if isinstance(pattern, Axis):
        if not isinstance(term, Axis):
            return False
        if pattern.var is None:
            return pattern.offset == term.offset
        want = term.offset - pattern.offset
        return env.setdefault("axis:" + pattern.var, want) == want
    if isinstance(pattern, Term):
        return (isinstance(term, Term) and term.op == pattern.op and len(term.args) == len(pattern.args)
                and all(match(p, t, env) for p, t in zip(pattern.args, term.args)))
    return pattern == term


def subterms(terms) -> list:
    out, seen = [], set()

    def go(t):
        if isinstance(t, (Term, Leaf)) and t not in seen:
            seen.add(t)
            for a in t.args:
                go(a)
            out.append(t)

    for t in terms:
        go(t)
    return out


def ematch(classes, pattern, cls: str, env: dict, nodes=None, found: list | None = None) -> bool:
    """Whether e-class `cls` (or only its e-nodes `nodes`) holds an instance of `pattern`
    consistent with `env` (tensor variables -> e-classes, "axis:a" -> offset, top-k
    counts -> ints); on success `env` holds the bindings and `found` gets the e-node
    the pattern's top matched."""
    if isinstance(pattern, Var):
        return env.setdefault(pattern.name, cls) == cls
    op, args = enode_of(pattern, lambda p: ("class", p), lambda a: a)
    for n in classes[cls] if nodes is None else nodes:
        if n.op != op or len(n.args) != len(args):
            continue
        trial = dict(env)
        if all(_ematch_arg(classes, p, x, trial) for p, x in zip(args, n.args)):
            env.update(trial)
            if found is not None:
                found.append(n)
            return True
    return False


def _ematch_arg(classes, p, x, env) -> bool:
    if isinstance(p, tuple):  # ("class", sub-pattern)
        return isinstance(x, tuple) and ematch(classes, p[1], x[1], env)
    if isinstance(p, Var):  # an int variable (top-k count)
        return env.setdefault(p.name, x) == x
    if isinstance(p, Axis):
        if p.var is None:
            return p.offset == x
        return env.setdefault("axis:" + p.var, x - p.offset) == x - p.offset
    return p == x


def derivation(rules, naive_terms, r: Realized, classes, index: Index) -> list[str]:
    """Rule applications the candidate shows, innermost first. A rule is listed where an
    e-node the candidate chose (and the input graph lacks) is the top of the rule's
    right-hand side, the rest of that side matching in the e-graph (the rewrite added
    exactly those e-nodes; the candidate may pick equal ones below), and the rule's
    left-hand side, under the same bindings, lies in the same e-class: that rewrite
    joined them. When that left-hand side's top is itself no e-node of the input
    graph, an earlier rewrite made it, and is listed before it, the same way (a split
    of the MatMul another rule made). Rules whose right-hand side is a bare variable
    leave no trace."""
    naive = set()
    for t in subterms(naive_terms):
        op, args = enode_of(t, lambda x: ("class", index.find(x)), _OFFSET)
        naive.add((op, tuple(args)))
    out: list[str] = []
    for t in subterms(r.terms):
        cls = index.find(t)
        if cls is not None:
            out += _made(rules, classes, cls, r.choice[cls], naive, out)
    return out


def _made(rules, classes, cls: str, node: ENode, naive: set, listed: list[str]) -> list[str]:
    """The rewrites (earliest first) that made e-node `node` of class `cls`, unless the
    input graph has it; none of them already `listed`."""
    made: list[str] = []
    if (node.op, tuple(node.args)) in naive:
        return made
    for rule in rules:
        env: dict = {}
        top: list[ENode] = []
        if (rule.name not in listed + made and isinstance(rule.rhs, Term)
                and ematch(classes, rule.rhs, cls, env, nodes=[node])
                and ematch(classes, rule.lhs, cls, env, found=top)):
            made += _made(rules, classes, cls, top[0], naive, listed + made + [rule.name]) + [rule.name]
    return made


def separable_facts(graph, rule_names) -> list[Separable]:
    """exp(x - y) with y constant along an axis x varies on, y a max: the scheduler may keep
    a running y and rescale by exp(y_old - y_new) (rule exp-sub-separate); the same in
    base 2 (exp2-sub-separate)."""
    facts = []
    for n in graph.live_nodes():
        if SEPARATE.get(n.op) not in rule_names or n.inputs[0].op != "sub":
            continue
        x, y = n.inputs[0].inputs
        y = _unguarded(y)
        base = y.inputs[0] if y.op == "reshape" else y
        if base.op != "reduce" or base.attrs["op"] != "max" or y.rank != x.rank:
            continue
        if any(ys == 1 and xs != 1 for ys, xs in zip(y.shape, x.shape)):
            facts.append(Separable(n.id, y.id, f"{n.op}(y_old - y_new)", SEPARATE[n.op]))
    return facts


def _unguarded(y):
    """The max under an empty row's guard, inf_to_zero(m) or where(m == -inf, 0, m): a
    running max that is still -inf reads as 0 in the scheduler's loop too, and the terms
    it rescaled then are exp(-inf) = 0, so exp(y_old - y_new) rescales them as well."""
    if y.op == "inf_to_zero":
        return y.inputs[0]
    if y.op == "where":
        cond, zero, m = y.inputs
        if cond.op == "eq" and _is_const(zero, 0.0) and m in cond.inputs \
                and any(_is_const(c, float("-inf")) for c in cond.inputs if c is not m):
            return m
    return y


def _is_const(n, value: float) -> bool:
    return n.op == "const" and n.attrs["value"] == value


def to_candidate(r: Realized, rules, naive_terms, index: Index) -> Candidate:
    names = {x.name for x in rules}
    return Candidate(graph=r.graph, facts=separable_facts(r.graph, names),
                     derivation=derivation(rules, naive_terms, r, index.classes, index), cost=C.cost(r.graph))
