"""Staged equality saturation with budgets.

Rule families run in phases (cleave.rules.PHASES, each family's in
cleave.rules.FAMILY_PHASES or declared by its file); within a phase, one rewrite iteration
alternates with the analysis run to saturation, until nothing changes or a
budget (iterations, e-nodes, seconds) is hit. A budget returns the e-graph as
it is, with a warning: extraction still finds the best candidate so far.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

from egglog import ruleset, set_

from cleave.rules import PHASES, phases_of

from ..progress import report as report_progress
from . import egraph as E
from .encode import Encoded, seeds


@dataclass
class Budgets:
    iterations: int = 30
    enodes: int = 20000
    seconds: float = 30.0


class BudgetWarning(UserWarning):
    """Saturation stopped at a budget; the candidates are the best found so far."""


@dataclass
class Saturated:
    egraph: object
    roots: list
    seconds: float = 0.0
    iterations: int = 0
    enodes: int = 0
    fired: dict = field(default_factory=dict)
    stopped: str | None = None


def _size(eg) -> int:
    sizes = eg.all_function_sizes()
    return sum(n for fn, n in sizes if getattr(fn, "__name__", str(fn)) in E.CONSTRUCTORS) if sizes else 0


def load(enc: Encoded):
    """A new e-graph holding the encoded terms and the facts seeded for them; (e-graph, output roots)."""
    eg = E.new_egraph()
    memo: dict = {}
    shared = (memo, lambda expr: eg.let(f"t{len(memo)}", expr))
    roots = [eg.let(f"out{i}", E.to_egg(t, shared=shared)) for i, t in enumerate(enc.outputs)]
    for kind, *args in seeds(enc):
        if kind == "rank":
            eg.register(set_(E.rank(E.to_egg(args[0], shared=shared))).to(E.i64(args[1])))
        elif kind in ("finite", "within"):
            eg.register({"finite": E.finite, "within": E.within}[kind](*(E.to_egg(a, shared=shared) for a in args)))
        else:
            rel = {"flat": E.flat, "splittable": E.splittable, "extent": E.extent}[kind]
            eg.register(rel(*(E.to_egg(a, shared=shared) for a in args[:-1]), args[-1]))
    return eg, roots


def rule_names(compiled: dict) -> dict:
    """egglog's name of each compiled rewrite (as its reports key them) -> the rule's name."""
    return {str(rw.decl): name for name, (_, rw) in compiled.items()}


def saturate(enc: Encoded, rules, budgets: Budgets, progress: bool = True) -> Saturated:
    start = time.perf_counter()
    phases = {r.name: phases_of(r) for r in rules}  # an unscheduled family fails here, before any work
    eg, roots = load(enc)
    analysis = E.analysis_ruleset()
    compiled = {r.name: (r, E.compile_rule(r)) for r in rules}
    by_decl = rule_names(compiled)
    out = Saturated(eg, roots)
    for phase in PHASES:
        active = [rw for r, rw in compiled.values() if phase in phases[r.name]]
        if not active or out.stopped:
            continue
        rs = ruleset(*active, name=f"phase-{phase}")
        for step in range(budgets.iterations):
            eg.run(analysis.saturate())
            report = eg.run(1, ruleset=rs)
            out.iterations += 1
            fired = []
            for decl, n in report.num_matches_per_rule.items():
                name = by_decl.get(str(decl))
                if name and n:
                    out.fired[name] = out.fired.get(name, 0) + n
                    fired.append(name)
            out.enodes = _size(eg)
            elapsed = time.perf_counter() - start
            if progress:
                report_progress(f"[cleave search] {enc.graph.name}: phase {phase} iteration {step + 1}: "
                                f"{out.enodes} e-nodes, {elapsed:.2f}s, "
                                f"fired {', '.join(sorted(set(fired))) or 'nothing'}")
            if not report.updated:
                break
            stop = _over(budgets, out, elapsed)
            if stop:
                out.stopped = stop
                warnings.warn(f"search of {enc.graph.name}: {stop}; returning the best candidates so far",
                              BudgetWarning, stacklevel=3)
                break
    eg.run(analysis.saturate())
    out.enodes = _size(eg)
    out.seconds = time.perf_counter() - start
    return out


def _over(b: Budgets, s: Saturated, elapsed: float) -> str | None:
    if s.iterations >= b.iterations:
        return f"iteration budget {b.iterations} reached"
    if s.enodes >= b.enodes:
        return f"e-node budget {b.enodes} reached ({s.enodes} e-nodes)"
    if elapsed >= b.seconds:
        return f"time budget {b.seconds}s reached"
    return None
