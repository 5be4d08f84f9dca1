"""The loop nest (scheduler/loops.py): which accumulators share a loop, decided from a
kernel's instances, tiling and Separable facts before any code is emitted."""
import dataclasses

import sympy

from cleave import workloads as W
from cleave.scheduler.api import fuse_labels
from cleave.scheduler.codegen import fact_table
from cleave.scheduler.fexpr import Y_NEW, Y_OLD
from cleave.scheduler.loops import accumulators, loop_nest
from cleave.scheduler.partition import partition
from cleave.scheduler.tiles import enumerate_tilings
from fixtures_candidates import CANDIDATES
from kernel_check import LOOPS


def nest_of(cand, env):
    """The loop nest of the candidate's one kernel under its first tiling (LOOPS: every
    reduction of the small test shapes runs as a loop)."""
    (spec, _), = partition(cand.graph, env, long_extent=LOOPS.full_matmul, target=LOOPS,
                           hold_extent=LOOPS.hold_matmul)
    t = next(iter(enumerate_tilings(spec.views, spec.root_labels, env, set(), LOOPS)))
    spec = fuse_labels(spec, t)
    return loop_nest(accumulators(spec.views, t.role), t.role, fact_table(cand.facts))


def kinds(accs) -> list[str]:
    return [a.node.attrs["op"] if a.op == "reduce" else a.op for a in accs]


def test_online_softmax_is_one_loop_with_the_max_as_factor():
    """Attention with the Separable fact exp(S - m) = exp(S)·exp(-m): one loop over the
    keys; the running max updates first, and the sum and P·V are rescaled by it."""
    nest = nest_of(CANDIDATES["mha"](), dict(W.get("mha").test_bindings[0]))
    (loop,) = nest.loops[()]
    assert loop.chain == ()
    assert kinds(loop.accs) == ["max", "matmul", "sum"]
    m, pv, total = loop.accs
    assert loop.factors == {m}
    assert sympy.simplify(loop.rescale[m] - sympy.exp(Y_OLD - Y_NEW)) == 0
    assert loop.scaled == {m: (), pv: (m,), total: (m,)}
    assert nest.loop((), total) is loop


def test_without_the_fact_the_sum_runs_in_a_second_pass():
    """The same graph without its fact: the max needs a pass of its own, then the sum
    and P·V share the next one (horizontal fusion), and nothing is rescaled."""
    cand = dataclasses.replace(CANDIDATES["mha"](), facts=[])
    passes = nest_of(cand, dict(W.get("mha").test_bindings[0])).loops[()]
    first, second = passes
    assert first.label == second.label
    assert kinds(first.accs) == ["max"] and sorted(kinds(second.accs)) == ["matmul", "sum"]
    assert all(not lp.factors and not lp.rescale and not any(lp.scaled.values()) for lp in passes)


def test_contraction_inside_the_key_loop_is_nested_in_its_body():
    """At d = 32 the head dim is a loop too: Q·Kᵀ is accumulated over d inside each
    step of the key loop, in the block whose chain is that loop's label."""
    nest = nest_of(CANDIDATES["mha"](), dict(W.get("mha").test_bindings[1]))
    (outer,) = nest.loops[()]
    (inner,) = nest.loops[(outer.label,)]
    assert inner.chain == (outer.label,) and inner.label != outer.label
    assert kinds(inner.accs) == ["matmul"]
    (scores,) = inner.accs
    assert scores.labels >= {outer.label}  # the score tile varies over the keys


def test_rmsnorm_matmul_shares_one_loop_over_k():
    """x @ w and the row's sum of squares read the same x tile: one loop over k, no
    factor between them."""
    nest = nest_of(CANDIDATES["rmsnorm_matmul"](), dict(W.get("rmsnorm_matmul").test_bindings[0]))
    (loop,) = nest.loops[()]
    assert sorted(kinds(loop.accs)) == ["matmul", "sum"]
    assert not loop.factors and not loop.rescale
