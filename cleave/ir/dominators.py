"""Dominators in a DAG read from its outputs down: d dominates n when every path from
the outputs to n passes through d. The extraction splits a large program's e-graph at
them (search/regions.py). Graphs are given as successor maps (each vertex -> the
vertices it reads); cycles are allowed."""
from __future__ import annotations

ROOT = None  # the virtual vertex above the outputs


def immediate_dominators(succ: dict, roots) -> dict:
    """Each reachable vertex -> its immediate dominator (ROOT for the outputs' level), by
    the iterative algorithm of Cooper, Harvey and Kennedy over reverse postorder;
    cycles are allowed (an e-class can reach itself)."""
    order, seen = [], set()
    for r in roots:  # iterative postorder from each root
        if r in seen:
            continue
        seen.add(r)
        stack = [(r, iter(sorted(succ[r])))]
        while stack:
            c, it = stack[-1]
            nxt = next((k for k in it if k not in seen), None)
            if nxt is None:
                order.append(c)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(succ[nxt]))))
    rpo = list(reversed(order))
    number = {c: i for i, c in enumerate(rpo)}
    preds: dict = {c: set() for c in rpo}
    for c, kids in succ.items():
        for k in kids:
            preds[k].add(c)
    for r in roots:
        preds[r].add(ROOT)
    number[ROOT] = -1
    idom = {ROOT: ROOT}

    def meet(a, b):
        while a != b:
            while number[a] > number[b]:
                a = idom[a]
            while number[b] > number[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for c in rpo:
            done = [p for p in preds[c] if p in idom]
            new = done[0]
            for p in done[1:]:
                new = meet(new, p)
            if c not in idom or idom[c] != new:
                idom[c], changed = new, True
    del idom[ROOT]
    return idom


def dominated(idom: dict) -> dict:
    """Each vertex -> the vertices it dominates, itself included."""
    below = {c: {c} for c in idom}
    for c in idom:
        d = idom[c]
        while d is not ROOT:
            below[d].add(c)
            d = idom[d]
    return below
