"""The loop nest of a kernel: which reductions share a loop, decided before codegen.

Every reduction over a `loop` label (an accumulator) is accumulated in a `for` over
that label's tiles. Loops sit in blocks: the top block (the program's output tile)
and the body of each loop. A block is named by its chain, the labels of the loops it
is nested in, outermost first. An accumulator lives in the block whose chain holds
every loop label its value varies over, the innermost of them last: codegen emits
each value in that block (its home), so that what does not vary over a loop is
computed before it.

Within one block, the accumulators share loops in waves, a loop per label and wave.
One that reads another's result runs in a later wave (another pass over the tiles,
even where the two reduce different labels), unless it reduces the same label,
is sum-like and reads that result only through a node the search proved Separable,
F(x, y) = G(x)·H(y), with the result as its factor y, and is linear in that node (a
product, a float cast, a view of it; not a compare): it then joins y's loop, the
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
        loops[chain] = [_loop(x, chain, wave, facts) for x, wave in _waves(pool, facts)]
        for x in dict.fromkeys(a.reduced.id for a in pool):
            if x not in chain:
                chains.append(chain + (x,))
    return LoopNest(tuple(accs), loops)


def _lives_in(acc, chain: tuple, role: dict) -> bool:
    """Whether the block of `chain` is acc's home: it holds acc's loop labels, the
    innermost one last (the top block when acc varies over none)."""
    looped = {i for i in acc.labels if role[i] == "loop"}
    return looped <= set(chain) and (not chain or chain[-1] in looped)


def _waves(pool: list, facts: dict) -> list[tuple[int, list]]:
    """pool (the accumulators of one block) cut into the loops that run one after
    another, each as (label, its accumulators): an accumulator's wave is one more than
    that of each accumulator it reads, or the same where that one reduces the same
    label and is read only through a Separable factor. Waves span the labels: an
    accumulator reading a loop over another label that reads its own loop's factor
    (an int sum of softmax > t reads the sum over another label, which reads the max)
    would otherwise share the max's loop and need its own result."""
    wave: dict = {}

    def w(a):
        if a not in wave:
            wave[a] = 0  # a guard: instances form a DAG
            wave[a] = max([w(c) + (0 if _joins(a, c, facts) else 1) for c in pool
                           if c is not a and depends(a, c)], default=0)
        return wave[a]

    labels = dict.fromkeys(a.reduced.id for a in pool)
    return [(x, [a for a in pool if a.reduced.id == x and w(a) == k])
            for k in sorted({w(a) for a in pool}) for x in labels
            if any(a.reduced.id == x and w(a) == k for a in pool)]


def _joins(a, b, facts: dict) -> bool:
    """Whether a may run in b's loop: both reduce one label, and a is covered by b."""
    return a.reduced.id == b.reduced.id and _covered(a, b, facts)


def _loop(x: int, chain: tuple, members: list, facts: dict) -> Loop:
    """The loop over label x of one wave: factors update first (they read fewer of the
    others), and each accumulator is rescaled by the factors before it that it reads."""
    order = sorted(members, key=lambda a: sum(depends(a, c) for c in members))
    factors = frozenset(c for a in order for c in order if c is not a and depends(a, c))
    rescale = {}
    for c in order:
        expr = _rescale(c, facts)
        if c in factors and c.op == "reduce" and expr is not None:
            rescale[c] = expr
    scaled = {a: tuple(c for c in order[:k] if c in rescale and depends(a, c))
              for k, a in enumerate(order)}
    return Loop(x, chain, tuple(order), factors, rescale, scaled)


def _rescale(factor, facts: dict):
    """The rescale of the first Separable fact whose factor is this accumulator's node."""
    for fid, expr in facts.values():
        if fid == factor.node.id:
            return expr
    return None


def depends(a, b) -> bool:
    """Whether a's inputs reach instance b."""
    seen, stack = set(), list(a.inputs)
    while stack:
        i = stack.pop()
        if id(i) in seen:
            continue
        seen.add(id(i))
        if i is b:
            return True
        stack.extend(i.inputs)
    return False


def _covered(a, b, facts: dict) -> bool:
    """Whether a may share b's loop: a sums, b reduces, and a is linear in the Separable
    nodes whose factor is b, through which alone it reads b: the running sum is then
    rescaled as b moves."""
    sum_like = a.op == "matmul" or (a.op == "reduce" and a.node.attrs["op"] == "sum")
    return sum_like and b.op == "reduce" and _scales(a, b, facts, {})


# Ops that pass a factor H(y) of their operands on (views move values, take/gather by
# their data operand): a compare, an integer cast or an exp of exp(x - m) does not, and
# a count of `softmax > t` rescaled by the running max's exp(m_old - m_new) is wrong.
_VIEWS = ("broadcast", "permute", "reshape", "slice", "split", "take", "gather")


def _scales(i, b, facts: dict, memo: dict) -> bool:
    """Whether i, which reads b, is H(b) times what does not read b: each op from i down
    to a Separable node with factor b is linear in its operands that read b."""
    if i is b:
        return False
    if facts.get(i.node.id, (None,))[0] == b.node.id:
        return True
    if id(i) not in memo:
        reach = [k for k, x in enumerate(i.inputs) if x is b or depends(x, b)]
        memo[id(i)] = _linear(i, reach) and all(_scales(i.inputs[k], b, facts, memo) for k in reach)
    return memo[id(i)]


def _linear(i, reach: list) -> bool:
    """Whether i scales by H when its inputs at positions `reach` do, and the rest not."""
    op = i.op
    if op in ("mul", "matmul"):
        return len(reach) == 1
    if op in ("div", "neg", *_VIEWS):
        return reach == [0]
    if op in ("add", "sub"):
        return len(reach) == 2
    if op == "cast":
        return i.node.dtype.is_float
    if op == "reduce":
        return i.node.attrs["op"] == "sum"
    if op == "where":  # where(c, F, 0): the arms that do not read b must be zero
        return 0 not in reach and all(_zero(i.inputs[k]) for k in (1, 2) if k not in reach)
    return False


def _zero(i) -> bool:
    """Whether i is the constant 0, through views."""
    while i.op in _VIEWS and i.inputs:
        i = i.inputs[0]
    return i.op == "const" and i.node.attrs["value"] == 0
