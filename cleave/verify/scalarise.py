"""Scalarise an IR graph at a concrete binding to one scalar expression per output element.

Tensors are numpy object arrays of scalars (see scalars.py); every op becomes loops
of scalar operations with the interpreter's semantics (row-major reshape, -inf as
the max of nothing, split pads at the tail).
"""
from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Mapping

import numpy as np

from ..ir import Graph, Node
from ..ir import dims as D
from ..ir.ops import BINARY, COMPARE, UNARY, per_op
from .scalars import INF, NINF, Algebra, Unsupported, is_num, number


def scalar_kind(node: Node) -> str:
    if node.dtype.is_float:
        return "real"
    return "bool" if str(node.dtype) == "bool" else "int"


def input_arrays(graph: Graph, env: Mapping[str, int], alg: Algebra) -> dict[str, np.ndarray]:
    """One fresh variable per element of every input, named `name[i,j]`."""
    out = {}
    for name, node in graph.inputs.items():
        shape = graph.concrete_shape(node, env)
        arr = np.empty(shape, dtype=object)
        for idx in np.ndindex(*shape):
            arr[idx] = alg.b.var(f"{name}[{','.join(map(str, idx))}]", scalar_kind(node))
        out[name] = arr
    return out


def scalarise(graph: Graph, env: Mapping[str, int], inputs: Mapping[str, np.ndarray], alg: Algebra) -> list[np.ndarray]:
    values: dict[int, np.ndarray] = {}
    for node in graph.live_nodes():
        values[node.id] = _scalarise_node(node, [values[x.id] for x in node.inputs], inputs, env, alg)
    return [values[o.id] for o in graph.outputs]


def _scalar(value) -> np.ndarray:
    arr = np.empty((), dtype=object)
    arr[()] = value
    return arr


def _map(fn, *arrays: np.ndarray) -> np.ndarray:
    arrays = np.broadcast_arrays(*arrays)
    out = np.empty(arrays[0].shape, dtype=object)
    for idx in np.ndindex(*out.shape):
        out[idx] = fn(*(a[idx] for a in arrays))
    return out


def _scalarise_node(node: Node, args, inputs, env, alg: Algebra) -> np.ndarray:
    op, a = node.op, node.attrs
    ev = lambda d: D.evaluate(d, env)  # noqa: E731
    if op == "input":
        return inputs[a["name"]]
    if op == "const":
        return _scalar(bool(a["value"]) if str(node.dtype) == "bool" else number(a["value"]))
    if op == "size":
        return _scalar(Fraction(ev(a["value"])))
    if op == "iota":
        shape = [ev(d) for d in a["shape"]]
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(*shape):
            out[idx] = Fraction(idx[a["axis"]])
        return out
    if op in UNARY:
        return _map(lambda x: alg.unary(op, x), args[0])
    if op == "cast":
        return _map(lambda x: _cast(x, node, alg), args[0])
    if op in BINARY:
        fn = alg.pow if op == "pow" else getattr(alg, op)
        return _map(fn, *args)
    if op in COMPARE:
        return _map(lambda x, y: alg.compare(op, x, y), *args)
    if op == "where":
        return _map(alg.where, *args)
    if op == "matmul":
        return _matmul(args[0], args[1], alg)
    if op == "reduce":
        return _reduce(args[0], a["op"], a["axis"], bool(a["keepdim"]), alg)
    if op == "broadcast":
        return np.broadcast_to(args[0], [ev(d) for d in a["shape"]])
    if op == "reshape":
        return args[0].reshape([ev(d) for d in a["shape"]])
    if op == "permute":
        return args[0].transpose(a["perm"])
    if op == "slice":
        idx = [slice(None)] * args[0].ndim
        idx[a["axis"]] = slice(ev(a["start"]), ev(a["stop"]), a["step"])
        return args[0][tuple(idx)]
    if op == "concat":
        return np.concatenate(args, axis=a["axis"])
    if op == "split":
        return _split(args[0], a["axis"], ev(a["count"]), a["pad"])
    if op == "gather":
        return _gather(args[0], args[1], a["axis"], alg)
    if op == "take":
        return _take(args[0], args[1], a["axis"], alg)
    if op == "topk":
        return _topk(args[0], a["k"], a["axis"], a["which"], alg)
    raise Unsupported(f"op {op!r} has no scalar lowering")


def _cast(x, node: Node, alg: Algebra):
    if isinstance(x, bool) or (not is_num(x) and _is_bool_term(x)):
        return alg.to_real(x) if str(node.dtype) != "bool" else x
    if node.dtype.is_float:
        return x
    if str(node.dtype) != "bool" and is_num(x) and Fraction(x).denominator == 1:
        return x
    raise Unsupported(f"cast of a real value to {node.dtype}")


def _is_bool_term(x) -> bool:
    import z3

    return isinstance(x, z3.BoolRef) or getattr(x, "is_Relational", False) or getattr(x, "is_Boolean", False)


def _matmul(x: np.ndarray, y: np.ndarray, alg: Algebra) -> np.ndarray:
    batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    x = np.broadcast_to(x, batch + x.shape[-2:])
    y = np.broadcast_to(y, batch + y.shape[-2:])
    m, k, n = x.shape[-2], x.shape[-1], y.shape[-1]
    out = np.empty(batch + (m, n), dtype=object)
    for b in np.ndindex(*batch):
        for i, j in itertools.product(range(m), range(n)):
            out[b + (i, j)] = alg.sum([alg.mul(x[b + (i, t)], y[b + (t, j)]) for t in range(k)])
    return out


_IDENTITY = per_op({"sum": Fraction(0), "max": NINF, "min": INF, "prod": Fraction(1)}, "reduce",
                   where="verify/scalarise.py")


def _reduce(x: np.ndarray, op: str, axis: int, keep: bool, alg: Algebra) -> np.ndarray:
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1], dtype=object)
    for idx in np.ndindex(*out.shape):
        items = list(moved[idx])
        if op == "sum":
            out[idx] = alg.sum(items)
        else:
            acc = _IDENTITY[op]
            for v in items:
                acc = alg.mul(acc, v) if op == "prod" else alg.max(acc, v) if op == "max" else alg.min(acc, v)
            out[idx] = acc
    return np.expand_dims(out, axis) if keep else out


def _split(x: np.ndarray, axis: int, count: int, pad) -> np.ndarray:
    n = x.shape[axis]
    inner = -(-n // count)
    missing = count * inner - n
    if missing:
        if pad is None:
            raise Unsupported(f"split of {n} into {count} chunks without a pad")
        shape = list(x.shape)
        shape[axis] = missing
        filler = np.empty(shape, dtype=object)
        filler.fill(number(pad))
        x = np.concatenate([x, filler], axis=axis)
    return x.reshape(x.shape[:axis] + (count, inner) + x.shape[axis + 1:])


def _select(row, index, alg: Algebra):
    """row[index] for a symbolic or concrete integer index; the index must be in range."""
    if is_num(index):
        return row[int(index)]
    alg.b.assume(alg.compare("ge", index, Fraction(0)))
    alg.b.assume(alg.compare("lt", index, Fraction(len(row))))
    out = row[-1]
    for k in range(len(row) - 2, -1, -1):
        out = alg.where(alg.compare("eq", index, Fraction(k)), row[k], out)
    return out


def _gather(x: np.ndarray, index: np.ndarray, axis: int, alg: Algebra) -> np.ndarray:
    out = np.empty(index.shape, dtype=object)
    for idx in np.ndindex(*index.shape):
        src = list(idx)
        src[axis] = slice(None)
        out[idx] = _select(list(x[tuple(src)]), index[idx], alg)
    return out


def _take(x: np.ndarray, index: np.ndarray, axis: int, alg: Algebra) -> np.ndarray:
    moved = np.moveaxis(x, axis, 0)
    rows = moved.reshape(moved.shape[0], -1)
    out = np.empty(index.shape + (rows.shape[1],), dtype=object)
    for idx in np.ndindex(*index.shape):
        for j in range(rows.shape[1]):
            out[idx + (j,)] = _select(list(rows[:, j]), index[idx], alg)
    out = out.reshape(index.shape + moved.shape[1:])
    return np.moveaxis(out, list(range(index.ndim)), list(range(axis, axis + index.ndim)))


def _topk(x: np.ndarray, k: int, axis: int, which: str, alg: Algebra) -> np.ndarray:
    """Selection by compare-exchange passes: pass p bubbles the p-th largest into place."""
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1] + (k,), dtype=object)
    for idx in np.ndindex(*moved.shape[:-1]):
        vals = list(moved[idx])
        ids = [Fraction(i) for i in range(len(vals))]
        for p in range(k):
            for i in range(len(vals) - 1, p, -1):
                swap = alg.compare("gt", vals[i], vals[i - 1])
                vals[i], vals[i - 1] = alg.where(swap, vals[i - 1], vals[i]), alg.where(swap, vals[i], vals[i - 1])
                ids[i], ids[i - 1] = alg.where(swap, ids[i - 1], ids[i]), alg.where(swap, ids[i], ids[i - 1])
        chosen = vals if which == "values" else ids
        for p in range(k):
            out[idx + (p,)] = chosen[p]
    return np.moveaxis(out, -1, axis)
