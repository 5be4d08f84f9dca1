"""`schedule`: bind, partition, tile, generate and rank plans for one candidate."""
from __future__ import annotations

import itertools
import math
import numbers
import threading
from collections.abc import Iterable, Mapping

from cleave import passes
from cleave.ir import BindingError, Candidate, DType, Graph, ShapeError
from cleave.ir import dims as D
from cleave.ir.graph import rebuild
from cleave.ir.ops import UNARY

from . import gluon, row_halves, scale_after
from .codegen import VIEW_OPS, Emitter, fact_table
from .combine import fuse_combines
from .cost import kernel_time, misfit, resident_programs
from .exprs import code, evaluate
from .partition import KernelSpec, Store, partition, stored_dtype
from .plan import Buffer, Kernel, Plan
from .target import H200, Target
from .tiles import aliases, enumerate_tilings, launch_options, remap
from .unsplit import unsplit


def split_symbols(graph: Graph) -> list[str]:
    return sorted(s.name for s in graph.split_counts())


def fuse_labels(spec: KernelSpec, t) -> KernelSpec:
    """spec with the labels that tiling t lets share an index variable aliased
    (tiles.aliases): loop labels of one axis then share one loop."""
    alias = aliases(spec.views, t)
    views = remap(spec.views, alias)
    subs = {views.labels[a].sym: views.labels[b].sym for a, b in alias.items()}
    stores = [Store(r, s.buffer, tuple(e.xreplace(subs) for e in s.view), s.node)
              for s, r in zip(spec.stores, views.roots)]
    return KernelSpec(spec.name, views, stores, spec.root_labels)


def _compile(spec: KernelSpec, t, facts, env, dynamic, symbols, target):
    spec = fuse_labels(spec, t)
    with passes.timed("codegen"):
        em = Emitter(spec, t, facts, env, dynamic, target=target)
        source, bufs, grid = em.program(spec.name, symbols, dynamic)
    return spec, em.stats, evaluate(grid[0], env), source, bufs, grid, em.descriptor_args(), em.persistent


def _tiled(spec, env, dynamic, target, relaxed: bool = False):
    """(spec, tiling) of each tiling to cost: each enumerated one and its twin with a loop
    step's scaled q·Kᵀ scaled after the dot (scale_after.py), then the same with two row
    tiles per program where a loop chains two MatMuls (row_halves.py), as its twin."""
    for t in enumerate_tilings(spec.views, spec.root_labels, env, dynamic, target, relaxed=relaxed):
        yield spec, t
        twin = scale_after.option(spec, t)
        if twin is not None:
            yield twin
        for halves in row_halves.options(spec, t):
            # Two row tiles hold two q tiles: scaled in registers they spilled (58
            # registers a thread, causal), and the twin ran faster wherever both ran
            # (full 2.01 against 2.22 ms, causal 1.34 against 1.64, window 0.72
            # against 1.02; RESULTS.md 2026-12-03), so it alone is offered.
            yield scale_after.option(*halves) or halves


def _kernel_options(spec, facts, env, dynamic, symbols, target, relaxed: bool = False):
    found, errors = _options(spec, facts, env, dynamic, symbols, target, relaxed)
    if not found:
        more = f"; {len(errors) - 1} other tiling(s) failed too" if len(errors) > 1 else ""
        raise BindingError(f"scheduler: no tiling of kernel {spec.name} fits the target"
                           + (f" ({errors[0]}{more})" if errors else " (no tiling to try)"))
    ranked = _ranked(spec, found, target)
    if target.gluon:
        _note_gluon_origin(ranked, facts, env, dynamic, symbols)
    return ranked


# Kernel options whose Gluon form (scheduler/gluon.py) schedule() may add: (name, source,
# warps, stages) -> what the form is rendered from (the best-ranked option that holds one
# row tile of 64 or more per program, its binding). Per thread: first calls compile on several.
_GLUON = threading.local()


def _note_gluon_origin(ranked: list, facts, env, dynamic, symbols) -> None:
    if getattr(_GLUON, "origins", None) is None:  # options ranked outside schedule()
        return
    first = next((f for f in ranked if not f[3][1].unroll and row_halves.chained_rows(f[3][0].views, f[3][1])), None)
    if first is None:
        return
    origin = (*first[3], facts, dict(env), set(dynamic), list(symbols))
    for f in ranked:
        _GLUON.origins[(f[1].name, f[1].source, f[1].num_warps, f[1].num_stages)] = origin


def _with_gluon_twin(plans: list[Plan]) -> list[Plan]:
    """plans, and after them the first with each kernel that has a Gluon form in that
    form (the same partition: the runtime's tuning may take either kernel for a slot).
    The model does not cost its schedule (warp specialisation, ping-pong), so it is not
    ranked: the runtime profiles it where Gluon runs, after checking its output."""
    gluon.last_refusal = "no kernel of the first plan chains two MatMuls in a loop over row tiles of 64 or more"
    if not plans:
        return plans
    kernels, changed = [], False
    for k in plans[0].kernels:
        origin = _GLUON.origins.get((k.name, k.source, k.num_warps, k.num_stages))
        twin = None
        if origin is not None:
            with passes.timed("codegen"):
                twin = gluon.variant(*origin, k)
        kernels.append(twin or k)
        changed |= twin is not None
    if not changed:
        return plans
    first = plans[0]
    return plans + [Plan(first.graph, kernels, first.inputs, first.outputs, first.intermediates, dict(first.split),
                         dict(first.tiles), first.cost, list(first.dynamic), dict(first.env), list(first.requires))]


def _options(spec, facts, env, dynamic, symbols, target, relaxed: bool):
    """(cost, kernel, tiles, (spec, tiling), stats) of every tiling that compiles and
    launches, and the errors of those that do not."""
    found, errors = [], []
    for option, t in _tiled(spec, env, dynamic, target, relaxed):
        try:
            emitted, stats, programs, source, bufs, grid, descs, persistent = _compile(option, t, facts, env, dynamic,
                                                                                       symbols, target)
        except (BindingError, ValueError) as err:
            errors.append(str(err))
            continue
        tiles = {f"X{i}": b for i, b in t.block.items()} | {f"X{i}.rows": r for i, r in t.step.items()} | \
            {f"X{i}.tiles": u for i, u in t.unroll.items()} | ({"scale_after": 1} if t.scale_after else {})
        # A dot beside a reduction of a value no dot computed, pipelined at 8 warps, returned
        # 8e-2 to 0.27 relative error on the H200 (triton 3.6; RMSNorm->MatMul's fused plan,
        # RESULTS.md 2026-12-02 session 12); 4 warps, or one stage, were exact.
        limit = 4 if stats.side_reduction else 0
        misfits, before = [], len(found)
        for warps, stages in launch_options(t, stats.stage_choices):
            seconds = kernel_time(stats, programs, warps, stages, target)
            if seconds is None:
                misfits.append((-warps, stages, misfit(stats, warps, stages, target)))
            else:
                args = bufs + [d[0] for d in descs] + symbols
                per_sm = resident_programs(stats, warps, stages, target) if persistent else 0
                kernel = Kernel(spec.name, source, grid, args, warps, stages, descs, per_sm, loops=stats.loops,
                                max_pipelined_warps=limit, pipelined=stats.pipelined, stage_choices=stats.stage_choices)
                if kernel.launches(warps, stages):
                    found.append((seconds, kernel, tiles, (emitted, t), stats))
        if misfits and len(found) == before:
            # the launch that comes closest (most warps, fewest stages) names the budget it is over
            errors.append(f"{min(misfits)[2]}, tiled {_tiles_text(tiles)}")
    return found, errors


def _tiles_text(tiles: dict, shown: int = 6) -> str:
    """A tiling's blocks, as `X0=64, X1=16, ...`: the first few (a kernel of 32 chunks has
    a label for each chunk's contraction)."""
    items = [f"{k}={v}" for k, v in tiles.items()]
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")


def _ranked(spec, found, target):
    # Options the model costs the same (a GEMM's K step changes neither its bytes nor its
    # MMA work) rank the longer loop step first: each step waits on its barrier and its
    # MMAs, and Qwen3's down projection (K = 25600) took 10-23% less time in 64-wide steps
    # than in the 32-wide ones its tie had put first (RESULTS.md, session 18).
    found.sort(key=lambda f: (f[0], -_loop_step(f[3][1])))
    # Distinct tilings first, then each tiling's best with another warp count, then the
    # rest: the GPU profiles the top-k, and the model cannot rank warp counts well.
    tiers, seen = ([], [], []), (set(), set())
    for f in found:
        tiling = tuple(sorted(f[2].items()))
        warps = (tiling, f[1].num_warps)
        tiers[0 if tiling not in seen[0] else 1 if warps not in seen[1] else 2].append(f)
        seen[0].add(tiling)
        seen[1].add(warps)
    ranked = tiers[0] + tiers[1] + tiers[2]
    if row_halves.chained_rows(spec.views, found[0][3][1]):
        _keep_coresident(ranked, target)
    # All are returned: plans take the first top_k, a combine run by its partial kernel
    # the first whose tiles fit the partial's (combine.py)
    return ranked


def _loop_step(t) -> int:
    """Elements a tiling's loops advance per step, over all its loop labels."""
    return math.prod(t.block[lid] for lid, role in t.role.items() if role == "loop")


# Where a loop step chains two MatMuls with a softmax between them (attention), the
# model costs the MMAs but not the softmax's exp and vector work, nor how programs
# sharing an SM overlap one's softmax with another's MMAs (FlashAttention-3's
# ping-pong across warpgroups). It ranked a sliding window's 64 x 64 tile at 4 warps,
# two programs per SM, 11th, 30% behind one 128 x 128 tile per SM; on the H200 it ran
# 12% faster (RESULTS.md 2026-12-03). So the option at this rank is the model's best
# pipelined one with two or more programs per SM, when none ranked above it has them:
# the runtime's profiling decides. The second: a layer's plans (two bindings zipped,
# `_interleave`) hold only its kernels' first two ranks, and Qwen3's attention lost the
# option at the fourth (session 18).
CORESIDENT_RANK = 1


def _keep_coresident(ranked: list, target) -> None:
    def shared(f) -> bool:  # pipelined: one stage leaves each step waiting on its loads
        return f[1].num_stages >= 2 and resident_programs(f[4], f[1].num_warps, f[1].num_stages, target) >= 2

    if len(ranked) <= CORESIDENT_RANK or any(shared(f) for f in ranked[:CORESIDENT_RANK + 1]):
        return
    best = next((i for i, f in enumerate(ranked) if shared(f)), None)
    if best is not None:
        ranked.insert(CORESIDENT_RANK, ranked.pop(best))


# Split counts kept for a split over a dynamic extent: the plans must serve every
# length, so the runtime picks the count per shape bucket from these (profiling).
# Each count keeps top_k plans, at most PLANS_PER_DYNAMIC_SPLIT: every plan kept is a
# Triton compile on the first call (about 2.4 s each for the paged decode on the H200).
DYNAMIC_SPLITS = (1, 2, 4, 8, 16, 32)
PLANS_PER_DYNAMIC_SPLIT = 6


def dynamic_split_counts(splits, dynamic_splits) -> list[dict[str, int]]:
    """The split counts a dynamic operator keeps plans for: each count of DYNAMIC_SPLITS
    for one dynamic split at a time, the other splits at 1. Several dynamic splits (the
    paged prefill splits its kv axis and the sum that counts segment ids) in a cross
    product made 36 counts, 72 plans, over three minutes of Triton compiles on the H200
    before the first step ran."""
    ladders = [DYNAMIC_SPLITS if s in dynamic_splits else (1,) for s in splits]
    return [dict(zip(splits, c)) for c in itertools.product(*ladders) if sum(v > 1 for v in c) <= 1]


def _split_node(graph, sym):
    """The split whose count is symbol `sym`, or None."""
    return next((node for node in graph.live_nodes()
                 if node.op == "split" and sym in {s.name for s in node.attrs["count"].free_symbols}), None)


def _split_extent(graph, sym):
    split = _split_node(graph, sym)
    return split.inputs[0].shape[split.attrs["axis"]] if split is not None else None


def _representative(graph, env, counts: dict, dynamic) -> dict:
    """env with the dynamic extents of the splits doubled until the largest counts
    give chunks of at least 64 (a kv tile each, none empty): only where the plans
    are ranked and tiled, they serve every shape."""
    env = dict(env)
    grow = {s.name for sym in counts for s in _split_extent(graph, sym).free_symbols} & set(dynamic)
    for _ in range(32):
        full = {**env, **counts}
        if all(D.evaluate(_split_extent(graph, sym), full) >= 64 * c for sym, c in counts.items()) \
                and _holds(graph, full):
            return env
        env.update({s: env[s] * 2 for s in grow})
    return env


def _split_candidates(graph, env, sym, base_programs, target) -> list[int]:
    """s = 1 and the counts that give about k * SMs programs (k = 1..8) with the
    programs of the unsplit kernel: memory-bound decode needs every SM streaming,
    and several programs per SM hide the latency of each one's loads. Up to k = 32:
    over a packed ragged extent most (row tile, chunk) programs find no page of their
    requests, so T row tiles and s chunks make only T + s - 1 programs that work."""
    n = D.evaluate(_split_extent(graph, sym), env)
    # 2 and 4 always: the unsplit kernel may tile rows differently (a merged head axis
    # in blocks of one), so its program count can overstate the parallelism it has.
    out = {1}
    for c in [2, 4] + [math.ceil(k * target.sms / max(base_programs, 1)) for k in (1, 2, 3, 4, 6, 8, 16, 32)]:
        c = _aligned_count(graph, sym, n, c)
        if 1 < c <= max(1, n // 64) and _holds(graph, {**env, sym: c}):  # chunks of 64+ keep a kv tile busy
            out.add(c)
    return sorted(out)


def _aligned_count(graph, sym, n: int, c: int) -> int:
    """c, or the least count up to 2c whose chunks start 16 bytes apart where the split
    cuts a tensor's contiguous axis: every chunk but the first starts where its loads
    align, or they narrow to the alignment (x·(W·1) split 33 ways over K, chunks of 125
    bf16: 2-byte loads; 9 ways over N, 456: 16-byte ones)."""
    split = _split_node(graph, sym)
    source = split.inputs[0]
    while source.op == "cast" or source.op in UNARY:  # elementwise: the loads keep the input's layout
        source = source.inputs[0]
    # an input is row-major; a view's or a computed value's last axis need not be contiguous
    # in memory (split-KV cuts Kᵀ's last axis, whose keys lie d elements apart)
    if source.op != "input" or split.attrs["axis"] != len(source.shape) - 1:
        return c
    lanes = max(1, 16 // source.dtype.itemsize)
    return next((a for a in range(c, 2 * c + 1) if -(-n // a) % lanes == 0), c)


def _holds(graph, env) -> bool:
    """The graph's constraints hold at env (a split count leaves no chunk empty)."""
    try:
        graph.check(env)
        return True
    except BindingError:
        return False


def schedule(candidate: Candidate | Graph, shapes: dict[str, int], dynamic=(), top_k: int = 4,
             target=H200, split: dict[str, int] | None = None) -> list[Plan]:
    """Ranked plans (best first) for a candidate at a binding of its symbols. Symbols
    in `dynamic` stay runtime arguments (one compile serves all their values); split
    counts are chosen here unless `split` fixes them. A split over a dynamic extent
    keeps the best plans of every count in DYNAMIC_SPLITS (more than top_k in all): which
    count is fastest depends on the shape, and the runtime profiles them per bucket
    (top_k plans of each count, at most PLANS_PER_DYNAMIC_SPLIT).
    Plans over dynamic extents are ranked at `shapes` and also with the reduced ones
    long (`_long`, without a split) and the batch-like ones wide (`_wide`), and the
    rankings interleaved. Where the first plan has kernels with a Gluon form, a plan of
    those forms follows the ranked ones (`_with_gluon_twin`)."""
    _GLUON.origins = {}
    try:
        plans = _schedule(candidate, shapes, dynamic, top_k, target, split)
        if isinstance(candidate, Candidate) and candidate.derivation:
            _hold_reductions_nonempty(plans, candidate.graph)
        return _with_gluon_twin(plans) if target.gluon else plans
    finally:
        _GLUON.origins = {}


def _hold_reductions_nonempty(plans: list[Plan], graph: Graph) -> None:
    """A rewritten candidate's plans serve non-empty reductions only: its rules hold
    there (a max over nothing is -inf, and sigmoid(-inf) = 0 is no sigmoid's max), and
    sizes divided by that are not 0; the graph as written serves an empty one (the
    runtime schedules it for such a call)."""
    extents = sorted(graph.nonempty_symbols(), key=lambda s: s.name)
    why = "a rewritten candidate's reductions and sizes (schedule the graph as written for an empty one)"
    for plan in plans:
        plan.requires += [(f"1 <= {s.name}", why) for s in extents if s.name not in plan.split]


def _schedule(candidate, shapes, dynamic, top_k, target, split) -> list[Plan]:
    if isinstance(candidate, Graph):
        candidate = Candidate(candidate)
    if not isinstance(candidate, Candidate):
        raise TypeError(f"schedule: candidate must be a cleave Graph or a search Candidate "
                        f"(cleave.search(graph).best), got {type(candidate).__name__} {candidate!r:.80}")
    _check_arguments(candidate.graph, shapes, dynamic, top_k, split)
    if not isinstance(target, Target):
        raise TypeError(f"schedule: target must be a cleave Target (cleave.scheduler.H200, or one made with "
                        f"dataclasses.replace), got {type(target).__name__} {target!r:.40}")
    graph = rebuild(candidate.graph)
    if graph.text() != candidate.graph.text():
        raise BindingError("scheduler: the candidate graph is not renumbered (pass ir.rebuild(graph)); "
                           "fact node ids would not match")
    _check_contractions(graph)
    facts = fact_table(candidate.facts)
    dynamic = set(dynamic)
    splits = split_symbols(graph)
    # The plans serve every value of a dynamic symbol; one that is 0 here (a first call
    # with an empty batch) is ranked at 1 instead, where the kernels have programs to cost.
    env = {s: 1 if s in dynamic and v == 0 else v for s, v in shapes.items()}
    # ... or at the least extent the graph's constraints allow there: a traced `n != 1`
    # (`if x.shape[0] == 1:`) made 1 fail them, and the call at 0 ran eagerly.
    zeroed = [s for s, v in shapes.items() if s in dynamic and v == 0]
    if zeroed and not _holds(graph, env):
        env = next((e for e in ({**env, **{s: v for s in zeroed}} for v in range(2, 65)) if _holds(graph, e)), env)
    missing = [s.name for s in graph.symbols() if s.name not in env and s.name not in splits]
    if missing:
        raise BindingError(f"scheduler: no value for symbol(s) {', '.join(missing)}")
    bad = dynamic & set(splits)
    if bad:
        raise BindingError(f"scheduler: split count(s) {sorted(bad)} cannot be dynamic")
    symbols = sorted(s.name for s in graph.symbols())
    dynamic_splits = [s for s in splits if {x.name for x in _split_extent(graph, s).free_symbols} & dynamic]
    if split:
        grid_choices = [dict(split)]
    elif dynamic_splits:
        grid_choices = dynamic_split_counts(splits, dynamic_splits)
        env = _representative(graph, env, {s: max(DYNAMIC_SPLITS) for s in dynamic_splits}, dynamic)
        wide = _wide(graph, env, dynamic, target)
        per_count = min(top_k, PLANS_PER_DYNAMIC_SPLIT)
        per_split = [_rankings(graph, facts, [{**env, **sc}] + ([{**wide, **sc}] if wide else []), dynamic,
                               symbols, target, per_count, sc) for sc in grid_choices]
        # A split count whose best plan the model costs past reach at the representative
        # binding is left out: a split gains at most its count elsewhere (the paged
        # prefill's split-KV plans, 1-5 s there against 0.17 ms, were 180 of its 216).
        best = min((r[0][0].cost for r in per_split if r[0]), default=0.0)
        reach = HOPELESS * max(DYNAMIC_SPLITS)
        options = []
        for ranked in per_split:
            if best > 0 and ranked[0] and ranked[0][0].cost > reach * best:
                continue
            options += _interleave(ranked, per_count)
        return lead_with_each_split(_by_cost(options), max(top_k, len(options)))
    elif splits:
        base = _schedule_at(graph, facts, {**env, **{s: 1 for s in splits}}, dynamic, symbols, target, 1)
        programs = _programs(base[0]) if base else 1
        grid_choices = [dict(zip(splits, c)) for c in itertools.product(
            *(_split_candidates(graph, env, s, programs, target) for s in splits))]
    else:
        extra = [at for at in (_long(graph, env, dynamic), _wide(graph, env, dynamic, target)) if at]
        if extra:
            return _interleave(_rankings(graph, facts, [env] + extra, dynamic, symbols, target, top_k), top_k)
        grid_choices = [{}]
    options = []
    for sc in grid_choices:
        # At count 1 the splits as the reshapes they are (unsplit.py) first, where a cost
        # ties: its operands may take TMA. The split as written stays on offer: its
        # views can share a tile between two reads the reshape's do not (MLA decode's
        # latent, loaded once per key step for both dots).
        ones = unsplit(graph, sc) if sc and all(v == 1 for v in sc.values()) else None
        if ones is not None:
            options += _schedule_at(ones, facts, {**env, **sc}, dynamic, sorted(s.name for s in ones.symbols()),
                                    target, top_k, sc)
        options += _schedule_at(graph, facts, {**env, **sc}, dynamic, symbols, target, top_k, sc)
    return lead_with_each_split(within_reach(_by_cost(options)), top_k)


def _check_arguments(graph: Graph, shapes, dynamic, top_k, split) -> None:
    """A caller's mistake said in one line naming the argument, as cleave.search does: not
    an empty list (top_k 0), plans for a negative extent, or a TypeError deep in tiling."""
    if not _is_int(top_k) or top_k < 1:
        raise ValueError(f"schedule: top_k must be a positive integer, got {top_k!r}")
    if not graph.outputs:  # a plan of no kernels: nothing to run or rank
        raise BindingError(f"schedule: graph {graph.name!r} has no outputs (give it some with graph.output(...))")
    if not isinstance(shapes, Mapping):
        raise BindingError(f"schedule: shapes must be a dict {{symbol: extent}}, got {shapes!r}")
    for name, value in shapes.items():
        if not _is_int(value) or value < 0:  # 0 is an empty axis, which plans serve
            raise BindingError(f"schedule: shapes[{name!r}] must be an integer >= 0, got {value!r}")
    # a string is a collection of letters: set("zz") would name the symbol z
    if isinstance(dynamic, str) or not isinstance(dynamic, Iterable):
        raise BindingError(f"schedule: dynamic must be a collection of symbol names, got {dynamic!r}")
    # a name bound in shapes may stay dynamic though the graph lost it (len_indptr, batch_size + 1 there)
    _check_names("dynamic", dynamic, [s.name for s in graph.symbols()] + list(shapes), "symbols or names in shapes")
    counts = [name for name in shapes if name in set(split_symbols(graph))]
    if counts:  # else dropped: the plans split as the scheduler chose, another function of c
        raise BindingError(f"schedule: shapes binds {', '.join(counts)}, a split count of the graph: fix it with "
                           f"split={{{counts[0]!r}: ...}}, or leave it out for the scheduler to choose")
    if split is not None:
        if not isinstance(split, Mapping):
            raise BindingError(f"schedule: split must be a dict {{split count: value}}, got {split!r}")
        _check_names("split", split, split_symbols(graph), "split counts")
        for name, count in split.items():
            if not _is_int(count) or count < 1:
                raise BindingError(f"schedule: split[{name!r}] must be a positive integer, got {count!r}")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # True is an int to Python


def _check_names(argument: str, names, known: list[str], kind: str) -> None:
    """Each of `names` one of `known`: a misspelt symbol would be ignored silently."""
    for name in names:
        if name not in known:
            raise BindingError(f"schedule: {argument} names {name!r}, which is not one of the graph's {kind} "
                               f"({', '.join(sorted(set(known))) or 'it has none'})")


# Ranked at the binding they serve, plans the model costs this many times the best
# are not worth a profile: the paged prefill's split plans, costed at ~1 s against
# 0.19 ms, took 18 s a call on the H200.
HOPELESS = 20.0


def within_reach(ranked: list[Plan]) -> list[Plan]:
    """The plans of `ranked` (best first) that the model costs within HOPELESS times
    the best. Plans that serve a dynamic extent are ranked at one representative
    binding, where a split count can be far off and the best elsewhere: they are cut
    by split count, with room for the count's gain (`schedule`)."""
    if not ranked or ranked[0].cost <= 0:
        return ranked
    return [p for p in ranked if p.cost <= HOPELESS * ranked[0].cost]


def _rankings(graph, facts, envs, dynamic, symbols, target, top_k, split=None) -> list[list[Plan]]:
    """Plans ranked at each binding. Kernels serve every value of the dynamic symbols,
    and which tiles are fastest depends on those values: a short and a long reduced
    extent, a few rows and many. Bindings after the first where nothing fits (a whole
    row in registers at a long s) are skipped."""
    out = [_schedule_at(graph, facts, envs[0], dynamic, symbols, target, top_k, split)]
    for at in envs[1:]:
        try:
            out.append(_schedule_at(graph, facts, at, dynamic, symbols, target, top_k, split))
        except BindingError:
            pass
    return out


def _by_cost(options: list[Plan]) -> list[Plan]:
    """Costs within 2% are a tie at the model's resolution: prefer more parallel programs.
    A plan whose outputs are all empty (a static extent 0) launches nothing: it costs 0."""
    def tier(cost):
        return math.floor(math.log(cost) / math.log(1.02)) if cost > 0 else -math.inf

    return sorted(options, key=lambda p: (tier(p.cost), -_programs(p)))


def _long(graph, env, dynamic) -> dict | None:
    """env with the dynamic extents that a reduce runs over raised to 4096 (a long
    prompt), or None when there are none: the plans serve every length, and tiles
    ranked only at a short first shape would be small for the long ones."""
    reduced = {s.name for s in graph.reduced_symbols()} & set(dynamic)
    if not reduced or all(env[s] >= 4096 for s in reduced):
        return None
    return {**env, **{s: max(env[s], 4096) for s in reduced}}


# Output rows (elements over the last dim) at which programs fill every SM several
# times over: there occupancy (shared memory per stage, warps) decides the rate, while
# at a few programs per SM the deepest pipeline does.
WIDE_ROWS_PER_SM = 16


def _wide(graph, env, dynamic, target) -> dict | None:
    """env with the dynamic extents of the outputs that no reduce runs over (decode's
    batch) doubled until the outputs have WIDE_ROWS_PER_SM rows per SM, or None when
    there are none or they already do: a serving batch grows, and tiles ranked only at
    a small first batch would be sized for a half-empty GPU."""
    grid = {s.name for o in graph.outputs for d in o.shape[:-1] for s in D.dim(d).free_symbols}
    grid = (grid & set(dynamic)) - {s.name for s in graph.reduced_symbols()}

    def rows(at):
        return sum(math.prod(D.evaluate(d, at) for d in o.shape[:-1]) for o in graph.outputs)

    if not grid:
        return None
    wide = dict(env)
    for _ in range(32):
        if rows(wide) >= WIDE_ROWS_PER_SM * target.sms:
            return wide if wide != env else None
        wide.update({s: max(wide[s], 1) * 2 for s in grid})
    return None


def _check_contractions(graph: Graph) -> None:
    refusal = rounding_refusal(graph)
    if refusal:
        raise ShapeError(refusal)


def rounding_refusal(graph: Graph) -> str | None:
    """Why the kernels cannot compute `graph` exactly, or None. They compute floats in f32
    and contract in f32 (a tl.dot, or products summed in f32): a value computed in f64
    would come back at f32's 1e-7, a MatMul on integers rounded past 2**24. The op named
    is the first that computes: a view before it (a transposed f64 weight) only passes
    values on."""
    cast_up = _cast_up_from_inputs(graph)
    found = []
    for n in graph.live_nodes():
        if n.op != "matmul":
            if _rounds_f64(n, cast_up):
                found.append((n, f"scheduler: {n.op} %{n.id} computes in float64" + (f" (at {n.loc})" if n.loc else "")
                              + ": the kernels compute floats in f32, which would round it; compute it eagerly"))
            continue
        inexact = [str(x.dtype) for x in (n, *n.inputs) if x.dtype == DType.f64 or not x.dtype.is_float]
        if inexact:
            found.append((n, f"scheduler: matmul %{n.id} on {inexact[0]}" + (f" (at {n.loc})" if n.loc else "")
                          + ": the kernels contract in f32, which would round it; compute it eagerly"))
    computing = [why for n, why in found if n.op not in VIEW_OPS]
    return (computing or [why for _, why in found] or [None])[0]


def _rounds_f64(n, cast_up: set[int]) -> bool:
    """Whether the kernels' f32 would round what n computes in float64. An input is read
    and a 0-d cast widens exactly. 0-d arithmetic of sizes, constants and 0-d f64 inputs
    (a float argument under dynamic=True) is taken as a Python number's; that of an
    input's value cast up (`x.sum().double() * 1.1`) is not."""
    if n.dtype != DType.f64 or n.op == "input":
        return False
    if n.rank or any(x.rank for x in n.inputs):
        return True
    return n.op != "cast" and n.id in cast_up


def _cast_up_from_inputs(graph: Graph) -> set[int]:
    """Ids of the nodes computed from a cast to f64 of a value read from the inputs."""
    reads: set[int] = set()
    out: set[int] = set()
    for n in graph.live_nodes():
        if n.op == "input" or any(x.id in reads for x in n.inputs):
            reads.add(n.id)
        widened = n.op == "cast" and n.dtype == DType.f64 and n.inputs[0].dtype != DType.f64
        if (widened and n.inputs[0].id in reads) or any(x.id in out for x in n.inputs):
            out.add(n.id)
    return out


def _interleave(rankings: list[list[Plan]], top_k: int) -> list[Plan]:
    """Alternately the next plan of each ranking, skipping kernels already taken."""
    out, seen = [], set()
    for pair in itertools.zip_longest(*rankings):
        for p in pair:
            key = tuple((k.source, k.num_warps, k.num_stages) for k in p.kernels) if p else None
            if p is not None and key not in seen:
                seen.add(key)
                out.append(p)
    return out[:top_k]


# The unsplit plan is profiled beside the split ones where the model costs it within this
# factor of the best: a split's gain is its least sure estimate. RMSNorm->MatMul at 16 rows
# costed four split-K plans at 0.70-0.80x the unsplit one, which then ran 1.18-1.82x faster
# than each of them on an H100 (RESULTS.md, session 52).
UNSPLIT_REACH = 1.5


def lead_with_each_split(ranked: list[Plan], top_k: int) -> list[Plan]:
    """The best plan of each split count first (in rank order), then the rest: profiling
    on the GPU then chooses among split counts, where the cost model is least sure. The
    best unsplit plan (every count 1) is among them where it is within UNSPLIT_REACH of
    the best, in place of the last."""
    seen, firsts, rest = set(), [], []
    for p in ranked:
        key = tuple(sorted(p.split.items()))
        (rest if key in seen else firsts).append(p)
        seen.add(key)
    kept = (firsts + rest)[:top_k]
    unsplit = next((p for p in firsts if p.split and all(v == 1 for v in p.split.values())), None)
    if unsplit is not None and unsplit not in kept and top_k > 1 and unsplit.cost <= UNSPLIT_REACH * ranked[0].cost:
        kept[-1] = unsplit
    return kept


def _programs(plan: Plan) -> int:
    return max(evaluate(k.grid[0], plan.env) for k in plan.kernels)


def _partition(graph, facts, env, dynamic, symbols, target, relaxed: bool, split_fusions: bool = False):
    """The kernels and their options; `relaxed` (tiles.choices) also offers tiles of the
    labels a block holds whole by default: a 131-token attention's scores (256 x 256 in
    one tile) fitted no kernel of any partition, and the layer ran eagerly.
    `split_fusions` (partition) splits a horizontal fusion that fits no tiling."""
    return partition(graph, env, lambda s: _kernel_options(s, facts, env, dynamic, symbols, target, relaxed),
                     long_extent=target.full_matmul, dynamic=dynamic, target=target,
                     hold_extent=target.hold_matmul, split_fusions=split_fusions)


def _schedule_at(graph, facts, env, dynamic, symbols, target, top_k, split=None) -> list[Plan]:
    graph.check(env)
    try:
        kernels = _partition(graph, facts, env, dynamic, symbols, target, relaxed=False)
    except (BindingError, ShapeError):  # every partition failed: tile what is held whole by default,
        # and split the fusions that still fit no tiling (32 chunks' logits). Splitting happens only
        # where the relaxed partition would raise, so one pass does both.
        kernels = _partition(graph, facts, env, dynamic, symbols, target, relaxed=True, split_fusions=True)
    specs, every = [s for s, _ in kernels], [options for _, options in kernels]
    per_kernel = [options[:top_k] for options in every]
    plans = []
    for rank in range(top_k):
        chosen = [opts[min(rank, len(opts) - 1)] for opts in per_kernel]
        if rank and all(len(o) <= rank for o in per_kernel):
            break
        chosen, kernels = fuse_combines([[c] + [o for o in opts if o is not c] for c, opts in zip(chosen, every)],
                                        facts, env, dynamic, symbols, target)
        tiles = {}
        for spec, c in zip(specs, chosen):
            tiles.update({f"{spec.name}.{k}": v for k, v in c[2].items()})
        fused = len(chosen) - len(kernels)
        plans.append(_plan(graph, specs, kernels, tiles, sum(c[0] for c in chosen) - fused * target.launch_overhead,
                           env, dynamic, split or {}))
    return plans


def _plan(graph, specs, kernels, tiles, cost, env, dynamic, split) -> Plan:
    def buf(node, name):  # shapes as integer code: launch evaluates them
        return Buffer(name, [code(d) for d in node.shape], str(node.dtype))

    inputs = [buf(n, name) for name, n in graph.inputs.items()]
    outputs = [buf(n, name) for name, n in zip(graph.output_names, graph.outputs)]
    produced = {st.buffer: st.node for spec in specs for st in spec.stores}
    chunks = graph.split_counts()
    inter = [Buffer(name, [code(d) for d in node.shape], str(stored_dtype(node, chunks)))
             for name, node in produced.items() if name not in graph.output_names]
    requires = [(_check_code(c), c.origin) for c in graph.constraints]
    return Plan(graph.text(), kernels, inputs, outputs, inter, dict(split), tiles, cost, sorted(dynamic),
                {k: v for k, v in env.items()}, requires)


def _check_code(c) -> str:
    """A graph constraint as integer code the runtime evaluates (scheduler.exprs)."""
    if c.kind == "divides":
        return f"{code(c.rhs)} % {code(c.lhs)} == 0"
    return f"{code(c.lhs)} {'==' if c.kind == 'eq' else '<='} {code(c.rhs)}"
