"""Top-k distinct candidates out of the saturated e-graph.

The e-graph is read once (egglog's serialized form). A tree-size extraction
under a set of banned e-nodes gives one candidate; a local search over "force
this e-class to that e-node" moves (ban-and-re-extract), guided by the symbolic
cost of the decoded graph (cost.py, ranked at a representative binding), visits
the distinct candidates; the k cheapest are returned.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from cleave.ir import CleaveError, ShapeError, rebuild
from cleave.ir.contracts import Candidate, Separable
from cleave.rules.dsl import Axis, Leaf, RuleError, Term, Var

from . import cost as C
from .egraph import CONSTRUCTORS, from_node
from .encode import Encoded

INF = float("inf")


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


def find_class(classes, term) -> str:
    """The e-class holding a concrete term of the input graph."""
    index = {}
    for cls, nodes in classes.items():
        for n in nodes:
            index[(n.op, tuple(a if not isinstance(a, tuple) else a for a in n.args))] = cls
    memo: dict = {}

    def go(t):
        if t in memo:
            return memo[t]
        op, args = _node_of(t, go)
        cls = index.get((op, tuple(args)))
        if cls is None:
            raise CleaveError(f"search: the encoded term {t} is missing from the e-graph")
        memo[t] = cls
        return cls

    return go(term)


def _node_of(t, go):
    if isinstance(t, Leaf):
        return ("LeafT", "Op1", "Op2", "Op3")[len(t.args)], [t.key] + [("class", go(a)) for a in t.args]
    op, a = t.op, t.args
    from cleave.rules.dsl import REDUCE, UNARY
    if op in UNARY:
        return "Un", [op, ("class", go(a[0]))]
    if op in REDUCE:
        return "Red", [REDUCE[op], a[1].offset, ("class", go(a[0]))]
    if op == "where":
        return "Where", [("class", go(x)) for x in a]
    if op == "matmul":
        return "MatMul", [("class", go(x)) for x in a]
    if op == "squeeze":
        return "Sq", [a[1].offset, ("class", go(a[0]))]
    if op.startswith("topk_"):
        return "TopK", [op[5:], a[1], a[2].offset, ("class", go(a[0]))]
    return "Bin", [op, ("class", go(a[0])), ("class", go(a[1]))]


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
    graph: object
    cost: object
    rank: float
    used: set  # e-classes on the candidate


def realize(enc: Encoded, classes, roots, banned, env) -> Realized | None:
    costs, choice = best_choice(classes, banned)
    if any(costs[r] == INF for r in roots):
        return None
    memo: dict = {}
    terms = [build_term(r, choice, memo) for r in roots]
    try:
        g, _ = enc.decode(terms)
    except (RuleError, ShapeError) as err:  # a combination whose shapes do not fit
        del err
        return None
    g = rebuild(g)
    expr = C.cost(g)
    used = set()
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c not in used:
            used.add(c)
            stack.extend(a[1] for a in choice[c].args if isinstance(a, tuple))
    return Realized(terms, g, expr, C.evaluate(expr, env), used)


def explore(enc: Encoded, classes, roots, env, max_visits: int = 400, seconds: float = 20.0) -> list[tuple]:
    """Hill-climb on the cost by forcing one e-class at a time; every visited distinct
    candidate is kept. Returns (Realized, banned) pairs, cheapest first."""
    start = time.perf_counter()
    seen: dict[str, tuple] = {}
    first = realize(enc, classes, roots, frozenset(), env)
    if first is None:
        raise CleaveError(f"search of {enc.graph.name}: no candidate could be extracted")
    seen[first.graph.key()] = (first, frozenset())
    current, bans = first, frozenset()
    visits = 1
    while visits < max_visits and time.perf_counter() - start < seconds:
        best = None
        for cls in sorted(current.used):
            nodes = [n for n in classes[cls] if n.id not in bans]
            if len(nodes) < 2:
                continue
            for keep in nodes:
                forced = bans | {n.id for n in nodes if n is not keep}
                r = realize(enc, classes, roots, forced, env)
                visits += 1
                if r is None:
                    continue
                key = r.graph.key()
                if key not in seen:
                    seen[key] = (r, forced)
                if r.rank < current.rank and (best is None or r.rank < best[0].rank):
                    best = (r, forced)
        if best is None:
            break
        current, bans = best
    return sorted(seen.values(), key=lambda rb: (rb[0].rank, rb[0].graph.key()))


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


def derivation(rules, naive_terms, terms) -> list[str]:
    """Rules whose right-hand side shows in the candidate but not in the input graph,
    innermost first."""
    before = set(subterms(naive_terms))
    out = []
    for t in subterms(terms):
        if t in before:
            continue
        for r in rules:  # a bare-variable rhs (a cancellation) leaves no trace to see
            if r.name not in out and isinstance(r.rhs, Term) and match(r.rhs, t, {}):
                out.append(r.name)
    return out


def separable_facts(graph, rule_names) -> list[Separable]:
    """exp(x - y) with y constant along an axis x varies on, y a max: the scheduler may keep
    a running y and rescale by exp(y_old - y_new) (rule exp-sub-separate)."""
    if "exp-sub-separate" not in rule_names:
        return []
    facts = []
    for n in graph.live_nodes():
        if n.op != "exp" or n.inputs[0].op != "sub":
            continue
        x, y = n.inputs[0].inputs
        base = y.inputs[0] if y.op == "reshape" else y
        if base.op != "reduce" or base.attrs["op"] != "max" or y.rank != x.rank:
            continue
        if any(ys == 1 and xs != 1 for ys, xs in zip(y.shape, x.shape)):
            facts.append(Separable(n.id, y.id, "exp(y_old - y_new)", "exp-sub-separate"))
    return facts


def to_candidate(r: Realized, rules, naive_terms) -> Candidate:
    names = {x.name for x in rules}
    return Candidate(graph=r.graph, facts=separable_facts(r.graph, names),
                     derivation=derivation(rules, naive_terms, r.terms), cost=r.cost)
