"""What the verifier says about a rule, the error that rejects it, and the verdict cache.

Proven and unsound verdicts are facts: cached in process and on disk under
storage.cache_dir()/verify, so that saturation does not re-prove the
library every time. Unknown verdicts (a timeout, a prover that could not decide) are
cached in process only, with their timeout: a fresh process, or a longer timeout,
tries again.

Two keys per rule: a hash of its instance texts (and the verifier's version), and a
hash of its definition, so that checking a known rule does not even build its
instances (seconds, for the library). The definition key covers the rule's text and
the sources that instantiate it (the rule's package and cleave.ir): an edit there
rebuilds the instances, whose own key then usually finds the verdict.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from ..ir import CleaveError
from ..ir.contracts import RuleInstance
from ..storage import cache_dir, write_atomic

# Bump when the verifier's semantics change, so that stale verdicts are not reused.
VERIFIER_VERSION = "15"  # 15: proofs under torch's defaults (verdicts cached under autocast re-proven); 14: divisors take infinities in the special style; 13: a cancelled divisor refused (12 was signed zeros, reverted); 8: axis variables bound apart, two top-k counts, inf_to_zero of infinities; 9-10: the rhs domain; 11: special values, the f32 leg

# proven: every instance proven (z3 or sympy) at every prover binding and the numeric
# gate passed; unsound: a confirmed counterexample; unknown: no counterexample, but a
# prover could not decide (the numeric gate passed): never accepted as sound.
VERDICTS = ("proven", "unsound", "unknown")


class UnsoundRule(CleaveError):
    """A rule failed verification (a counterexample), or could not be proven."""


class UnprovenRule(UnsoundRule):
    """A rule required proven that the provers could not decide (no counterexample
    either): an UnsoundRule, as strict callers catch, named for what it is."""


class UnprovenRuleWarning(UserWarning):
    """A rule the provers could not decide (no counterexample either): not loaded for saturation."""


@dataclass
class Verdict:
    rule: str
    verdict: str
    method: str  # the provers that decided, e.g. "z3", "z3+sympy"; "numeric" if only the gate ran to the end
    seconds: float
    counterexample: str = ""  # for unsound: the binding, the inputs and the differing element
    notes: list[str] = field(default_factory=list)  # why a prover said unknown; a proven rule's f32 exemption
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.verdict == "proven"

    def line(self, width: int = 32) -> str:
        return f"{self.rule:<{width}} {self.method:<10} {self.seconds:7.2f}s  {self.verdict}"

    def explain(self) -> str:
        if self.verdict == "unsound":
            return f"rule {self.rule!r} is unsound: {self.counterexample}"
        if self.verdict == "unknown":
            why = "; ".join(self.notes) or "no prover decided"
            return f"rule {self.rule!r} is not proven (unknown): {why}"
        remarks = f" ({'; '.join(self.notes)})" if self.notes else ""
        return f"rule {self.rule!r} is proven by {self.method}{remarks}"

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("cached")
        return d


def rule_key(instances: list[RuleInstance]) -> str:
    h = hashlib.sha256(VERIFIER_VERSION.encode())
    for inst in instances:
        h.update(inst.lhs.text().encode())
        h.update(b"\0")
        h.update(inst.rhs.text().encode())
        h.update(b"\0")
        h.update(repr(sorted(str(c) for c in inst.conditions)).encode())
        h.update(repr(inst.masked).encode())
        h.update(repr((inst.finite, inst.f32_exempt)).encode())
        h.update(b"\1")
    return h.hexdigest()


def definition_key(rule) -> str | None:
    """A key for a rule object of the DSL (with `text()`), None for a bare RuleInstance."""
    if isinstance(rule, RuleInstance) or not callable(getattr(rule, "text", None)):
        return None
    h = hashlib.sha256(f"{VERIFIER_VERSION}\0definition\0".encode())
    h.update(_code_fingerprint(type(rule).__module__).encode())
    h.update(rule.text().encode())
    return h.hexdigest()


@lru_cache(maxsize=None)
def _code_fingerprint(module: str) -> str:
    """A hash of the sources that turn a rule definition into instances."""
    from .. import ir

    h = hashlib.sha256()
    source = getattr(sys.modules.get(module), "__file__", None) or ir.__file__
    for folder in (Path(source).parent, Path(ir.__file__).parent):
        for path in sorted(folder.glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


_MEMORY: dict[str, Verdict] = {}
_UNKNOWN: dict[str, tuple[int, Verdict]] = {}  # key -> (timeout in ms, verdict), this process only


def verdict_dir() -> Path:
    return cache_dir() / "verify"


def lookup(key: str, name: str, timeout_ms: int) -> Verdict | None:
    """A cached verdict: a fact from memory or disk, or an unknown reached with at least `timeout_ms`."""
    found = _MEMORY.get(key)
    if found is None and key in _UNKNOWN:
        spent, unknown = _UNKNOWN[key]
        if spent >= timeout_ms:
            found = unknown
    if found is None:
        path = verdict_dir() / f"{key}.json"
        try:
            found = Verdict(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        _MEMORY[key] = found
    return Verdict(name, found.verdict, found.method, found.seconds, found.counterexample, list(found.notes), True)


def store(key: str, verdict: Verdict, timeout_ms: int) -> None:
    if verdict.verdict == "unknown":
        _UNKNOWN[key] = (timeout_ms, verdict)
        return
    _MEMORY[key] = verdict
    try:
        write_atomic(verdict_dir() / f"{key}.json", json.dumps(verdict.to_json()))
    except OSError:
        pass  # a read-only cache only costs a re-proof next time


def clear_memory() -> None:
    _MEMORY.clear()
    _UNKNOWN.clear()
