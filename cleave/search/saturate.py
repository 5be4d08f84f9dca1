"""Staged equality saturation with budgets.

Rule families run in phases (cleave.rules.PHASES, each family's in
cleave.rules.FAMILY_PHASES or declared by its file); within a phase, one rewrite iteration
alternates with the analysis run to saturation, until nothing changes or a
budget (iterations, e-nodes, seconds) is hit. A budget returns the e-graph as
it is, and the extraction's BudgetWarning says so: extraction still finds the best
candidate so far.

Budgets are checked between iterations, and an iteration that would end past the
time budget if it grew as the last did is not started. One that would overshoot the
e-node budget runs under egglog's back-off scheduler, which holds back a rule with
more matches than e-nodes are left: an explosive rule (associativity) stops the search
near its e-node budget instead of quadrupling the e-graph in one step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from egglog import back_off, run, ruleset, set_

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
    """The search stopped at a budget; the candidates are the best found so far."""


@dataclass
class Saturated:
    egraph: object
    roots: list
    seconds: float = 0.0
    iterations: int = 0
    enodes: int = 0
    fired: dict = field(default_factory=dict)
    stopped: str | None = None
    stop_note: str | None = None  # the budget stopped at, with where: the extraction's BudgetWarning says it


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
        elif kind in E.TERM_FACTS:
            eg.register(E.TERM_FACTS[kind](*(E.to_egg(a, shared=shared) for a in args)))
        else:
            rel = {"flat": E.flat, "splittable": E.splittable, "extent": E.extent}[kind]
            eg.register(rel(*(E.to_egg(a, shared=shared) for a in args[:-1]), args[-1]))
    return eg, roots


def rule_names(compiled: dict) -> dict:
    """egglog's name of each compiled rewrite (as its reports key them) -> the rule's name."""
    return {str(rw.decl): name for name, (_, rw) in compiled.items()}


def saturate(enc: Encoded, rules, budgets: Budgets, progress: bool = True) -> Saturated:
    """The saturated e-graph. A budget it stops at is not warned about here: `.stop_note`
    goes to the extraction that follows (extract.explore), which reports it with its own
    in one BudgetWarning."""
    start = time.perf_counter()
    phases = {r.name: phases_of(r) for r in rules}  # an unscheduled family fails here, before any work
    eg, roots = load(enc)
    analysis = E.analysis_ruleset()
    compiled = {r.name: (r, E.compile_rule(r)) for r in rules}
    by_decl = rule_names(compiled)
    out = Saturated(eg, roots)
    out.enodes = _size(eg)
    last: _Step | None = None
    cut: list[str] = []  # phases the iteration budget ended before they saturated
    skipped: list[str] = []  # phases a spent e-node or time budget left out
    for phase in PHASES:
        active = [rw for r, rw in compiled.values() if phase in phases[r.name]]
        if not active:
            continue
        if out.stopped:
            skipped.append(phase)
            continue
        rs = ruleset(*active, name=f"phase-{phase}")
        # each phase has the iteration budget (a rule that never saturates in one phase, an
        # `x => x + 0`, left the split phase and its FlashDecoding out); e-nodes and time are shared
        for step in range(budgets.iterations):
            before, began = out.enodes, time.perf_counter()
            out.stopped = _too_slow(budgets, last, began - start)
            if out.stopped:
                break
            if not _analyse(eg, analysis, start + budgets.seconds):
                out.stopped = f"time budget {budgets.seconds}s reached in the analysis"
                break
            limit = _match_limit(budgets, out, last)
            if limit is None:
                report, held_back = eg.run(1, ruleset=rs), {}
            else:
                report = eg.run(run(rs, scheduler=back_off(match_limit=limit)))
                held_back = _held_back(report, by_decl, limit)
            out.iterations += 1
            fired = _count_fired(report, by_decl, out.fired)
            out.enodes = _size(eg)
            last = _Step(before, out.enodes - before, time.perf_counter() - began)
            elapsed = time.perf_counter() - start
            if progress:
                report_progress(f"[cleave search] {enc.graph.name}: phase {phase} iteration {step + 1}: "
                                f"{out.enodes} e-nodes, {elapsed:.2f}s, "
                                f"fired {', '.join(sorted(set(fired))) or 'nothing'}")
            if not report.updated and not held_back:
                break
            out.stopped = _held_back_stop(budgets, held_back, limit) or _over(budgets, out, elapsed)
            if out.stopped:
                break
            if step + 1 == budgets.iterations:
                cut.append(phase)
    # No analysis after the last rewrite: extraction reads e-nodes, never the analysis'
    # facts, and on a large e-graph one analysis iteration can take minutes.
    out.seconds = time.perf_counter() - start
    notes = [f"{out.stopped} after {out.iterations} iterations ({out.enodes} e-nodes, {out.seconds:.1f}s)"] \
        if out.stopped else []
    notes += [f"iteration budget {budgets.iterations} reached in phase {phase} before it saturated" for phase in cut]
    if skipped:
        notes.append(f"phase{'s' if len(skipped) > 1 else ''} {', '.join(skipped)} not run")
    if notes:
        out.stopped = out.stopped or notes[0]
        out.stop_note = "; ".join(notes)
    return out


def _analyse(eg, analysis, deadline: float) -> bool:
    """Runs the analysis to saturation, one iteration at a time until `deadline`; whether
    it saturated. Its facts only enable rewrites, so an analysis cut short is sound."""
    while time.perf_counter() < deadline:
        if not eg.run(1, ruleset=analysis).updated:
            return True
    return False


@dataclass
class _Step:
    """One iteration (its analysis and its rewrites): the e-nodes before it, those it
    added, its seconds."""
    before: int
    added: int
    seconds: float

    @property
    def growth(self) -> float:
        return (self.before + self.added) / max(self.before, 1)


def _too_slow(b: Budgets, last: _Step | None, elapsed: float) -> str | None:
    """Whether the next iteration, if it grew as the last did, would end past the time
    budget: one iteration is not interrupted, and on a graph growing 4x per iteration
    the next one ran for minutes."""
    if last is None:
        return None
    eta = last.seconds * last.growth
    if elapsed + eta <= b.seconds:
        return None
    return f"time budget {b.seconds}s nearly reached (the next iteration would take about {eta:.1f}s)"


def _match_limit(b: Budgets, s: Saturated, last: _Step | None) -> int | None:
    """None to run the next iteration as it is; where it would overshoot the e-node budget
    if it grew as the last did, the most matches a rule may apply in it: the e-nodes left.
    egglog applies every match an iteration finds: one step of associativity took a 16k
    e-graph to 62k (against a 20k budget) in 45 s."""
    room = b.enodes - s.enodes
    if last is None or last.added * last.growth <= room:
        return None
    return max(1, room)


def _count_fired(report, by_decl: dict, fired: dict) -> list[str]:
    """The rules that fired in this run (adding their matches to `fired`)."""
    names = []
    for decl, n in report.num_matches_per_rule.items():
        name = by_decl.get(str(decl))
        if name and n:
            fired[name] = fired.get(name, 0) + n
            names.append(name)
    return names


def _held_back(report, by_decl: dict, match_limit: int) -> dict:
    """Rules the back-off scheduler held back: more matches than `match_limit` (rule ->
    matches). It counts every match, not only those new since the last iteration."""
    out = {}
    for it in report.iterations:
        for decl, reports in it.rule_set_report.rule_reports.items():
            n = sum(r.num_matches for r in reports)
            name = by_decl.get(str(decl))
            if name and n > match_limit:
                out[name] = max(out.get(name, 0), n)
    return out


def _held_back_stop(b: Budgets, held_back: dict, limit: int | None) -> str | None:
    if not held_back:
        return None
    rules = ", ".join(f"{name} ({n} matches)" for name, n in sorted(held_back.items()))
    return f"e-node budget {b.enodes} nearly reached: held back {rules}, more than the {limit} e-nodes left"


def _over(b: Budgets, s: Saturated, elapsed: float) -> str | None:
    if s.enodes >= b.enodes:
        return f"e-node budget {b.enodes} reached ({s.enodes} e-nodes)"
    if elapsed >= b.seconds:
        return f"time budget {b.seconds}s reached"
    return None
