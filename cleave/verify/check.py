"""check_rule: the shape proof, the numeric gate and the algebra provers, per rule instance.

First, a rule whose right side divides by a value its left side does not is refused
(divisors.py). Then, per instance: shapes (z3, every binding) -> numeric gate (cheap, catches most
wrong rules) -> z3/sympy at each small binding. A rule is proven only if every
instance passes all three; one confirmed counterexample makes it unsound; anything
a prover could not decide makes it unknown.
"""
from __future__ import annotations

import threading
import time
import warnings
from typing import Iterable

from ..ir import CleaveError
from ..progress import report as report_progress
from ..storage import unwritable
from ..torch_state import under_torch_defaults
from ..ir.contracts import RuleInstance
from . import verdict as V
from .bindings import choose
from .divisors import cancelled_divisor, new_divisor
from .numeric import numeric_gate
from .prove import prove_at
from .shapes import check_shapes
from .verdict import UnprovenRule, UnprovenRuleWarning, UnsoundRule, Verdict
from ..rules.instances import OutOfTime, UnbuiltBinding

# Per z3 query (a binding's queries get 4 in all). The library's slowest query, a row
# of a top-k network, takes about 0.5 s alone on a 2-core machine; several times that
# under a loaded CI machine must still prove. It is spent only on rules that do not prove.
TIMEOUT_MS = 10000
# Per rule, building its instances and checking them: the library's slowest rule takes
# a few seconds on a 2-core machine; a rule of 7 or more free variables has 6^n shape
# assignments to build, and stops here as unknown, with a warning, instead of running on.
RULE_SECONDS = 120.0


def _instances(rule, deadline: float | None = None) -> tuple[str, list[RuleInstance]]:
    if isinstance(rule, RuleInstance):
        return rule.rule, [rule]
    return rule.name, list(rule.instances(deadline))


def _label(inst: RuleInstance) -> str:
    return f"instance {inst.lhs.name} -> {inst.rhs.name}"


def _refute(inst: RuleInstance):
    """Shapes in z3 and the numeric gate: (status, method, counterexample, notes, prover bindings)."""
    try:
        shapes = check_shapes(inst)
    except ValueError as err:
        return "unknown", "", "", [f"{_label(inst)}: shapes: {err}"], []
    if shapes.status == "refuted":
        return "unsound", "z3", f"shapes: {shapes.detail}", [], []
    notes = [] if shapes.status == "proven" else [f"{_label(inst)}: shapes unknown ({shapes.detail})"]
    prover_bindings, numeric_bindings = choose(inst)
    if not numeric_bindings:
        return "unknown", "", "", notes + [f"{_label(inst)}: no binding with dims 1..9 satisfies the conditions"], []
    bad = numeric_gate(inst, numeric_bindings)
    if bad:
        return "unsound", "numeric", f"numeric: {bad}", notes, []
    if not prover_bindings:
        notes.append(f"{_label(inst)}: every satisfying binding is too large for the provers")
    return ("unknown" if notes else "proven"), "", "", notes, prover_bindings


def _prove(inst: RuleInstance, bindings, timeout_ms: int, deadline: float):
    """Provers at each binding, stopping at the first that does not prove:
    (status, methods, counterexample, notes). OutOfTime past `deadline`."""
    methods: set[str] = set()
    for k, binding in enumerate(bindings):
        if time.perf_counter() > deadline:
            raise OutOfTime(f"proving {_label(inst)}: {k} of {len(bindings)} bindings done")
        try:
            result = prove_at(inst, binding, timeout_ms)
        except CleaveError as err:
            return "unknown", methods, "", [f"{_label(inst)} at {binding}: {err}"]
        if result.status == "refuted":
            return "unsound", {result.method}, f"{result.method}: {result.detail}", []
        if result.status != "proven":
            return "unknown", methods, "", [f"{_label(inst)}: {result.detail}"]
        methods.add(result.method)
    return "proven", methods, "", []


# z3's global context is not thread-safe: two threads' first calls proving at once
# ("invalid dec_ref command", "Context mismatch") left both operators uncompiled.
_PROVING = threading.RLock()


@under_torch_defaults
def check_rule(rule, *, timeout_ms: int = TIMEOUT_MS, use_cache: bool = True, seconds: float = RULE_SECONDS) -> Verdict:
    """The verdict on one rule (an object with `name` and `instances()`, or a RuleInstance).
    `timeout_ms` bounds each z3 query; `seconds` the whole check: past it the rule is
    unknown (not cached: a longer limit tries again), with an UnprovenRuleWarning naming
    the rule and the limit."""
    if not seconds > 0:
        raise ValueError(f"seconds is a positive time limit per rule, not {seconds!r}")
    with _PROVING:
        try:
            return _check_rule(rule, timeout_ms, use_cache, time.perf_counter() + seconds)
        except OutOfTime as err:
            name = rule.rule if isinstance(rule, RuleInstance) else rule.name
            why = f"verification stopped at its time limit of {seconds:g} s per rule ({err})"
            warnings.warn(f"rule {name!r}: {why}: unknown, not proven (a larger `seconds=`, or "
                          f"`cleave rules verify --rule-timeout`, gives it longer)", UnprovenRuleWarning, stacklevel=2)
            return Verdict(name, "unknown", "limit", seconds, "", [why])


def _check_rule(rule, timeout_ms: int, use_cache: bool, deadline: float) -> Verdict:
    definition = V.definition_key(rule) if use_cache else None
    if definition:
        found = V.lookup(definition, rule.name, timeout_ms)
        if found is not None:
            return found
    refused = new_divisor(rule) or cancelled_divisor(rule)
    if refused:  # before the instances: a rule that does not build may still divide by a new value
        result = Verdict(rule.name, "unsound", "divisors", 0.0, refused)
        if definition:
            V.store(definition, result, timeout_ms)
        return result
    try:
        name, instances = _instances(rule, deadline)
    except UnbuiltBinding as err:
        return Verdict(rule.name, "unknown", "shapes", 0.0, "", [str(err)])
    key = V.rule_key(instances)
    if use_cache:
        found = V.lookup(key, name, timeout_ms)
        if found is not None:
            if definition:
                V.store(definition, found, timeout_ms)
            return found
    start = time.perf_counter()
    status, methods, counterexample, notes = "proven", set(), "", []
    if not instances:
        status, notes = "unknown", ["the rule has no instances to check"]
    pending = []
    for k, inst in enumerate(instances):  # the cheap refutations first, over every instance
        if time.perf_counter() > deadline:
            raise OutOfTime(f"checking {k} of {len(instances)} instances numerically")
        s, m, cex, n, bindings = _refute(inst)
        notes += n
        if s == "unsound":
            status, counterexample, methods = "unsound", cex, {m}
            break
        if s == "unknown":
            status = "unknown"
        pending.append((inst, bindings))
    if status != "unsound":
        for inst, bindings in pending:
            s, m, cex, n = _prove(inst, bindings, timeout_ms, deadline)
            notes += n
            if s == "unsound":
                status, counterexample, methods = "unsound", cex, m
                break
            methods |= m
            if s == "unknown":
                status = "unknown"
                break  # the verdict cannot become proven any more
    exempt = next((inst.f32_exempt for inst in instances if inst.f32_exempt), "")
    if exempt:
        notes.append(f"exact in the reals, not in f32, exempt from the numeric gate's f32 leg: {exempt}")
    method = "+".join(sorted(methods)) or "numeric"
    result = Verdict(name, status, method, time.perf_counter() - start, counterexample, notes)
    if use_cache:
        for k in filter(None, (key, definition)):
            V.store(k, result, timeout_ms)
    return result


def check_rules(rules: Iterable, **kwargs) -> list[Verdict]:
    return [check_rule(r, **kwargs) for r in rules]


def _reject(failed: list[tuple]) -> None:
    """UnsoundRule naming the first (rule, verdict) of `failed`, where it is written, and
    why, then the others' names; UnprovenRule (an UnsoundRule) where the first is unknown."""
    if failed:
        rule, first = failed[0]
        where = f"{rule.source}: " if getattr(rule, "source", "") else ""
        more = f" (and {len(failed) - 1} more: {', '.join(v.rule for _, v in failed[1:])})" if len(failed) > 1 else ""
        raise (UnsoundRule if first.verdict == "unsound" else UnprovenRule)(where + first.explain() + more)


def require_sound(rules: Iterable, **kwargs) -> list[Verdict]:
    """Every rule proven, or UnsoundRule naming the first one that is not (with its
    counterexample, or why it is unknown). For the CLI and strict use."""
    rules = list(rules)
    verdicts = check_rules(rules, **kwargs)
    _reject([(r, v) for r, v in zip(rules, verdicts) if not v.ok])
    return verdicts


def with_proven_files(paths, **kwargs) -> tuple[list, list[Verdict]]:
    """(the rule library plus the rules of the files at `paths`, those files' verdicts):
    each of their rules proven first, as `cleave rules verify` does, or UnsoundRule
    naming the first that is not, its file and line, and the counterexample or why
    it is unknown. For `cleave optimize --rules` and `cleave.compile(rules=...)`."""
    from cleave.rules import with_files

    rules, extra = with_files(paths)
    return rules, require_sound(extra, **kwargs)


def _announce_proofs(rules: list, timeout_ms: int) -> None:
    """A cold first compile spends seconds proving rules: say so, once per batch."""
    cold = [r for r in rules if (key := V.definition_key(r)) is None or V.lookup(key, r.name, timeout_ms) is None]
    if cold:
        problem = unwritable(V.verdict_dir())
        cached = (f"takes a while once, then the verdicts are cached in {V.verdict_dir()}" if problem is None else
                  f"takes a while, in every process: the verdicts cannot be cached in {V.verdict_dir()} ({problem})")
        report_progress(f"[cleave] proving {len(cold)} rewrite rule(s) with z3 before their first use; this {cached}")


def sound_rules(rules: Iterable, **kwargs) -> list:
    """The gate before saturation: the proven rules, in order. A rule with a confirmed
    counterexample raises UnsoundRule (a library bug is never dropped silently); an
    unknown one is left out with an UnprovenRuleWarning saying why (e.g. a timeout at
    a binding)."""
    rules = list(rules)
    _announce_proofs(rules, kwargs.get("timeout_ms", TIMEOUT_MS))
    verdicts = check_rules(rules, **kwargs)
    _reject([(r, v) for r, v in zip(rules, verdicts) if v.verdict == "unsound"])
    for v in verdicts:
        if v.verdict == "unknown":
            warnings.warn(f"{v.explain()}; not loaded for saturation", UnprovenRuleWarning, stacklevel=2)
    return [r for r, v in zip(rules, verdicts) if v.ok]
