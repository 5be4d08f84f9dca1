"""Translate FX nodes (aten level) into IR nodes, one node at a time.

The Translator owns the value of every FX node seen so far: an IR Node, a sympy
scalar (a SymInt such as `q.size(2)`), a Python number, or a tuple of these (topk,
split). Rules in `aten_map` do the per-op work; this module binds their arguments by
the op's schema, checks the result against torch's own shape and dtype, and tags IR
nodes with the user's source line.
"""
from __future__ import annotations

import operator

import sympy
import torch
from torch.utils._sympy.functions import FloatPow, FloatTrueDiv, IntTrueDiv, ToFloat

from ..interpreter import IR_DTYPES, TORCH_DTYPES
from ..ir import DimMismatch, Graph, Node, ShapeError
from ..ir import dims as D
from ..ir.dtypes import DType
from . import aten_map
from .aten_elementwise import op_math
from .errors import CaptureError, Unify, UnsupportedOpError, op_name, source_of
from .symbols import SymbolMap
from .unify import unification



def ir_dtype(dtype: torch.dtype, what: str, source: str | None = None):
    try:
        return IR_DTYPES[dtype]
    except KeyError:
        raise UnsupportedOpError(what, source, f"dtype {dtype} has no IR equivalent") from None


class Translator:
    def __init__(self, graph: Graph, symbols: SymbolMap):
        self.graph = graph
        self.symbols = symbols
        self.values: dict = {}
        self.loc: str | None = None
        self.op = ""

    # -- driving ------------------------------------------------------------
    def set(self, fx_node, value) -> None:
        self.values[fx_node] = value

    def translate(self, fx_node):
        """Map one call_function node; its inputs must have been translated."""
        self.op, self.loc = op_name(fx_node), source_of(fx_node)
        val = fx_node.meta.get("val")
        if isinstance(val, aten_map.SIZE_TYPES):
            value = self.size(val)  # size arithmetic: torch already computed it symbolically
        elif fx_node.target is operator.getitem:
            value = self.value(fx_node.args[0])[fx_node.args[1]]
        else:
            rule = aten_map.rule_for(fx_node)
            if rule is None:
                raise UnsupportedOpError(self.op, self.loc)
            args = self.bind(fx_node)
            reason = rule.unsupported(aten_map.meta_args(fx_node), fx_node)
            if reason:
                raise UnsupportedOpError(self.op, self.loc, reason)
            known = len(self.graph.constraints)
            try:
                value = self._conform(rule.fn(self, fx_node, args), val)
                self._unify_reshapes(self.graph.constraints[known:])
            except ShapeError as err:  # the rule built something the IR rejects: say which op, where
                message = f"{self.op}: {err}" + (f" (at {self.loc})" if self.loc else "")
                read = unification(err.dims, self.symbols.hints) if isinstance(err, DimMismatch) else None
                if read:
                    raise Unify(message, *read) from None
                raise CaptureError(message) from None
            except (CaptureError, UnsupportedOpError):
                raise
            except (ArithmeticError, TypeError, ValueError, KeyError, IndexError) as err:
                # a case the rule does not handle (a reduction over dim 0 of a 0-d tensor):
                # that op runs eagerly, named, rather than an error from deep inside the rule
                raise UnsupportedOpError(self.op, self.loc, f"its lowering failed ({type(err).__name__}: {err})") \
                    from None
        self.values[fx_node] = value
        return value

    def _unify_reshapes(self, constraints) -> None:
        """A view torch traced at a size its split divides (`x.view(b, T // 4, 4, c)`)
        holds for such sizes only, as torch guards: read the size as a multiple rather
        than keep the division as a constraint, which no small binding of the candidate
        check met at every split (the window splits of a Swin block)."""
        if not self.symbols.hints:  # no traced sizes to choose against (cleave.capture's export)
            return
        for c in constraints:
            read = unification((c.lhs, c.rhs), self.symbols.hints) if c.kind == "eq" else None
            if read:
                raise Unify(f"{self.op}: {c.lhs} = {c.rhs}" + (f" (at {self.loc})" if self.loc else ""), *read)

    def bind(self, fx_node) -> dict:
        return aten_map.bind_args(fx_node, self.value)

    def value(self, raw):
        if isinstance(raw, torch.fx.Node):
            if raw not in self.values:
                raise CaptureError(f"{self.op}: operand {raw.name} was not translated")
            return self.values[raw]
        if isinstance(raw, (list, tuple)):
            return type(raw)(self.value(r) for r in raw)
        return raw

    def size(self, val):
        if isinstance(val, sympy.Expr):  # a size an fx node computed, translated already (a stride n + 1)
            return val
        try:
            return self.symbols.to_expr(val)
        except (TypeError, ValueError) as err:
            raise UnsupportedOpError(self.op, self.loc, str(err)) from None

    def _conform(self, out, val):
        """Cast to torch's result dtype where IR promotion differs; a shape that
        disagrees with torch's is a bug in a rule, reported as such."""
        if isinstance(out, tuple) and isinstance(val, (tuple, list)):
            return tuple(self._conform(o, v) for o, v in zip(out, val))
        if not isinstance(out, Node) or not isinstance(val, torch.Tensor):
            return out
        want = tuple(self.symbols.to_dim(d) for d in val.shape)
        if len(want) != out.rank or not all(D.equal(a, b) for a, b in zip(want, out.shape)):
            raise CaptureError(f"{self.op}: cleave's mapping gives shape {D.fmt_shape(out.shape)} but torch "
                               f"gives {D.fmt_shape(want)}" + (f" (at {self.loc})" if self.loc else ""))
        dtype = ir_dtype(val.dtype, self.op, self.loc)
        return out if out.dtype == dtype else self.add("cast", out, dtype=dtype)

    # -- helpers for rules --------------------------------------------------
    def add(self, op: str, /, *inputs, **attrs) -> Node:
        return self.graph.add(op, *inputs, loc=self.loc, **attrs)

    def const(self, value, dtype) -> Node:
        return self.graph.add("const", value=value, dtype=dtype, loc=self.loc)

    def lift(self, value, like, rounded: bool = False) -> Node:
        """A tensor operand: a Node as is; a Python or symbolic scalar as a const/size
        node of the dtype torch would give it next to `like` (a Node or DType). Beside a
        half it keeps its full value, or with `rounded` takes the half's (as torch
        compares it: x_bf16 == 0.1 holds)."""
        if isinstance(value, Node):
            return value
        like_dtype = like.dtype if isinstance(like, Node) else like
        if isinstance(value, bool) or value is sympy.true or value is sympy.false:
            return self.const(bool(value), "bool")
        if isinstance(value, (int, float)):
            if isinstance(value, float) and not like_dtype.is_float:
                return self.const(value, "f32")
            if like_dtype.is_int:  # torch wraps the int into the type (uint8 x + (-1) adds 255, x == 300 is x == 44)
                low, high = like_dtype.int_range
                value = (value - low) % (high - low + 1) + low
            if like_dtype in (DType.bf16, DType.f16) and rounded:
                # a half const otherwise keeps its value, as torch computes a half tensor with a
                # Python number in f32: x * 1.004 is not x, x_f16 * 1e5 is finite
                value = torch.tensor(value, dtype=TORCH_DTYPES[like_dtype]).item()
            return self.const(value, like_dtype)
        if isinstance(value, sympy.Expr):
            dtype = like_dtype if like_dtype.is_float or value.is_integer else DType.f32
            # beside a half, built in f32 (x_f16 * float(n * 20000) is finite), then rounded once
            scalar = self._scalar_expr(value, op_math(dtype))
            return self.add("cast", scalar, dtype=dtype) if rounded and scalar.dtype != dtype else scalar
        raise UnsupportedOpError(self.op, self.loc, f"operand {value!r} is neither a tensor nor a number")

    def _scalar_expr(self, expr: sympy.Expr, dtype) -> Node:
        # what this builds, scalar_has_ir_form accepts
        if expr.is_number:
            return self.const(float(expr) if not expr.is_integer else int(expr), dtype)
        if expr.is_integer:
            return self.add("size", value=expr, dtype=dtype)
        if isinstance(expr, (sympy.Pow, FloatPow)):  # SDPA's default scale over a dynamic d: d ** -0.5
            base, exp = expr.args
            base = self._scalar_expr(base, dtype)
            special = {0.5: "sqrt", -0.5: "rsqrt", -1.0: "recip"}.get(float(exp)) if exp.is_number else None
            if special is not None:
                return self.add(special, base)
            return self.add("pow", base, self._scalar_expr(exp, dtype))
        if isinstance(expr, (sympy.Add, sympy.Mul)):
            op = "add" if isinstance(expr, sympy.Add) else "mul"
            parts = [self._scalar_expr(a, dtype) for a in expr.args]
            out = parts[0]
            for p in parts[1:]:
                out = self.add(op, out, p)
            return out
        if isinstance(expr, ToFloat):  # a size as a float: the size, in dtype
            return self._scalar_expr(expr.args[0], dtype)
        if isinstance(expr, (FloatTrueDiv, IntTrueDiv)):  # 0.1 / n (label smoothing over a class count)
            return self.add("div", *(self._scalar_expr(a, dtype) for a in expr.args))
        if (function := _math_function(expr)) is not None:  # math.sqrt(d) of a size: Bloom's 1 / math.sqrt(head_dim)
            return self.add(function, self._scalar_expr(expr.args[0], dtype))
        raise UnsupportedOpError(self.op, self.loc, f"scalar {expr} has no IR form")

    def out_shape(self, fx_node) -> tuple:
        return tuple(self.symbols.to_dim(d) for d in fx_node.meta["val"].shape)

    def out_dtype(self, fx_node):
        return ir_dtype(fx_node.meta["val"].dtype, self.op, self.loc)


# what _scalar_expr builds: sympy's arithmetic, and torch's float cast, true division
# and float power of sizes
_SCALAR_FUNCTIONS = (sympy.Pow, sympy.Add, sympy.Mul, ToFloat, FloatTrueDiv, IntTrueDiv, FloatPow)


def scalar_has_ir_form(expr: sympy.Expr) -> bool:
    """Whether Translator._scalar_expr builds `expr`: a number, an integer (a size),
    or powers, sums, products, float casts and true quotients of such. A float of a
    size through math.log2 (Bloom's ALiBi slopes from the head count) is not."""
    if expr.is_number or expr.is_integer:
        return True
    if isinstance(expr, _SCALAR_FUNCTIONS) or _math_function(expr) is not None:
        return all(scalar_has_ir_form(a) for a in expr.args)
    return False


# Python's math functions of a size, as torch's sympy writes them (OpaqueUnaryFn_sqrt),
# that an IR op computes: math.log2 is not (as log / ln 2 it is inexact at powers of 2)
_MATH_FUNCTIONS = ("sqrt", "exp", "log", "cos", "sin", "tanh")


def _math_function(expr) -> str | None:
    name = type(expr).__name__
    prefix = "OpaqueUnaryFn_"
    return name[len(prefix):] if name.startswith(prefix) and name[len(prefix):] in _MATH_FUNCTIONS else None
