"""The loop nest of a kernel: which reductions share a loop, decided before codegen.

Every reduction over a `loop` label (an accumulator) is accumulated in a `for` over
that label's tiles. Loops sit in blocks: the top block (the program's output tile)
and the body of each loop. A block is named by its chain, the labels of the loops it
is nested in, outermost first. An accumulator lives in the block whose chain holds
every loop label its value varies over, the innermost of them last: codegen emits
each value in that block (its home), so that what does not vary over a loop is
computed before it.

Within one block, the accumulators over one label share loops in waves. One that
reads another's result runs in a later loop (another pass over the tiles), unless it
is sum-like and reads that result only through a node the search proved Separable,
F(x, y) = G(x)·H(y), with the result as its factor y: it then joins y's loop, the
running y is kept, and what reads it is rescaled by H(y_new)/H(y_old) each step
(RedFuser's incremental form; online softmax's max and sum are one instance).
Accumulators that do not feed each other share a loop (horizontal fusion).
"""
from __future__ import annotations

from dataclasses import dataclass

from cleave.ir import ShapeError


@dataclass(frozen=True, eq=False)
class Loop:
    """One `for` over the tiles of a reduced label, and the accumulators it updates."""
    label: int  # the reduced label id
    chain: tuple  # the labels of the loops it is nested in, outermost first: its block
    accs: tuple  # the accumulator instances, in update order: a factor before what it rescales
    factors: frozenset  # the accumulators whose running value later ones in the loop read
    rescale: dict  # factor -> H(y_new)/H(y_old) (sympy, in y_old and y_new), from its Separable fact
    scaled: dict  # accumulator -> the factors whose rescale multiplies it each step


@dataclass(frozen=True, eq=False)
class LoopNest:
    """A kernel's loops, per block chain. Two loops over one label in one block (two
    passes) have the same body chain: the loops nested in them are decided once."""
    accs: tuple  # every accumulator the kernel computes
    loops: dict  # chain -> [Loop]

    def loop(self, chain: tuple, acc) -> Loop:
        """The loop of block `chain` that updates accumulator `acc`."""
        for lp in self.loops.get(chain, ()):
            if acc in lp.accs:
                return lp
        raise ShapeError(f"scheduler: internal: node %{acc.node.id} has no loop in the block of loops {chain}")


def accumulators(views, role: dict) -> list:
    """The instances that reduce over a loop label, in the kernel's instance order."""
    return [i for i in views.memo.values() if i.reduced is not None and role[i.reduced.id] == "loop"]


def through_units(facts: dict, instances, units: set) -> dict:
    """`facts` with a factor that only reduces an accumulator over unit labels (extent 1:
    a Split's chunk axis at count 1, whose max is its one chunk's max) retargeted to that
    accumulator: its running value is the factor's, so what reads the factor may join
    its loop."""
    alias = {}
    for r in instances:
        inner = r
        while inner.op == "reduce" and inner.reduced.id in units:
            inner = inner.inputs[0]
        if inner is not r and inner.op == "reduce" and inner.reduced is not None:
            alias[r.node.id] = inner.node.id
    return {f: (alias.get(y, y), rescale) for f, (y, rescale) in facts.items()}


def loop_nest(accs, role: dict, facts: dict) -> LoopNest:
    """The loops of accumulators `accs`, with `role` the tiling's label roles and
    `facts` the Separable facts (F node id -> (factor node id, rescale))."""
    loops: dict = {}
    chains = [()]
    while chains:
        chain = chains.pop(0)
        if chain in loops:
            continue
        pool = [a for a in accs if _lives_in(a, chain, role)]
        loops[chain] = []
        for x in dict.fromkeys(a.reduced.id for a in pool):
            same = [a for a in pool if a.reduced.id == x]
            loops[chain] += [_loop(x, chain, wave, facts) for wave in _waves(same, facts)]
            if x not in chain:
                chains.append(chain + (x,))
    return LoopNest(tuple(accs), loops)


def _lives_in(acc, chain: tuple, role: dict) -> bool:
    """Whether the block of `chain` is acc's home: it holds acc's loop labels, the
    innermost one last (the top block when acc varies over none)."""
    looped = {i for i in acc.labels if role[i] == "loop"}
    return looped <= set(chain) and (not chain or chain[-1] in looped)


def _waves(pool: list, facts: dict) -> list[list]:
    """pool (accumulators over one label, in one block) cut into the loops that run one
    after another: an accumulator's wave is one more than that of each accumulator it
    reads, or the same where it reads it only through a Separable factor."""
    wave: dict = {}

    def w(a):
        if a not in wave:
            wave[a] = 0  # a guard: instances form a DAG
            wave[a] = max([w(c) + (0 if _covered(a, c, facts) else 1) for c in pool
                           if c is not a and depends(a, c, facts, False)], default=0)
        return wave[a]

    return [[a for a in pool if w(a) == k] for k in sorted({w(a) for a in pool})]


def _loop(x: int, chain: tuple, members: list, facts: dict) -> Loop:
    """The loop over label x of one wave: factors update first (they read fewer of the
    others), and each accumulator is rescaled by the factors before it that it reads."""
    order = sorted(members, key=lambda a: sum(depends(a, c, facts, False) for c in members))
    factors = frozenset(c for a in order for c in order if c is not a and depends(a, c, facts, False))
    rescale = {}
    for c in order:
        expr = _rescale(c, facts)
        if c in factors and c.op == "reduce" and expr is not None:
            rescale[c] = expr
    scaled = {a: tuple(c for c in order[:k] if c in rescale and depends(a, c, facts, False))
              for k, a in enumerate(order)}
    return Loop(x, chain, tuple(order), factors, rescale, scaled)


def _rescale(factor, facts: dict):
    """The rescale of the first Separable fact whose factor is this accumulator's node."""
    for fid, expr in facts.values():
        if fid == factor.node.id:
            return expr
    return None


def depends(a, b, facts: dict, stop_factor: bool) -> bool:
    """Whether a's inputs reach instance b; with stop_factor, paths through a Separable
    node whose factor is b's node do not count."""
    seen, stack = set(), list(a.inputs)
    while stack:
        i = stack.pop()
        if id(i) in seen:
            continue
        seen.add(id(i))
        if i is b:
            return True
        if stop_factor and facts.get(i.node.id, (None,))[0] == b.node.id:
            continue
        stack.extend(i.inputs)
    return False


def _covered(a, b, facts: dict) -> bool:
    """Whether a may share b's loop: a sums, b reduces, and a reads b only through
    Separable nodes whose factor is b."""
    sum_like = a.op == "matmul" or (a.op == "reduce" and a.node.attrs["op"] == "sum")
    return sum_like and b.op == "reduce" and not depends(a, b, facts, stop_factor=True)
