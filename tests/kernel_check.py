"""Shared check for generated kernels: launch a plan on fresh random inputs into
NaN-poisoned outputs and compare with the fp64 reference interpreter."""
import collections
import dataclasses
import re

import torch

from cleave import workloads as W
from cleave.interpreter import interpret
from cleave.runtime.launch import launch
from cleave.scheduler import H200

# Holds no reduction whole in a block: every reduction runs as a loop, so tiny test
# shapes exercise iterative tiling, horizontal fusion and the incremental cascade.
LOOPS = dataclasses.replace(H200, full_reduce=16, full_matmul=16, hold_matmul=16)


# Small odd bindings of the attention workloads: a last row tile partly past the end
# (two row tiles per program: the second partly or wholly past it), a window shorter
# than the sequence.
ATTENTION_BINDINGS = {
    "mha": {"b": 1, "h": 2, "s": 150, "d": 16},
    "mha_causal": {"b": 1, "h": 2, "s": 211, "d": 16},
    "gqa_causal": {"b": 1, "hkv": 1, "g": 2, "s": 150, "d": 16},
    "mha_window": {"b": 1, "h": 1, "s": 300, "d": 16},
    "mha_alibi": {"b": 1, "h": 2, "s": 150, "d": 16},
    "mha_softcap": {"b": 1, "h": 2, "s": 150, "d": 16},
    "rope_attention_causal": {"b": 1, "h": 1, "s": 150, "d": 16},
}


def assert_one_exact_compile(compiled, fn, calls):
    """compiled(*args) equals eager fn(*args) exactly for every args in `calls`, none of
    them through an eager fallback (which warns), and one compile served them all."""
    import warnings

    for args in calls:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="cleave")
            assert torch.equal(compiled(*args), fn(*args)), [tuple(a.shape) for a in args]
    stats = compiled.stats
    assert stats["compiles"] + stats["from_cache"] == 1 and stats["graph_breaks"] == 0, stats


def computed_kernels(plan) -> int:
    """The kernels a plan computes: a partial kernel that runs its split's combine
    (`Kernel.arrivals`, scheduler/combine.py) counts as the two it stands for."""
    return sum(2 if k.arrivals else 1 for k in plan.kernels)


def tolerance(dtype: torch.dtype) -> float:
    return 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5


def run_and_check(graph, plan, env, seed, reference=None):
    """`reference` (default: `graph`) is the graph whose fp64 value the kernels must match.
    Inputs come from the workload named like the graph, or are random ones."""
    reference = reference or graph
    if graph.name in W.names():
        inputs = W.get(graph.name).inputs(env, seed=seed)
    else:
        inputs = W.random_inputs(graph, env, seed=seed)
    outs = [torch.full(tuple(int(x) for x in r.shape), float("nan"), dtype=r.dtype) if r.dtype.is_floating_point
            else torch.full(tuple(r.shape), -1, dtype=r.dtype)
            for r in interpret(graph, inputs, env=plan.split)]
    got = launch(plan, inputs, out=outs)
    ref = interpret(reference, inputs, compute_dtype=torch.float64, env=plan.split)
    assert all(g is o for g, o in zip(got, outs))
    check_outputs(got, ref, f"{graph.name}: seed {seed}, binding {dict(sorted(env.items()))}")


def check_outputs(got, ref, context: str):
    """Each output against its fp64 reference, in relative L2 error and element-wise
    (max abs error over max |reference|: a wrong ragged tail hides in the L2 norm).
    Non-finite reference elements (a max over nothing is -inf) must be matched exactly."""
    tiny = torch.finfo(torch.float64).tiny  # an all-zero reference (a sum over nothing) is matched exactly
    for i, (g, r) in enumerate(zip(got, ref)):
        where = f"{context}: output {i}"
        assert tuple(g.shape) == tuple(r.shape), f"{where}: shape {tuple(g.shape)}, expected {tuple(r.shape)}"
        if not r.dtype.is_floating_point:
            assert torch.equal(g.to(r.dtype), r), f"{where}: integer output differs"
            continue
        tol = tolerance(g.dtype)
        g = g.double()
        finite = r.isfinite()
        assert torch.allclose(g[~finite], r[~finite], rtol=0, atol=0, equal_nan=True), \
            f"{where}: non-finite elements differ from the reference"
        wrong = g.isnan() & finite
        assert not wrong.any(), f"{where}: NaN at index {wrong.nonzero()[0].tolist()}"
        diff = torch.where(finite, g - r, 0.0)
        r = torch.where(finite, r, 0.0)
        rel_l2 = (diff.norm() / r.norm().clamp_min(tiny)).item()
        assert rel_l2 < tol, f"{where}: relative L2 error {rel_l2:.2e} (tolerance {tol:.0e})"
        if diff.numel():
            worst = torch.unravel_index(diff.abs().argmax(), diff.shape)
            rel_max = (diff.abs().max() / r.abs().max().clamp_min(tiny)).item()
            assert rel_max < tol, (f"{where}: element-wise error {rel_max:.2e} of max |reference| (tolerance "
                                   f"{tol:.0e}) at index {[int(k) for k in worst]}")


def loop_bounds(source: str) -> list[tuple[str, str]]:
    """(start, stop) of every `for` over a loop label's tiles in a kernel's source."""
    return re.findall(r"for start\d+ in range\((\w+), (\w+), \d+\)", source)


def loaded(source: str, buffer: str) -> set[str]:
    """Names of the values a kernel's source loads from `buffer`."""
    return set(re.findall(rf"(v\d+) = tl\.load\({buffer}_ptr", source))


def computed_from(source: str, buffer: str) -> set[str]:
    """Names of the values a kernel's source loads from `buffer` or computes from them
    (a row tile's loaded starts, their least over the tile, a bound searched for it)."""
    names = loaded(source, buffer)
    for name, expr in re.findall(r"^\s*(\w+) = (.*)$", source, re.M):
        if set(re.findall(r"\w+", expr)) & names:
            names.add(name)
    return names


def plan_sources(compiled) -> list[str]:
    """The source of every kernel of every plan a cleave.compile'd function holds."""
    return [k.source for op in compiled.operators for spec in op.specs.values() for plan in spec.plans
            for k in plan.kernels]


def assert_loops_bounded_by(sources, buffer: str, sides=("lo", "hi")):
    """Every loop over tiles in these kernels stops at `hi` bounds (and, with "lo", starts
    at `lo` bounds) computed from values loaded from `buffer`: without the loaded bounds
    the loops run over the whole extent and this fails."""
    looped = [s for s in sources if loop_bounds(s)]
    assert looped, "no kernel loops"
    for source in looped:
        values = computed_from(source, buffer)
        for start, stop in loop_bounds(source):
            assert stop.startswith(("first_hi", "full_hi", "hi")), source
            assert "lo" not in sides or start != "0", source
        for side in sides:
            bound = re.search(rf"^\s*{side}\d+ = (.*)$", source, re.M)
            assert bound and set(re.findall(r"\w+", bound.group(1))) & values, (side, source)


def tiles_visited(plan, inputs: dict, extents, out=None) -> collections.Counter:
    """Launch plan under the interpreter, counting the tiles each program runs in the loops
    whose extent (a kernel's `loops` record) is among `extents`: {(kernel, program): tiles}."""
    import triton.runtime.interpreter as interpreter

    from cleave.runtime.launch import _kernel_fn, launch

    visits = collections.Counter()
    counted = []
    for k in plan.kernels:
        labels = {loop["label"][1:] for loop in k.loops if loop["extent"] in extents}
        source = re.sub(rf"for start({'|'.join(labels)}) in range\(", r"for start\1 in visit(", k.source) \
            if labels else k.source
        counted.append(dataclasses.replace(k, source=source))

        def visit(*bounds, _name=k.name):
            tiles = range(*(int(b) for b in bounds))
            visits[(_name, interpreter.interpreter_builder.grid_idx)] += len(tiles)
            return tiles

        _kernel_fn(plan, counted[-1]).fn.__globals__["visit"] = visit
    launch(dataclasses.replace(plan, kernels=counted), inputs, out=out)
    return visits


def only_tilings(monkeypatch, keep) -> None:
    """Have the scheduler cost only the (kernel, tiling) options whose tiling `keep` accepts."""
    from cleave.scheduler import api

    tiled = api._tiled
    monkeypatch.setattr(api, "_tiled", lambda spec, env, dynamic, target, relaxed=False: (
        (s, t) for s, t in tiled(spec, env, dynamic, target, relaxed) if keep(t)))


def recorded_kernel_options(monkeypatch) -> list:
    """A list that collects, per kernel scheduled from now on, the ranked options the
    scheduler returns (seconds, kernel, tiles, (spec, tiling), stats)."""
    from cleave.scheduler import api

    found, options = [], api._kernel_options

    def recorded(*args):
        out = options(*args)
        found.append(out)
        return out

    monkeypatch.setattr(api, "_kernel_options", recorded)
    return found


def check_every_length(name: str, env: dict, axis: str, lengths, stores: int | None = None) -> None:
    """One plan scheduled with `axis` dynamic (the options kept as the caller's fixtures
    say) matches the reference at every length; `stores`: the output stores its first
    kernel must hold (one per row tile)."""
    from cleave import search
    from cleave.scheduler import schedule

    g = W.get(name).graph
    plan = schedule(search(g).candidates[0], env, dynamic={axis}, top_k=1, target=LOOPS)[0]
    if stores is not None:
        assert len(re.findall(r"^\s*tl\.store\(", plan.kernels[0].source, re.M)) == stores
    for n in lengths:
        run_and_check(g, plan, {**env, axis: n}, seed=n)
