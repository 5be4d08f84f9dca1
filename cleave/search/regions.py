"""Dominating e-classes: where the extraction of a large program splits into regions.

Extraction ranks whole DAGs, and their number is the product of the choices of every
part of the program: a model of L identical layers, each with a few choices, has
(choices per layer)^L of them. In a stack of layers the hidden state between two
layers *dominates* everything computed before it: every path from the outputs down
to those e-classes passes through its e-class. The region under a dominating class
can then be extracted on its own (its value is all that the rest of the program
sees), its best choice kept, and the rest extracted above it: the work is a sum over
regions, not a product.

A program small enough to rank whole is never split, so its optimum is unchanged.
A larger one is settled bottom-up, the largest region first, into regions of a few
dozen extractions (about one layer each); the outputs' own region stays open, and
the candidates differ there.
"""
from __future__ import annotations

import math
from typing import Callable

from cleave.ir.dominators import dominated, immediate_dominators


def successors(classes, roots) -> dict:
    """Each e-class reachable from `roots` -> the classes its e-nodes read."""
    succ, stack = {}, list(roots)
    while stack:
        c = stack.pop()
        if c in succ:
            continue
        succ[c] = kids = {a[1] for n in classes[c] for a in n.args if isinstance(a, tuple)}
        stack.extend(kids)
    return succ


def cyclic_components(succ: dict) -> dict:
    """Each class on a cycle of the class graph -> its strongly connected component's
    id (Tarjan's algorithm, iteratively); classes on no cycle are left out. An
    extraction can only close a cycle among classes of one component."""
    index, low, on_stack, stack, comp = {}, {}, set(), [], {}
    counter = 0
    for start in succ:
        if start in index:
            continue
        work = [(start, iter(sorted(succ[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            c, it = work[-1]
            k = next(it, None)
            if k is not None:
                if k not in index:
                    index[k] = low[k] = counter
                    counter += 1
                    stack.append(k)
                    on_stack.add(k)
                    work.append((k, iter(sorted(succ[k]))))
                elif k in on_stack:
                    low[c] = min(low[c], index[k])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[c])
            if low[c] == index[c]:
                members = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    members.append(m)
                    if m == c:
                        break
                if len(members) > 1 or c in succ[c]:
                    comp.update((m, c) for m in members)
    return comp


def postorder(succ: dict, starts) -> list:
    """The classes reachable from `starts`, each after the classes it reads (but those
    on a cycle with it)."""
    order, seen = [], set()
    for s in starts:
        if s in seen:
            continue
        seen.add(s)
        stack = [(s, iter(succ[s]))]
        while stack:
            c, kids = stack[-1]
            k = next(kids, None)
            if k is None:
                stack.pop()
                order.append(c)
            elif k not in seen:
                seen.add(k)
                stack.append((k, iter(succ[k])))
    return order


def reaching(classes, targets: list) -> dict:
    """Each of `targets` -> the others it reaches through the e-nodes of `classes`. One
    sweep over the class graph for all of them (bit sets), where a search per pair took
    minutes on an e-graph of a few thousand classes."""
    succ = successors(classes, targets)
    order = postorder(succ, targets)
    bit = {t: 1 << i for i, t in enumerate(targets)}
    below = dict.fromkeys(order, 0)  # class -> the targets it reaches, as bits
    changed = True
    while changed:  # one sweep settles an acyclic graph; each cycle may take one more
        changed = False
        for c in order:
            reached = 0
            for k in succ[c]:
                reached |= bit.get(k, 0) | below[k]
            if reached != below[c]:
                below[c], changed = reached, True
    return {t: {o for o in targets if o != t and below[t] & bit[o]} for t in targets}


def choices(classes, region) -> float:
    """log of the product of the e-node counts of a region's classes: an upper bound on
    its extractions (all of them when no choice excludes another)."""
    return sum(math.log(len(classes[c])) for c in region)


# Once a program is split, its regions are kept this small (in extractions, bounded
# as `choices` bounds them): ranking decodes every extraction (10-20 ms for a layer),
# and a region of two layers holds the square of one's.
REGION_EXTRACTIONS = 64


def settle(classes, roots, enumerable, best, region_extractions: int = REGION_EXTRACTIONS,
           expired: Callable[[], bool] = lambda: False) -> dict:
    """`classes` as they are when `enumerable(classes, roots)`; else with regions under
    dominating classes narrowed to their best choice until each region left, the
    outputs' own included, is bounded by `region_extractions`. `best(classes, cls,
    owned)` extracts the region under cls, whose own classes are `owned` (the cheapest
    realized choice, or None). Once `expired()`, the regions left stay as they are."""
    log_limit = math.log(region_extractions)
    if enumerable(classes, roots):
        return classes
    classes = dict(classes)
    idom = immediate_dominators(successors(classes, roots), roots)
    below = dominated(idom)
    children: dict = {}
    for c, d in idom.items():
        children.setdefault(d, []).append(c)

    failed: set = set()  # regions that decode to no candidate on their own
    narrowed: set = set()  # regions settled inside already

    def open_weight(c) -> float:
        return 0.0 if c in failed else choices(classes, below[c])

    def narrow(top) -> None:
        """Settle regions under `top` until its bound is within the regions' size."""
        while choices(classes, below[top]) > log_limit and not expired():
            kids = [k for k in children.get(top, ()) if open_weight(k) > 0]
            if not kids:
                return  # this region alone is too large: the caller's beam search takes it
            # Lowest first: a region that reads another open one (a layer reads the one
            # before it through the residual stream) waits for it to settle.
            reached = reaching(classes, kids)
            lowest = [k for k in kids if not reached[k]] or kids
            kid = max(lowest, key=lambda k: (open_weight(k), k))
            if kid not in narrowed:  # settle inside it first: the part nearest the top stays open
                narrowed.add(kid)
                narrow(kid)
                continue
            chosen = best(classes, kid, below[kid])
            if chosen is None:
                failed.add(kid)
                continue
            # Only what the region owns is fixed: classes it shares with the rest of the
            # program stay open for the extraction above it. Those it owns but no longer
            # reaches are unreachable from anywhere.
            for c in below[kid]:
                classes[c] = [chosen.choice[c]] if c in chosen.choice else classes[c][:1]

    # The outputs' own region stays open: the candidates differ there.
    for r in dict.fromkeys(roots):
        narrow(r)
    return classes
