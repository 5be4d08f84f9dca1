"""One compiled operator: an IR graph whose dynamic symbols are runtime extents.

The search runs at most once per operator (or never, when the artifact is in the
cache); the scheduler runs once per binding of the static symbols. Every later
call only binds the shapes (memoized per input-shape tuple), picks a plan among
those that fit the shape (the first one on CPU; on the GPU the one profiled
fastest for the shape bucket and the wave count of that bucket's choice) and
launches it. On the GPU the first call compiles every plan, so that no later shape
compiles a kernel. The search is imported lazily, only on a cache miss: loading
and running an artifact needs torch and triton alone.

Failures to build (the search, the scheduler, or a kernel's first launch, which
is when Triton compiles it) raise CompileFailure; the caller runs the code
eagerly instead. Errors on later launches are real errors and propagate. While
the caller captures a CUDA graph nothing is compiled or timed (that would launch
kernels into the graph): shapes not built yet raise NotReadyDuringCapture, and
that one call runs eagerly.
"""
from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass, field, replace

import sympy
import torch
from triton import knobs

from .. import passes, progress
from ..interpreter import TORCH_DTYPES, interpret
from ..ir import BindingError, Candidate, CleaveError, Graph, Separable, parse_graph
from ..ir.contracts import then_as_written
from ..ir.dtypes import dtype as ir_dtype
from ..torch_state import under_torch_defaults
from ..rules import digest as rule_digest
from ..scheduler import H200, Plan, schedule
from ..scheduler.exprs import evaluate
from . import artifact as A
from .buckets import bucket
from .user_frame import _user_level
from .cache import device_name, entry_dir, key_fields, operator_key
from .launch import gluon_runs_on, launch, prepare, remember, run
from .mix import compose, fastest_kernels, partition_key, picks_key
from .profile import rank
from .waves import waves

# How many of the search's first candidates that schedule an offline build (`cleave trace
# build`) ranks against each other by their best plan's cost: the search orders
# candidates by its own cost, blind to tiling (the MLA decode's FlashDecoding form comes
# third, below forms that materialise the scores). Each costs a schedule (a third more
# compile time over the test suite's layers), so a compile on first call ranks 1 unless
# asked. The graph as written is scheduled only when none of them is: at a short first
# shape it would outrank the split candidates a dynamic operator needs at long ones.
RANKED_CANDIDATES = 3
# The static binding's key for the plans of the graph as written (not an identifier: no symbol has it)
AS_WRITTEN = "(as written)"
STAT_KEYS = ("calls", "searches", "compiles", "from_cache", "tunings", "search_seconds", "compile_seconds")


def f32_matmul_precision() -> str:
    """How f32 MatMul operands may be rounded (Target.f32_matmul), read per call: "medium"
    where torch.set_float32_matmul_precision("medium") lets them round to bf16, else
    "highest". torch records "medium" as the bf16 level of its per-backend setting, read
    here because the other getter raises once that setting is used. "high" (TF32) keeps
    f32 dots exact: TF32 plans of a 4096^3 f32 MatMul were correct on the H200 but ran
    70-94 TFLOP/s at one pipeline stage, and the runtime's tuning of them faulted (an
    illegal address; RESULTS.md, session 24)."""
    return "medium" if torch._C._get_fp32_precision_getter("mkldnn", "matmul") == "bf16" else "highest"


class CompileFailure(CleaveError):
    """cleave could not build this operator for these shapes (search, scheduler or
    the kernels' first launch failed); the message says why."""


class NotReadyDuringCapture(CleaveError):
    """These shapes need kernels compiled or a bucket timed, which launch work of their
    own: not while the caller captures a CUDA graph. This call runs eagerly; the next
    one outside a capture builds them."""


@dataclass
class Spec:
    """The top-k plans for one binding of the static symbols, and the candidate they
    schedule (stored with them, so a spec never depends on which process last wrote
    operator.json: two processes' searches may return different candidates)."""
    static: dict[str, int]
    candidate: Candidate
    plans: list
    tuning: dict[str, list[int]] = field(default_factory=dict)
    from_cache: bool = False
    warm: bool = False  # every plan compiled (GPU)
    broken: set = field(default_factory=set)  # plans this process's Triton failed to compile (_warm)
    mixes: dict = field(default_factory=dict)  # per-kernel picks -> the composed plan (mix.compose)


class CompiledOperator:
    def __init__(self, graph: Graph, dynamic: set[str], device: str | torch.device = "cpu", top_k: int = 4,
                 entry=None, rules=None, candidates: int = 1):
        self.graph = graph
        # What keys a binding: the symbols the values read, and those only a constraint reads
        # (the int argument of `max(k, 0)` traced at k < 0: the graph holds for k <= 0 only)
        self._read = {s.name for s in graph.symbols()} | {s.name for c in graph.constraints for s in c.free_symbols}
        self._nonempty = {s.name for s in graph.nonempty_symbols()}  # what a rewritten candidate needs non-zero
        self.dynamic = set(dynamic) & self._read
        self.device = torch.device(device)
        self.top_k = top_k
        self.ranked = candidates  # the first candidates that schedule, ranked by their plans' cost
        self.rules = rules  # None: the library (already keyed by cleave's source hash)
        self.f32_matmul = f32_matmul_precision()  # as torch's MatMuls honour it (Target.f32_matmul)
        self.fields = key_fields(graph.key(), self.dynamic, device_name(self.device),
                                 rule_digest(rules) if rules is not None else None)
        if self.f32_matmul != "highest":  # torch's default keeps its key, and its cache entries
            self.fields["f32_matmul"] = self.f32_matmul
        if graph.constraints:  # the same graph traced on another branch of its sizes serves other shapes
            self.fields["constraints"] = sorted(str(c) for c in graph.constraints)
        self.key = operator_key(self.fields)
        self.entry = entry or entry_dir(self.key)
        self.stats = {k: 0 for k in STAT_KEYS}
        self.search_stats: dict = {}
        self.candidates: list[Candidate] | None = None
        self.specs: dict[tuple, Spec] = {}
        self._dispatch: dict[tuple, tuple] = {}
        self._ready: dict[tuple, object] = {}  # input shapes -> their plan's prepared launch, once it has run
        self._launched: set[int] = set()  # ids of plans that have run once (Triton compiled them)
        self._where = _symbol_locations(graph)

    # -- running ----------------------------------------------------------
    def __call__(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        self.stats["calls"] += 1
        shapes = tuple((k, v.shape) for k, v in inputs.items())
        ready = self._ready.get(shapes)
        if ready is not None:  # a shape seen before: one dict lookup, then the kernels
            return run(ready, inputs)
        plan, _ = self.select(inputs)
        if id(plan) not in self._launched:
            self._outside_capture("its kernels compiled")
        try:
            outs = launch(plan, inputs)
        except BindingError:  # the inputs do not fit the graph: the caller's error, not cleave's
            raise
        except Exception as err:  # the first launch compiles the kernels: a failure there is a build failure
            if id(plan) in self._launched:
                raise
            if _no_gpu_nor_interpreter(inputs):
                raise CompileFailure("there is no GPU here for its kernels: set TRITON_INTERPRET=1 to run them on "
                                     "the CPU with Triton's interpreter") from err
            raise CompileFailure(f"its kernels failed on their first launch ({_reason(err)})") from err
        if not any(self._empty_outputs(self._env(dict(shapes)))):  # else kernels were skipped, uncompiled
            self._launched.add(id(plan))
        remember(self._ready, shapes, prepare(plan, inputs))
        return outs

    def ready(self, inputs: dict[str, torch.Tensor]):
        """The launch serving these input shapes once they have run, as a callable on
        inputs of these shapes; else None."""
        prepared = self._ready.get(tuple((k, v.shape) for k, v in inputs.items()))
        return None if prepared is None else functools.partial(run, prepared)

    @under_torch_defaults
    def select(self, inputs: dict[str, torch.Tensor]):
        """(plan, spec) for these inputs: cached per shape tuple, so a repeated shape costs a
        dict lookup, and a new one reads the symbols off the tensors as plain ints (the
        scheduler's launch binds and checks the whole graph once per shape)."""
        shapes = tuple((k, tuple(v.shape)) for k, v in inputs.items())
        hit = self._dispatch.get(shapes)
        if hit is not None:
            return hit
        # Only the dims some output depends on key a binding: an argument nothing reads (an
        # unused mask) takes any shape without a new schedule.
        env = {k: v for k, v in self._env(dict(shapes)).items() if k in self._read}
        self.graph.check(env)  # once per shape: the captured graph's facts (torch's range guards) hold here
        static = {k: v for k, v in sorted(env.items()) if k not in self.dynamic}
        try:
            spec = self._spec(static, env)
            if not _fitting(spec.plans, env):  # a split leaves a chunk empty here (every chunk, at n = 0)
                spec = self._spec(static, env, as_written=True)
            elif spec.candidate.derivation and any(env.get(s) == 0 for s in self._nonempty):
                # An axis the graph reduces over is empty: a rewrite that moves a row's scale
                # out of the reduction (rowscale-after-matmul, sum-pull-factor) turns eager's
                # NaN times an empty row (then summed: 0) into NaN; or a size divided by is 0
                # (sum-pull-div: eager's sum(y / 0) NaN, sum(y) / 0 inf). The graph as written is eager's.
                spec = self._spec(static, env, as_written=True)
            plan = self._choose(spec, env, inputs)
        except (CompileFailure, BindingError, NotReadyDuringCapture):
            raise
        except Exception as err:  # search, scheduler, or their imports (no egglog on a serving box)
            raise CompileFailure(_reason(err)) from err
        remember(self._dispatch, shapes, (plan, spec))
        return plan, spec

    def env_of(self, inputs: dict[str, torch.Tensor]) -> dict[str, int]:
        """The symbols' values at these inputs."""
        return self._env({k: tuple(v.shape) for k, v in inputs.items()})

    def _env(self, shapes: dict[str, tuple]) -> dict[str, int]:
        if self._where is None:  # a symbol only inside an expression (2*h): solve through the graph
            return self.graph.bind(shapes)
        return {sym: shapes[name][axis] for sym, (name, axis) in self._where.items()}

    @under_torch_defaults
    def prepare(self, shapes: dict[str, tuple]) -> Spec:
        """Search (or load) and schedule for these input shapes without launching:
        builds an artifact on a machine that will not run it (`cleave trace build`)."""
        env = self.graph.bind(shapes)
        return self._spec({k: v for k, v in sorted(env.items()) if k not in self.dynamic}, env)

    def _choose(self, spec: Spec, env: dict, inputs):
        """The plan for this shape: among the plans whose constraints hold here (a split
        count leaves no chunk empty), the cost model's first on CPU; on the GPU the
        fastest measured for the shape's bucket (profiled once per bucket, saved), and
        within a bucket for each wave count of the bucket's choice."""
        fits = _fitting(spec.plans, env)
        if not fits:
            first = spec.plans[0]
            raise CompileFailure(f"no plan of {self.graph.name} serves {env}: plan 0 needs "
                                 f"{first.fits({**env, **first.split})}")
        # a plan with Gluon kernels runs their `tl` twins where Gluon does not: another plan's
        # kernels, not worth timing twice
        fits = [i for i in fits if not _has_gluon(spec.plans[i]) or gluon_runs_on(self.device)] or fits
        if self.device.type != "cuda" or len(fits) == 1:
            return spec.plans[fits[0]]
        empty = self._empty_outputs(env)
        if all(empty):  # no kernel has programs: nothing to time
            return spec.plans[fits[0]]
        self._warm(spec, inputs, fits, compiles_all=not any(empty))
        fits = [i for i in fits if i not in spec.broken]
        if not fits:
            raise CompileFailure(f"no plan of {self.graph.name} that serves {env} compiles here")
        key = bucket(env, self.dynamic)
        ranking = [i for i in spec.tuning.get(key, []) if i in fits]
        timed_here = not ranking
        if timed_here:
            ranking = self._tune(spec, key, fits, inputs)
        # Inside a bucket the fastest plan's programs may need more waves over the SMs
        # than where it was timed (a batch of 36 against 33): each wave count of that
        # plan is timed once, the bucket's choice being wrong exactly there.
        count = waves(spec.plans[ranking[0]], inputs)
        if count is not None:
            sub = f"{key};waves={count}"
            if timed_here:  # this shape's ranking is also that of its wave count
                picks = spec.tuning.get(_picks_key(key))
                self._save(spec, {sub: ranking, **_picks_entry(sub, picks, spec.tuning)})
            elif not [i for i in spec.tuning.get(sub, []) if i in fits]:
                self._tune(spec, sub, fits, inputs)
            key = sub
            ranking = [i for i in spec.tuning.get(sub, []) if i in fits]
        return self._mixed(spec, ranking, spec.tuning.get(_picks_key(key)))

    def _mixed(self, spec: Spec, ranking: list[int], picks: list | None) -> Plan:
        """plans[ranking[0]], or the plan composed of each kernel's fastest option where
        the bucket's tuning found one (mix.fastest_kernels), from plans that serve this
        shape (`ranking`); a saved mix that no longer matches the plans (another build)
        is ignored."""
        first = ranking[0]
        if not picks or any((p if isinstance(p, int) else p[0]) in spec.broken for p in picks):
            return spec.plans[first]
        plan = spec.mixes.get(picks_key(picks))
        if plan is None:
            try:
                plan = compose(spec.plans, picks)
            except (ValueError, IndexError, TypeError):
                return spec.plans[first]
            spec.mixes[picks_key(picks)] = plan
        served = {partition_key(spec.plans[i]) for i in ranking}
        return plan if partition_key(plan) in served else spec.plans[first]

    def _empty_outputs(self, env: dict) -> list[bool]:
        """Which outputs have no elements at env. A kernel with nothing to store has no
        programs: launch skips it, so it is neither compiled nor worth timing there."""
        return [0 in self.graph.concrete_shape(o, env) for o in self.graph.outputs]

    def _outside_capture(self, step: str) -> None:
        if _capturing(self.device):
            raise NotReadyDuringCapture(f"{self.graph.name} needs {step} for shapes first met during CUDA graph "
                                        f"capture")

    def _tune(self, spec: Spec, key: str, fits: list[int], inputs) -> list[int]:
        """Time the plans that fit on these inputs, then each kernel's options within the
        fastest plan's partition; save and return the ranking (the picks are saved with it)."""
        self._outside_capture(f"shape bucket {key} timed")
        start = time.perf_counter()
        ranking = [fits[i] for i in rank([spec.plans[i] for i in fits], inputs)]
        picks = fastest_kernels(spec.plans, ranking, inputs)
        best = spec.plans[ranking[0]]
        mixed = f", kernels from plans {picks}" if picks else ""
        _progress(f"[cleave tune] {self.graph.name} bucket {key or '(static)'}: {len(fits)} plans timed in "
                  f"{time.perf_counter() - start:.1f}s; fastest: split {best.split or 'none'}, "
                  f"{len(best.kernels)} kernel(s){mixed}")
        self._save(spec, {key: ranking, **_picks_entry(key, picks, spec.tuning)})
        self.stats["tunings"] += 1
        return ranking

    def _save(self, spec: Spec, rankings: dict[str, list[int]]) -> None:
        spec.tuning.update(rankings)
        try:
            A.save_tuning(self.entry, spec.static, rankings)
        except OSError as err:  # a read-only artifact: the choice holds for this process
            warnings.warn(f"cleave: cannot save tuning for {self.graph.name} ({err})", stacklevel=_user_level())

    def _warm(self, spec: Spec, inputs, fits, compiles_all: bool):
        """Compile every plan of the spec now, so that no later shape compiles a kernel:
        the plans that fit run on these inputs where that launches every kernel (no output
        is empty), the others on scratch inputs at the binding they were ranked at
        (dynamic ints are unspecialized: one compile serves every value)."""
        if spec.warm:
            return
        self._outside_capture("its plans compiled")
        start, failure = time.perf_counter(), None
        for i, plan in enumerate(spec.plans):
            if id(plan) in self._launched:
                continue
            _progress(f"[cleave compile] {self.graph.name}: plan {i + 1}/{len(spec.plans)} "
                      f"(split {plan.split or 'none'}), {time.perf_counter() - start:.1f}s")
            args = inputs if i in fits and compiles_all else _scratch(plan, self.device)
            try:
                with passes.timed("triton"):
                    launch(plan, args)
                # the call's own inputs where the plan serves them: a layer's weights are not copied
                wrong = _gluon_mismatch(plan, self.device, args if args is inputs else None) \
                    if _has_gluon(plan) and gluon_runs_on(self.device) else None
            except BindingError:
                raise
            except Exception as err:
                if _device_fault(err):  # the CUDA context is lost: no plan runs after it
                    raise CompileFailure(f"plan {i} failed on its first launch ({_reason(err)})") from err
                # A Triton that cannot compile one plan (triton 3.6 failed a persistent
                # split-K GEMM's fused loops) leaves the others to serve.
                spec.broken.add(i)
                failure = failure or f"plan {i}: {_reason(err)}"
                warnings.warn(f"cleave: plan {i} of {self.graph.name} does not compile here ({_reason(err)}); "
                              f"the other plans serve", stacklevel=_user_level())
                continue
            if wrong:  # served only where its output matched the `tl` kernels' at this launch
                spec.broken.add(i)
                failure = failure or f"plan {i}: {wrong}"
                warnings.warn(f"cleave: plan {i} of {self.graph.name}: {wrong}; the other plans serve",
                              stacklevel=_user_level())
                continue
            self._launched.add(id(plan))
        if len(spec.broken) == len(spec.plans):
            raise CompileFailure(f"no plan of {self.graph.name} compiles here ({failure})")
        spec.warm = True

    # -- building or loading ----------------------------------------------
    def _spec(self, static: dict[str, int], env: dict[str, int], as_written: bool = False) -> Spec:
        """The plans for this binding of the static symbols; with `as_written`, those of the
        graph as written, for the dynamic bindings that no plan of the searched candidate
        serves: it has no split, so no chunk to leave empty (its key is no symbol's name)."""
        if as_written:
            static = {**static, AS_WRITTEN: 1}
        k = tuple(static.items())
        if k not in self.specs:
            self.specs[k] = self._load_spec(static) or self._build_spec(static, env, as_written)
        return self.specs[k]

    def _load_spec(self, static) -> Spec | None:
        try:
            body, _ = A.load_spec(self.entry, static)  # also checks every kernel file's checksum
            self._check_owner(body)
            plans = [Plan.from_json(p) for p in body["plans"]]
            candidate = _candidate_from_json(body["candidate"])
        except A.ArtifactMissing:
            return None
        except (A.ArtifactError, CleaveError, KeyError, TypeError, ValueError) as err:
            if self._cache_exists():
                warnings.warn(f"cleave: damaged cache entry for {self.graph.name} ({err}); rebuilding it",
                              stacklevel=_user_level())
            return None
        self.stats["from_cache"] = 1
        return Spec(static, candidate, plans, A.load_tuning(self.entry, static), from_cache=True)

    def _check_owner(self, body: dict) -> None:
        """Checksums say a file is whole, not whose it is: plans another operator wrote
        (a cache directory synced or merged wrongly) served another function's values
        here without a word. (load_spec checks the binding; an artifact built before
        session 54 names no graph, and is taken as this one's.)"""
        if body.get("graph", self.graph.key()) != self.graph.key() or body.get("dynamic") != sorted(self.dynamic):
            raise A.ArtifactError("its plans are another operator's")

    def _build_spec(self, static, env, as_written: bool = False) -> Spec:
        searched = [] if as_written else self._candidates()
        candidates = then_as_written(searched, self.graph)
        start = time.perf_counter()
        reasons, scheduled = [], []
        for index, cand in enumerate(candidates):
            if scheduled and index >= len(searched):
                break  # the graph as written is a fallback, not a rival: it never splits
            try:
                with passes.timed("schedule"):
                    plans = schedule(cand, shapes=dict(env), dynamic=set(self.dynamic), top_k=self.top_k,
                                     target=replace(H200, f32_matmul=self.f32_matmul))
            except CleaveError as err:
                reasons.append(f"candidate {index}: {err}")
                continue
            if not plans:
                reasons.append(f"candidate {index}: no plan")
                continue
            scheduled.append((min(p.cost for p in plans), index, cand, plans))
            if len(scheduled) == self.ranked:
                break
        if not scheduled:
            raise CleaveError(f"cannot schedule {self.graph.name}: " + "; ".join(reasons or ["no candidates"]))
        _, _, cand, plans = min(scheduled, key=lambda t: t[:2])
        self.stats["compiles"] += 1
        self.stats["compile_seconds"] += time.perf_counter() - start
        body = {"graph": self.graph.key(), "candidate": _candidate_to_json(cand), "shapes": dict(env),
                "dynamic": sorted(self.dynamic), "plans": [p.to_json() for p in plans]}
        self._write("its plans", A.save_spec, self.entry, static, body, [[k.source for k in p.kernels] for p in plans])
        return Spec(static, cand, plans)

    def _candidates(self) -> list[Candidate]:
        if self.candidates is None:
            self.candidates = self._load_candidates() or self._search()
        return self.candidates

    def _load_candidates(self) -> list[Candidate] | None:
        try:
            body = A.read_json(self.entry / "operator.json")
            if body["fields"]["graph"] != self.graph.key():  # the structure's, whatever the graph's name
                raise A.ArtifactError("its candidates are another graph's")
            cands = [_candidate_from_json(c) for c in body["candidates"]]
        except A.ArtifactMissing:
            return None
        except (A.ArtifactError, CleaveError, KeyError, TypeError, ValueError) as err:
            if self._cache_exists():
                warnings.warn(f"cleave: damaged cache entry for {self.graph.name} ({err}); rebuilding it",
                              stacklevel=_user_level())
            return None
        self.search_stats = body.get("search_stats", {})
        return cands

    def _search(self) -> list[Candidate]:
        refuse_what_eager_refuses(self.graph)
        start = time.perf_counter()
        with passes.timed("search"):
            # at least the candidates _build_spec ranks, whatever number of plans is kept
            result = search(self.graph, top_k=max(self.top_k, self.ranked), rules=self.rules)
        self.stats["searches"] += 1
        self.stats["search_seconds"] += time.perf_counter() - start
        self.search_stats = _jsonable(dict(getattr(result, "stats", {}) or {}))
        cands = list(result.candidates)
        if not cands:
            raise CleaveError(f"the search returned no candidate for {self.graph.name}")
        self._write("its candidates", A.write_json, self.entry / "operator.json", {
            "name": self.graph.name, "fields": self.fields, "graph": self.graph.text(),
            "candidates": [_candidate_to_json(c) for c in cands], "search_stats": self.search_stats})
        return cands

    def _cache_exists(self) -> bool:
        """Whether the cache dir is a directory: one that cannot be made (under a file)
        holds nothing, and `_write` says why it keeps the operator in memory."""
        return self.entry.parent.is_dir()

    def _write(self, what: str, save, *args) -> None:
        """Save to the cache; a cache that cannot be written (read-only, full) only
        costs the next process a rebuild: this one keeps the operator in memory. Said
        once per cache directory and kind of failure: each operator wrote its candidates
        and its plans, two warnings per operator of a loop over shapes."""
        try:
            save(*args)
        except OSError as err:
            root = self.entry.parent
            if (root, type(err)) in _UNWRITTEN:
                return
            _UNWRITTEN.add((root, type(err)))
            warnings.warn(f"cleave: cannot write {what} of {self.graph.name} to the cache at {root} ({err}); "
                          f"keeping compiled operators in memory for this process (later failures to write "
                          f"there are not reported)", stacklevel=_user_level())


# (cache directory, OSError type) already warned about
_UNWRITTEN: set = set()


def search(graph: Graph, top_k: int, rules=None):
    """The algebraic search, imported on a cache miss only: egglog and z3 load with it.
    Its warnings (a candidate left out, a rule not used) are said at the user's line,
    where they named the runtime's call of the search."""
    from ..search.api import search as run

    said: list = []
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            return run(graph, top_k=top_k, rules=rules)
    finally:  # under the caller's filters again
        level = _user_level()
        for w in said:
            warnings.warn(w.message, stacklevel=level)


def refuse_what_eager_refuses(graph: Graph) -> None:
    """CompileFailure where the graph as written fails in the reference interpreter at
    the candidate check's small binding whatever its integer inputs hold: a bool
    subtraction or an integer silu that torch's meta functions let through and its
    kernels refuse. Compiled, it would return values where eager raises; run eagerly,
    the call raises eager's error. Integer inputs all 0, then all 1: an error that
    depends on them (a division by 0, an index past a short axis) is the data's, and
    the program compiles; so is any index out of range, which may come of the binding's
    sizes alone (two CSR lengths drawn independently, one request id indexing past the
    other's indptr: a ragged prefill ran eagerly for good). Imported with the search, on
    a cache miss only."""
    from ..search.validate import CHECK_BUDGET, NoSmallBinding, inputs_for, interpretation_cost, small_binding

    try:
        env = small_binding(graph, graph)
    except NoSmallBinding:  # the search says why, and checks at the user's shapes
        return
    if interpretation_cost(graph, env) > CHECK_BUDGET:
        return
    inputs = inputs_for(graph, env, seed=0)
    errors = []
    for fill in (0, 1):
        try:
            interpret(graph, {k: v if v.is_floating_point() else torch.full_like(v, fill) for k, v in inputs.items()},
                      env=env)
            return
        except IndexError:  # an index past an axis: the sizes' or the data's, not the ops'
            return
        except (RuntimeError, NotImplementedError) as err:  # what torch's kernels raise
            if "out of bounds" in str(err):  # torch.gather's index past its axis, as above
                return
            errors.append(err)
    raise CompileFailure(f"the graph as written fails in the reference interpreter ({_reason(errors[0])})") \
        from errors[0]


def _picks_key(key: str) -> str:
    return f"{key};kernels"


def _picks_entry(key: str, picks: list | None, tuning: dict) -> dict[str, list]:
    """The tuning entry holding a bucket's per-kernel picks: none when no mix paid, or an
    empty one where the bucket, timed again, had picks before."""
    return {_picks_key(key): list(picks or [])} if picks or _picks_key(key) in tuning else {}


def _fitting(plans: list[Plan], env: dict[str, int]) -> list[int]:
    """Indices of the plans whose requirements hold at env."""
    return [i for i, p in enumerate(plans) if p.fits({**env, **p.split}) is None]


def _capturing(device: torch.device) -> bool:
    """Whether the current CUDA stream is capturing a graph (never off the GPU)."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _progress(line: str) -> None:
    """Long first-call work (compiling every plan, timing a bucket) says what it does."""
    progress.report(line)


def _has_gluon(plan: Plan) -> bool:
    return any(k.dialect == "gluon" for k in plan.kernels)


# How far a Gluon kernel's output may stray from its `tl` twin's (relative L2 norm): both
# round P to 16 bits and sum in f32, in different orders. An output in f32 or wider: 1e-4.
GLUON_TOLERANCE_16BIT = 1e-2
GLUON_TOLERANCE = 1e-4


def _gluon_mismatch(plan: Plan, device, inputs: dict | None = None) -> str | None:
    """Why plan's Gluon kernels may not serve, or None: its outputs, into buffers
    poisoned with NaN, against its `tl` twins' on `inputs` (by default fresh random ones
    at the binding it was ranked at). Issue 13: warp specialisation only where a check
    passes at that exact launch configuration; one returned NaN on the H200."""
    twin = replace(plan, kernels=[k.fallback or k for k in plan.kernels])
    if inputs is None:
        inputs = _scratch(plan, device, random=True)
    want = launch(twin, inputs)
    got = launch(plan, inputs, out=[torch.full_like(w, float("nan")) if w.is_floating_point() else torch.full_like(w, -1)
                                    for w in want])
    for b, w, g in zip(plan.outputs, want, got):
        if not w.is_floating_point():
            if not torch.equal(w, g):
                return f"its Gluon kernels' {b.name} differs from the tl kernels'"
            continue
        if not torch.equal(w.isnan(), g.isnan()):
            return f"its Gluon kernels' {b.name} is NaN where the tl kernels' is not, or the reverse"
        w64, g64 = (torch.nan_to_num(x.double(), nan=0.0) for x in (w, g))
        error = ((g64 - w64).norm() / w64.norm().clamp_min(1e-30)).item()
        if error > (GLUON_TOLERANCE_16BIT if w.dtype.itemsize == 2 else GLUON_TOLERANCE):
            return f"its Gluon kernels' {b.name} differs from the tl kernels' by {error:.1e} (relative L2)"
    return None


def _scratch(plan: Plan, device, random: bool = False) -> dict[str, torch.Tensor]:
    """Inputs at the binding the plan was ranked at (where it fits): zeros, or with
    `random` normal floats (seeded) and zero integers."""
    generator = torch.Generator(device=device).manual_seed(0) if random else None
    out = {}
    for b in plan.inputs:
        shape, dtype = [evaluate(d, plan.env) for d in b.shape], TORCH_DTYPES[ir_dtype(b.dtype)]
        out[b.name] = torch.randn(shape, generator=generator, device=device).to(dtype) \
            if random and dtype.is_floating_point else torch.zeros(shape, dtype=dtype, device=device)
    return out


def _symbol_locations(graph: Graph) -> dict[str, tuple[str, int]] | None:
    """symbol -> (input, axis) where an input dim is exactly that symbol; None when some
    symbol appears only inside expressions."""
    where: dict[str, tuple[str, int]] = {}
    for name, node in graph.inputs.items():
        for axis, d in enumerate(node.shape):
            if isinstance(d, sympy.Symbol):
                where.setdefault(d.name, (name, axis))
    return where if {s.name for s in graph.symbols()} <= set(where) else None


def _no_gpu_nor_interpreter(inputs: dict[str, torch.Tensor]) -> bool:
    """CPU tensors with Triton's interpreter off: Triton finds no driver to launch on."""
    return not knobs.runtime.interpret and all(t.device.type == "cpu" for t in inputs.values())


def _device_fault(err: BaseException) -> bool:
    """An error of the GPU itself (an illegal address, a launch failure), after which the
    CUDA context runs nothing: not a kernel that failed to compile."""
    accelerator = getattr(torch, "AcceleratorError", ())
    return isinstance(err, accelerator) or "CUDA error" in str(err)


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:400]


def _candidate_to_json(c: Candidate) -> dict:
    return {"graph": c.graph.text(), "facts": [f.to_json() for f in c.facts],
            "derivation": list(c.derivation), "cost": str(c.cost)}


def _candidate_from_json(d: dict) -> Candidate:
    graph = parse_graph(d["graph"])
    # the cost is over the graph's dims: a dim named N, S or I is not sympy's N, S, I
    cost = sympy.sympify(d["cost"], locals={s.name: s for s in graph.symbols()})
    return Candidate(graph, [Separable.from_json(f) for f in d["facts"]], list(d["derivation"]), cost)


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)
