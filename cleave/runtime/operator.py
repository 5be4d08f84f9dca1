"""One compiled operator: an IR graph whose dynamic symbols are runtime extents.

The search runs at most once per operator (or never, when the artifact is in the
cache); the scheduler runs once per binding of the static symbols. Every later
call only binds the shapes (memoized per input-shape tuple), picks a plan (the
first one on CPU; on the GPU the one profiled fastest for the shape bucket) and
launches it. The search is imported lazily, only on a cache miss: loading and
running an artifact needs torch and triton alone.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import sympy
import torch

from ..ir import Candidate, CleaveError, Graph, Separable, parse_graph
from . import artifact as A
from .buckets import bucket
from .cache import device_name, entry_dir, key_fields, operator_key

STAT_KEYS = ("calls", "searches", "compiles", "from_cache", "tunings", "search_seconds", "compile_seconds")


@dataclass
class Spec:
    """The top-k plans for one binding of the static symbols."""
    static: dict[str, int]
    candidate: int
    plans: list
    tuning: dict[str, int] = field(default_factory=dict)
    from_cache: bool = False


class CompiledOperator:
    def __init__(self, graph: Graph, dynamic: set[str], device: str | torch.device = "cpu", top_k: int = 4):
        self.graph = graph
        self.dynamic = set(dynamic) & {s.name for s in graph.symbols()}
        self.device = torch.device(device)
        self.top_k = top_k
        self.fields = key_fields(graph.key(), self.dynamic, device_name(self.device))
        self.key = operator_key(self.fields)
        self.entry = entry_dir(self.key)
        self.stats = {k: 0 for k in STAT_KEYS}
        self.search_stats: dict = {}
        self.candidates: list[Candidate] | None = None
        self.specs: dict[tuple, Spec] = {}
        self._dispatch: dict[tuple, tuple] = {}

    # -- running ----------------------------------------------------------
    def __call__(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        plan, _ = self.select(inputs)
        self.stats["calls"] += 1
        return _scheduler("launch")(plan, inputs)

    def select(self, inputs: dict[str, torch.Tensor]):
        """(plan, spec) for these inputs: cached per shape tuple, so a repeated shape costs a dict lookup."""
        shapes = tuple((k, tuple(v.shape)) for k, v in inputs.items())
        hit = self._dispatch.get(shapes)
        if hit is not None:
            return hit
        env = self.graph.bind(dict(shapes))
        static = {k: v for k, v in sorted(env.items()) if k not in self.dynamic}
        spec = self._spec(static, env)
        result = (self._choose(spec, env, inputs), spec)
        self._dispatch[shapes] = result
        return result

    def _choose(self, spec: Spec, env: dict, inputs):
        if self.device.type != "cuda" or len(spec.plans) == 1:
            return spec.plans[0]
        key = bucket(env, self.dynamic)
        if key not in spec.tuning:
            best = _scheduler("profile")(spec.plans, inputs)
            spec.tuning[key] = next(i for i, p in enumerate(spec.plans) if p is best or p == best)
            A.save_tuning(self.entry, spec.static, {key: spec.tuning[key]})
            self.stats["tunings"] += 1
        return spec.plans[spec.tuning[key]]

    # -- building or loading ----------------------------------------------
    def _spec(self, static: dict[str, int], env: dict[str, int]) -> Spec:
        k = tuple(static.items())
        if k not in self.specs:
            self.specs[k] = self._load_spec(static) or self._build_spec(static, env)
        return self.specs[k]

    def _load_spec(self, static) -> Spec | None:
        Plan = _scheduler("Plan")
        try:
            body, _ = A.load_spec(self.entry, static)  # also checks every kernel file's checksum
            plans = [Plan.from_json(p) for p in body["plans"]]
        except A.ArtifactMissing:
            return None
        except (A.ArtifactError, KeyError, TypeError, ValueError) as err:
            warnings.warn(f"cleave: damaged cache entry for {self.graph.name} ({err}); rebuilding it", stacklevel=4)
            return None
        self.candidates = self.candidates or self._load_candidates()
        self.stats["from_cache"] = 1
        return Spec(static, body["candidate"], plans, A.load_tuning(self.entry, static), from_cache=True)

    def _build_spec(self, static, env) -> Spec:
        schedule = _scheduler("schedule")
        candidates = self._candidates()
        start = time.perf_counter()
        reasons = []
        for index, cand in enumerate(candidates):
            try:
                plans = schedule(cand, shapes=dict(env), dynamic=set(self.dynamic), top_k=self.top_k)
            except CleaveError as err:
                reasons.append(f"candidate {index}: {err}")
                continue
            if plans:
                break
            reasons.append(f"candidate {index}: no plan")
        else:
            raise CleaveError(f"cannot schedule {self.graph.name}: " + "; ".join(reasons or ["no candidates"]))
        self.stats["compiles"] += 1
        self.stats["compile_seconds"] += time.perf_counter() - start
        body = {"candidate": index, "shapes": dict(env), "dynamic": sorted(self.dynamic),
                "plans": [p.to_json() for p in plans]}
        A.save_spec(self.entry, static, body, [[k.source for k in p.kernels] for p in plans])
        return Spec(static, index, plans)

    def _candidates(self) -> list[Candidate]:
        if self.candidates is None:
            self.candidates = self._load_candidates() or self._search()
        return self.candidates

    def _load_candidates(self) -> list[Candidate] | None:
        try:
            body = A.read_json(self.entry / "operator.json")
            cands = [_candidate_from_json(c) for c in body["candidates"]]
        except A.ArtifactMissing:
            return None
        except (A.ArtifactError, CleaveError, KeyError, TypeError, ValueError) as err:
            warnings.warn(f"cleave: damaged cache entry for {self.graph.name} ({err}); rebuilding it", stacklevel=5)
            return None
        self.search_stats = body.get("search_stats", {})
        return cands

    def _search(self) -> list[Candidate]:
        search = _search_function()
        start = time.perf_counter()
        result = search(self.graph, top_k=self.top_k)
        self.stats["searches"] += 1
        self.stats["search_seconds"] += time.perf_counter() - start
        self.search_stats = _jsonable(dict(getattr(result, "stats", {}) or {}))
        cands = list(result.candidates)
        if not cands:
            raise CleaveError(f"the search returned no candidate for {self.graph.name}")
        A.write_json(self.entry / "operator.json", {
            "name": self.graph.name, "fields": self.fields, "graph": self.graph.text(),
            "candidates": [_candidate_to_json(c) for c in cands], "search_stats": self.search_stats})
        return cands


def _scheduler(name: str):
    """A public function of cleave.scheduler (a submodule of the same name may shadow the attribute)."""
    from .. import scheduler

    obj = getattr(scheduler, name)
    return getattr(obj, name) if isinstance(obj, type(scheduler)) else obj


def _search_function():
    """`cleave.search` is the public function (the package attribute may be the subpackage)."""
    from .. import search

    return search if callable(search) else search.search


def _candidate_to_json(c: Candidate) -> dict:
    return {"graph": c.graph.text(), "facts": [f.to_json() for f in c.facts],
            "derivation": list(c.derivation), "cost": str(c.cost)}


def _candidate_from_json(d: dict) -> Candidate:
    return Candidate(parse_graph(d["graph"]), [Separable.from_json(f) for f in d["facts"]],
                     list(d["derivation"]), sympy.sympify(d["cost"]))


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)
