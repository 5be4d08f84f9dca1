"""einsum as permutes, reshapes, sums and batched matmuls (no ellipsis, no diagonals)."""
from __future__ import annotations

import math

from ..ir import dims as D
from .aten_layout import matmul, permute, reshape
from .aten_reduce import reduce


def parse(equation: str, count: int) -> tuple[list[str], str]:
    """Operand subscripts and the output subscript; raises ValueError for what we cannot express."""
    eq = equation.replace(" ", "")
    if "." in eq:
        raise ValueError("ellipsis in einsum is not supported")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != count:
        raise ValueError(f"einsum {equation!r} names {len(terms)} operands, got {count}")
    if not arrow:
        letters = "".join(terms)
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    for term in terms + [out]:
        if len(set(term)) != len(term):
            raise ValueError(f"repeated subscript in {term!r} (a diagonal) is not supported")
    return terms, out


def einsum(t, equation: str, operands: list):
    try:
        terms, out = parse(equation, len(operands))
    except ValueError as err:
        from .errors import UnsupportedOpError

        raise UnsupportedOpError(t.op, t.loc, str(err)) from None
    x, xs = operands[0], terms[0]
    for k in range(1, len(operands)):
        later = set(out).union(*terms[k + 1:])
        x, xs = _pair(t, x, xs, operands[k], terms[k], later)
    x, xs = _sum_out(t, x, xs, set(out))
    return permute(t, x, [xs.index(c) for c in out])


def _sum_out(t, x, subs: str, keep: set[str]):
    """Sum over subscripts nobody needs any more."""
    drop = [i for i, c in enumerate(subs) if c not in keep]
    if not drop:
        return x, subs
    return reduce(t, x, "sum", drop, False), "".join(c for c in subs if c in keep)


def _pair(t, a, sa: str, b, sb: str, later: set[str]):
    a, sa = _sum_out(t, a, sa, later | set(sb))
    b, sb = _sum_out(t, b, sb, later | set(sa))
    batch = [c for c in sa if c in sb and c in later]
    contract = [c for c in sa if c in sb and c not in later]
    left = [c for c in sa if c not in sb]
    right = [c for c in sb if c not in sa]
    da, db = dict(zip(sa, a.shape)), dict(zip(sb, b.shape))

    def size(letters, dims):
        return math.prod((dims[c] for c in letters), start=D.dim(1))

    a2 = reshape(t, permute(t, a, [sa.index(c) for c in batch + left + contract]),
                 [da[c] for c in batch] + [size(left, da), size(contract, da)])
    b2 = reshape(t, permute(t, b, [sb.index(c) for c in batch + contract + right]),
                 [db[c] for c in batch] + [size(contract, db), size(right, db)])
    prod = matmul(t, a2, b2)
    shape = list(prod.shape[:len(batch)]) + [da[c] for c in left] + [db[c] for c in right]
    return reshape(t, prod, shape), "".join(batch + left + right)
