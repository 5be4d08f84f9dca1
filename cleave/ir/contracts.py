"""Types that cross module boundaries: what the search hands the scheduler
(Candidate, with the facts it proved) and what a rule hands the verifier
(RuleInstance). They live in the IR so that neither side imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from .graph import Graph, rebuild


@dataclass(frozen=True)
class Separable:
    """A proven separability fact: node `node` computes F(x, y) = G(x) * H(y), where
    `y` (node id `factor`) does not vary along the reduced axis `axis` of `reduce`
    (the reduction that consumed it). `rescale` is H(y_new) / H(y_old) as a formula
    in `y_new` and `y_old` (for exp(x - y): "exp(y_old - y_new)"; for x / y:
    "y_old / y_new"). The scheduler reads these to fuse cascaded reductions into one
    loop with a running y; node ids refer to `Candidate.graph` as printed."""
    node: int
    factor: int
    rescale: str
    rule: str

    def to_json(self) -> dict:
        return {"node": self.node, "factor": self.factor, "rescale": self.rescale, "rule": self.rule}

    @classmethod
    def from_json(cls, d: dict) -> "Separable":
        return cls(d["node"], d["factor"], d["rescale"], d["rule"])


@dataclass
class Candidate:
    """One rewritten graph out of the search. `graph` is renumbered (ir.rebuild), so
    node ids equal the ids of its printed text; `derivation` lists the rules that
    produced it, in order; `cost` is the symbolic search cost (sympy)."""
    graph: Graph
    facts: list[Separable] = field(default_factory=list)
    derivation: list[str] = field(default_factory=list)
    cost: sympy.Expr | float = 0


def then_as_written(candidates: list[Candidate], graph: Graph) -> list[Candidate]:
    """The candidates, then the graph as written when none of them is it: what a
    scheduler tries in order, since a rewrite can need a tiling it does not have."""
    written = rebuild(graph)
    if any(c.graph.key() == written.key() for c in candidates):
        return list(candidates)
    return list(candidates) + [Candidate(written)]


@dataclass
class RuleInstance:
    """A rule instantiated on IR graphs for the verifier: `lhs` and `rhs` take the same
    inputs (same names and symbolic shapes) and must compute the same outputs for
    every binding of the symbols that satisfies `conditions` (sympy relations over
    the symbols, e.g. `sympy.Eq(sympy.Mod(N, s), 0)`). `masked` names the inputs
    whose elements may also be -inf, as a mask leaves the values a reduction reads;
    `finite` the inputs a condition declares finite (flat, finite or nonzero): the numeric gate
    draws no infinity or NaN for them, and draws them for every other float input.
    `f32_exempt`, where not empty, says why the rule holds in the reals but not in f32
    (the numeric gate's f32 leg is skipped for it, and says so)."""
    rule: str
    lhs: Graph
    rhs: Graph
    conditions: list = field(default_factory=list)
    masked: tuple[str, ...] = ()
    finite: tuple[str, ...] = ()
    f32_exempt: str = ""
