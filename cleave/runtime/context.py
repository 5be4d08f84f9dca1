"""State shared by everything one compiled function (or the torch backend) runs:
the operators it built, keyed by cache key so that a recapture of the same graph
(a dynamo recompile, a new static shape) reuses the operator and does no new
search; the unsupported ops already warned about; the operators that could not
be built; and the launch log that `explain` reads."""
from __future__ import annotations

import warnings

import torch

from .. import passes, progress
from ..ir import Graph
from .artifact import find_operator
from .operator import STAT_KEYS, CompiledOperator
from .user_frame import _user_level


class Context:
    def __init__(self, device: str | torch.device | None = None, top_k: int = 4, artifact=None, verbose=None,
                 rules=None, candidates: int = 1):
        self.device = torch.device(device) if device else None
        self.top_k = top_k
        self.candidates = candidates  # candidates each operator ranks (operator.RANKED_CANDIDATES)
        self.verbose = verbose  # progress lines: True, False, or None (the "cleave" logger's level)
        self.artifact = artifact  # an artifact directory (cleave trace build) to load operators from
        self.rules = rules  # the rules to search with (None: the library)
        self.operators: dict[str, CompiledOperator] = {}
        self.warned: set[str] = set()  # each unsupported op and reason (stats)
        self.warned_where: set[tuple[str, str, str]] = set()  # ... and the code it runs in (warned once)
        self.failed: list[str] = []
        self.eager_regions = 0
        self.capture_notes: set[str] = set()
        self.eager_notes: set[str] = set()
        self.log: list | None = None  # a list while explain runs: (operator, spec, plan, shapes) per launch
        self.pass_seconds: dict[str, float] = {}  # compile time per pass (cleave.passes)

    def operator(self, graph: Graph, dynamic: set[str], device: torch.device) -> CompiledOperator:
        if torch.device(device).type == "meta":  # compiled.prepare of shapes alone: for the calls to come
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        op = CompiledOperator(graph, dynamic, self.device or device, self.top_k, rules=self.rules,
                              candidates=self.candidates)
        if op.key not in self.operators and self.artifact is not None:
            op.entry = find_operator(self.artifact, op.fields)
        return self.operators.setdefault(op.key, op)

    def run(self, op: CompiledOperator, inputs: dict[str, torch.Tensor],
            labels: dict[str, str] | None = None) -> list[torch.Tensor]:
        """op's result; while explain runs, its launch is logged, with the user's names of
        its inputs (`labels`: dynamo's placeholders, `arg3_1`, are the graph's)."""
        with progress.verbose(self.verbose), passes.recording(self.pass_seconds):
            if self.log is not None:
                plan, spec = op.select(inputs)
                self.log.append((op, spec, plan, {k: list(v.shape) for k, v in inputs.items()}, labels or {}))
            return op(inputs)

    def warn_unsupported(self, op: str, where: str, source: str | None = None, reason: str = "") -> None:
        """An op cleave cannot translate, said once per op, reason ("on complex64", or
        what in its arguments stops it; "" for an op with no rule) and code it runs in."""
        self.warned.add(f"{op} {reason}".strip())
        key = (op, reason, where)
        if key not in self.warned_where:
            self.warned_where.add(key)
            at = f" (at {source})" if source else ""
            what = f"{op} {reason}" if reason.startswith("on ") else op
            why = f" ({reason})" if reason and not reason.startswith("on ") else ""
            warnings.warn(f"cleave: {what}{at} is not supported{why}; it runs eagerly in {where} (graph break)",
                          stacklevel=_user_level())

    def warn_eager(self, where: str, reason: str) -> None:
        """A call cleave leaves to eager PyTorch although it compiles: said once per reason."""
        message = f"cleave: {where} runs eagerly: {reason}"
        if message not in self.eager_notes:
            self.eager_notes.add(message)
            warnings.warn(message, stacklevel=_user_level())

    def warn_failed(self, name: str, where: str, reason: str) -> None:
        """An operator cleave could not build (not an unsupported op): said once per operator and reason."""
        message = f"cleave: could not compile {name} (in {where}): {reason}; running eagerly"
        if message not in self.failed:
            self.failed.append(message)
            warnings.warn(message, stacklevel=_user_level())

    def warn_capture(self, where: str, reason: str) -> None:
        """Shapes first met inside a CUDA graph capture ran eagerly: said once per reason."""
        message = (f"cleave: {reason} (in {where}); that call ran eagerly, so the captured graph holds "
                   f"PyTorch's kernels: call it once with these shapes before capturing")
        if message not in self.capture_notes:
            self.capture_notes.add(message)
            warnings.warn(message, stacklevel=_user_level())

    def stats(self) -> dict:
        out = {k: 0 for k in STAT_KEYS if k != "calls"}
        for op in self.operators.values():
            for k in out:
                out[k] += op.stats[k]
        out["operators"] = len(self.operators)
        out["graph_breaks"] = self.eager_regions
        out["unsupported"] = sorted(self.warned)
        out["failed"] = len(self.failed)
        out["pass_seconds"] = dict(self.pass_seconds)
        return out
