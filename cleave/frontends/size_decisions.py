"""What a traced function's own code decided about its dynamic sizes, as facts the graph
holds under.

torch.export traces a dynamic size n as n >= 2 and settles what that decides without a
guard: `n == 1` is False for every n >= 2, and `n == 0` (sizes are positive to sympy) for
every n. A branch on such a comparison leaves nothing in `ep.range_constraints` or its
guards, so a graph traced at n = 4 answered n = 1 with the other branch's ops. The guards
export does keep also hold torch's own choices inside ops (a reshape's `n != 3`,
`n == 1 or n == m`), which do not change the IR and would send such sizes to eager.
Instead, the comparisons are read where the trace takes them in: torch (2.11 to 2.13)
puts each comparison of sizes in the traced FX graph as it is made, and removes it later
as dead code. Each becomes a fact (`n != 1`) that the binding checks at each new shape,
so a call where one comes out otherwise runs eagerly; `tests/test_capture_size_guards.py`
fails if a torch stops recording them.

The FX graph also takes in comparisons torch makes inside a layout op the code calls:
`.contiguous()` of a transposed tensor asks whether it is contiguous already (`b == 1`,
`8*T == 8`, `numel == 0`) to choose between returning it and copying it. Those decide
strides and aliasing, which the IR does not have (its values are the same either way),
so they are left out (_layout_decision): nanoGPT's head merge served b = 1 and T = 1
eagerly, for good. A comparison the code makes itself, or that torch makes inside any
other op, is kept; `tests/test_size_one_views.py` fails if layout ops' are kept again.
"""
from __future__ import annotations

import contextlib
import operator
import os
import sys
import threading

import sympy
import torch

from ..ir import Constraint
from ..ir import dims as D
from .errors import CaptureError, UnsupportedOpError
from .symbols import DataDependentSize

# comparison -> (its negation, how it prints)
_RELATIONS = {operator.eq: (operator.ne, "=="), operator.ne: (operator.eq, "!="),
              operator.lt: (operator.ge, "<"), operator.le: (operator.gt, "<="),
              operator.gt: (operator.le, ">"), operator.ge: (operator.lt, ">=")}
_SYMPY = {operator.eq: sympy.Eq, operator.ne: sympy.Ne, operator.lt: sympy.Lt, operator.le: sympy.Le,
          operator.gt: sympy.Gt, operator.ge: sympy.Ge}

_recording = threading.local()  # .made: the list this thread's trace records into
_lock = threading.Lock()
_tracing = 0  # traces recording now, in all threads
_create_node = torch.fx.Graph.create_node  # as it was before the first of them


@contextlib.contextmanager
def recorded_comparisons():
    """Yields a list that collects, as (node, operands), the comparisons FX graphs take in
    while the block runs in this thread (a torch.export trace: its comparisons of sizes).
    The operands are kept apart: the trace clears a node's arguments when it removes it."""
    made, outer = [], getattr(_recording, "made", None)
    _recording.made = made
    _start_recording()
    try:
        yield made
    finally:
        _stop_recording()
        _recording.made = outer


def _start_recording() -> None:
    """torch.fx.Graph.create_node records while any trace does (counted under a lock:
    traces in two threads neither miss nor leave the patch)."""
    global _tracing, _create_node
    with _lock:
        if not _tracing:
            _create_node = torch.fx.Graph.create_node
            torch.fx.Graph.create_node = _recording_create_node
        _tracing += 1


def _stop_recording() -> None:
    global _tracing
    with _lock:
        _tracing -= 1
        if not _tracing:
            torch.fx.Graph.create_node = _create_node


def _recording_create_node(graph, *args, **kwargs):
    node = _create_node(graph, *args, **kwargs)
    made = getattr(_recording, "made", None)
    if made is not None and node.op == "call_function" and _is_comparison(node.target) and not _layout_decision():
        made.append((node, tuple(node.args)))
    return node


# Ops whose result holds their input's values in a given shape: what they decide on sizes
# (already contiguous? viewable?) is only the result's strides and whether it copies.
# Not is_contiguous: its answer is the decision, and code may branch on it.
_LAYOUT_OPS = frozenset({"contiguous", "clone", "view", "view_as", "reshape", "reshape_as",
                         "flatten", "unflatten", "transpose", "permute", "t", "movedim", "moveaxis",
                         "swapaxes", "swapdims"})
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _layout_decision() -> bool:
    """Whether the comparison the trace is taking in now is torch's own, made inside a
    layout op (_LAYOUT_OPS) that code outside torch called. The stack from here out runs
    through torch down to that code: a comparison the code makes itself (`n == 1`) enters
    torch at SymInt's operator, one made inside an op at that op's __torch_function__
    handler (the tracer's modes), whose `func` names the op the code called."""
    frame, called = sys._getframe(2), None  # past this and _recording_create_node
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        if frame.f_code.co_name == "__torch_function__":
            func = frame.f_locals.get("func")
            if func is not None:
                called = func  # the outermost handler's: the op the code outside torch called
        frame = frame.f_back
    return frame is not None and getattr(called, "__name__", None) in _LAYOUT_OPS


def _is_comparison(target) -> bool:
    try:
        return target in _RELATIONS or target in _CLAMPS
    except TypeError:  # an unhashable target
        return False


# `max(a, b)` of sizes decides a >= b: sympy settles Max(n, 1) as n and Min(n - 1, 0) as 0
# (its sizes are positive), and the graph keeps no trace of the clamp.
_CLAMPS = {torch.sym_max: operator.ge, torch.sym_min: operator.le}


def constrain_to_decisions(graph, symbols, comparisons) -> None:
    """Add to `graph`, for each recorded comparison of sizes, the fact that it comes out as
    it did where torch traced (SymbolMap `symbols` reads torch's sizes as the graph's dims).
    Raises CaptureError for one the binding cannot check (over fractions, or min/max)."""
    for node, operands in comparisons:
        value = _value_of(node)
        if node.target in _CLAMPS:
            _constrain_to_side(graph, symbols, node.target, operands)
            continue
        if not isinstance(value, torch.SymBool):
            continue  # tensors compared elementwise, not sizes
        if any(isinstance(_value_of(x), (bool, torch.SymBool)) for x in operands):
            continue  # `(n > 1) == flag`: decided by the comparisons it compares, recorded too
        lhs, rhs = (_expr(symbols, _value_of(x)) for x in operands)
        if value.node.hint is None:
            raise CaptureError(f"capture: the function compares {D.fmt(lhs)} with {D.fmt(rhs)}, which torch "
                               f"traced without a value")
        relation = node.target if value.node.hint else _RELATIONS[node.target][0]
        if not _holds_for_every_size(relation, lhs, rhs):  # torch's own checks (a size >= 0) do
            graph._constrain(_fact(relation, lhs, rhs))


def _constrain_to_side(graph, symbols, clamp, operands) -> None:
    """The fact that the side of `max(a, b)` (`min`) torch traced wins at every call."""
    values = [_value_of(x) for x in operands]
    if not all(isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool) for v in values):
        return  # floats: torch specialises them
    traced = [v.node.hint if isinstance(v, torch.SymInt) else v for v in values]
    lhs, rhs = (_expr(symbols, v) for v in values)
    if None in traced:
        raise CaptureError(f"capture: the function takes {clamp.__name__}({D.fmt(lhs)}, {D.fmt(rhs)}), which torch "
                           f"traced without a value")
    relation = _CLAMPS[clamp] if _CLAMPS[clamp](*traced) else _RELATIONS[_CLAMPS[clamp]][0]
    if not _holds_for_every_size(relation, lhs, rhs):
        graph._constrain(_fact(relation, lhs, rhs))


def _value_of(operand):
    """What an FX node traced to (make_fx keeps it as "val", dynamo as "example_value");
    a constant as itself."""
    if isinstance(operand, torch.fx.Node):
        return operand.meta.get("val", operand.meta.get("example_value"))
    return operand


def _expr(symbols, value) -> sympy.Expr:
    try:
        return symbols.to_expr(value)
    except DataDependentSize as err:  # dynamo's graphs take it, as the op that made it, from this call on
        raise UnsupportedOpError("a data-dependent size", None, f"the function compares {value!r}: {err}") from None
    except (TypeError, ValueError) as err:
        raise CaptureError(f"capture: the function compares {value!r}, which cleave cannot check at each call "
                           f"({err})") from None


def _holds_for_every_size(relation, lhs, rhs) -> bool:
    """Whether `lhs relation rhs` holds wherever its symbols are sizes."""
    return _SYMPY[relation](*_as_sizes(lhs, rhs)) is sympy.true


def _as_sizes(*exprs) -> list:
    """exprs with their symbols read as integers >= 0: sympy takes the IR's symbols as
    positive, and a size may be 0."""
    symbols = set().union(*(e.free_symbols for e in exprs))
    sizes = {s: sympy.Dummy(s.name, integer=True, nonnegative=True) for s in symbols}
    return [e.xreplace(sizes) for e in exprs]


def _fact(relation, lhs, rhs) -> Constraint:
    """`lhs relation rhs` in the constraint kinds the binding checks, eq and le: `a != b`
    as 1 <= (a - b)**2."""
    text = f"{D.fmt(lhs)} {_RELATIONS[relation][1]} {D.fmt(rhs)}"
    for side in (lhs, rhs):
        _check_integer(side, text)
    kind, a, b = {operator.eq: ("eq", lhs, rhs), operator.ne: ("le", 1, (lhs - rhs) ** 2),
                  operator.lt: ("le", lhs + 1, rhs), operator.le: ("le", lhs, rhs),
                  operator.gt: ("le", rhs + 1, lhs), operator.ge: ("le", rhs, lhs)}[relation]
    return Constraint(kind, D.dim(a), D.dim(b), f"the traced code's {text}")


def _check_integer(expr, text: str) -> None:
    """An integer expression D.evaluate and the scheduler's integer code both read, or a
    CaptureError."""
    other = next((e for e in sympy.preorder_traversal(expr) if not _integer_part(e)), None)
    if other is not None or not _as_sizes(expr)[0].is_integer:
        raise CaptureError(f"capture: the function decides on {text}, which cleave cannot check at each call "
                           f"(it holds {other if other is not None else 'a fraction'})")


def _integer_part(e) -> bool:
    if isinstance(e, sympy.Pow):
        return isinstance(e.exp, sympy.Integer) and e.exp > 0
    return isinstance(e, (sympy.Rational, sympy.Symbol, sympy.Add, sympy.Mul, sympy.floor, sympy.ceiling,
                          sympy.Mod))
