"""A rule's examples, run as the search runs it: the example term and the facts its
dims decide go into an e-graph, the analysis runs to saturation, then the rule is
applied once. It must fire on each `rewrites:` term and must not on each `keeps:`
term (a negative pin: the conditions, not luck, keep it off)."""
from __future__ import annotations

from egglog import ruleset

from cleave.ir import CleaveError
from cleave.ir import dims as D
from cleave.rules.dsl import Leaf, Term, Var
from cleave.rules.lower import lower_example

from . import egraph as E
from .encode import Encoded
from .saturate import load, rule_names


def matches(rule, example) -> int:
    """How many times `rule` matches in `example` (a dsl.Example)."""
    graph, nodes = lower_example(example)

    def concrete(t):  # the declared variables become the graph's inputs, as the encoder's leaves
        if isinstance(t, Var):
            return Leaf(nodes[t].id)
        return Term(t.op, tuple(concrete(a) for a in t.args)) if isinstance(t, Term) else t

    out = graph.outputs[0]
    enc = Encoded(graph, [concrete(example.term)], {n.id: concrete(t) for t, n in nodes.items()},
                  reducible=set(graph.symbols()) - D.free_symbols(out.shape))
    eg, _ = load(enc)
    eg.run(E.analysis_ruleset().saturate())
    compiled = {rule.name: (rule, E.compile_rule(rule))}
    report = eg.run(1, ruleset=ruleset(compiled[rule.name][1], name=f"example-{rule.name}"))
    names = rule_names(compiled)
    return sum(n for decl, n in report.num_matches_per_rule.items() if names.get(str(decl)) == rule.name)


def failures(rule) -> list[str]:
    """What is wrong with `rule`'s examples, one line each naming the file and line;
    empty when it has at least one of each kind and all of them hold."""
    out = [f"{rule.source}: rule {rule.name} has no '{kind}:' example"
           for kind in ("rewrites", "keeps") if not any(ex.kind == kind for ex in rule.examples)]
    for ex in rule.examples:
        try:
            n = matches(rule, ex)
        except CleaveError as err:
            out.append(f"{ex.source}: {ex.kind} example of {rule.name} does not build: {err}")
            continue
        if ex.kind == "rewrites" and not n:
            out.append(f"{ex.source}: rule {rule.name} does not rewrite {ex.text}")
        if ex.kind == "keeps" and n:
            out.append(f"{ex.source}: rule {rule.name} rewrites {ex.text}, which it must keep")
    return out
