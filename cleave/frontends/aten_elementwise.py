"""Elementwise aten ops: arithmetic with tensors and scalars, comparisons, where,
casts, fills, iota-built masks (arange, tril, triu)."""
from __future__ import annotations

import math

import torch

from ..ir import dims as D
from ..ir.dtypes import DType
from ..ir.graph import Constraint
from ..ir.ops import COMPARE, UNARY
from .aten_map import rule
from .scalar_ranges import converting

# aten op -> IR op. aten names every IR unary op the same way but these:
_ATEN_NAME = {"recip": "reciprocal"}
_NO_ATEN_OP = ("inf_to_zero", "bit_not")  # no single aten op computes it (bitwise_not: a rule below)
_UNARY = {_ATEN_NAME.get(op, op): op for op in UNARY if op not in _NO_ATEN_OP}
# add, sub and pow have rules of their own (alpha, special exponents)
_BINARY = {**{op: op for op in COMPARE}, "mul": "mul", "div": "div", "true_divide": "div",
           "maximum": "max", "minimum": "min"}
_POW_SPECIAL = {2: "square", 0.5: "sqrt", -1: "recip", -0.5: "rsqrt"}


def _unary(t, node, a):
    return t.add(_UNARY[node.target._schema.name.split("::")[-1]], a["self"])


def floats_only(a, n):
    """A function torch computes on floating-point tensors only (softmax, gelu, silu): given
    integers or bools it types the result as them and its kernel raises, where the
    kernels would compute it in the integer type. Left to torch, the call raises eager's error."""
    val = n.meta["val"]
    dtype = (val[0] if isinstance(val, (tuple, list)) else val).dtype
    return None if dtype.is_floating_point else f"torch computes it on floating-point tensors only, not {dtype}"


_UNARY_CHECKS = {"silu": floats_only}  # the other float functions of integers give floats (exp, tanh)
for _name in _UNARY:
    # prims ops of the same name are what PyTorch's decompositions leave (round, sign...)
    _prims = [f"prims.{_name}"] if hasattr(torch.ops.prims, _name) else []
    rule(_name, *_prims, check=_UNARY_CHECKS.get(_name))(_unary)


@rule("round.decimals", check=floats_only)
def _round_decimals(t, node, a):
    """round(x * 10^d) / 10^d, or round(x / 10^-d) * 10^-d for d < 0, in the op-math type
    with 10^d as that type holds it, rounded to x's type once: torch's kernel, bit for bit."""
    x, decimals = a["self"], a.get("decimals", 0)
    if not decimals:
        return t.add("round", x)
    wide = _cast(t, x, op_math(x.dtype))
    scale = t.const(float(torch.tensor(10.0 ** abs(decimals), dtype=getattr(torch, wide.dtype.torch_name))),
                    wide.dtype.value)
    if decimals > 0:
        rounded = t.add("div", t.add("round", t.add("mul", wide, scale)), scale)
    else:
        rounded = t.add("mul", t.add("round", t.add("div", wide, scale)), scale)
    return _cast(t, rounded, x.dtype)


@rule("log2", "prims.log2", "log10", "prims.log10")
def _log_base(t, node, a):
    base = 2.0 if "log2" in node.target._schema.name else 10.0
    return binary(t, "mul", t.add("log", a["self"]), 1 / math.log(base))


def op_math(dtype: DType) -> DType:
    """The type torch computes an op of `dtype` in: f32 for the halves, else the type itself."""
    return DType.f32 if dtype in (DType.bf16, DType.f16) else dtype


def _full_scalar(op: str, second: bool) -> bool:
    """Whether torch computes `op` with a scalar operand (a Python number or a 0-dim
    tensor; `second`: on the right) from its full value, in the tensor's op-math type:
    CUDA's add, sub and mul, and its division by a scalar (x_f16 * 1e5 is finite; the CPU
    rounds an added scalar first). Other ops take the scalar rounded to the tensor's
    type, on both (x_bf16 == 0.1 holds, x_f16 ** 2.3 raises x to 2.30078)."""
    return op in ("add", "sub", "mul") or op == "div" and second


def binary(t, op, x, y):
    """x op y where either side may be a scalar (lifted next to the other's dtype)."""
    if not hasattr(x, "graph"):
        x = t.lift(x, _beside(y), rounded=not _full_scalar(op, second=False))
    y = t.lift(y, _beside(x), rounded=not _full_scalar(op, second=True))
    return t.add(op, *_zero_dim_as_the_other(t, *_integer_beside_half(t, x, y), op))


def _integer_beside_half(t, x, y):
    """An integer or bool tensor beside a bf16 or f16 one, converted to the half's type
    first, as torch converts both operands to the promoted type: int32 2049 == f16 2048
    holds (2049 rounds to 2048), and 2049 + f16 0.5 is 2048.5 before its own rounding,
    where the kernels' f32 kept the integer whole."""
    for a, b in ((x, y), (y, x)):
        if b.dtype in (DType.bf16, DType.f16) and not a.dtype.is_float:
            cast = _cast(t, a, b.dtype)
            return (cast, b) if a is x else (b, cast)
    return x, y


def _beside(x):
    """What a scalar operand of a binary op is lifted next to: x, or int64 where x is a
    bool tensor (torch's mask + 2, mask == 2, mask | 2 compute in int64; lifted next to
    the bool, 2 was True)."""
    return DType.i64 if getattr(x, "dtype", None) == DType.bool else x


def _zero_dim_as_the_other(t, x, y, op=None):
    """A 0-dim float tensor beside a float tensor of another width does not promote
    within its category: torch gives the tensor's dtype (an f64 one made the op f64, which
    the kernels do not compute). The 0-dim one is cast to the tensor's op-math type where
    torch computes `op` with its full value (x_f16 * 2**16 in f32, which the translator
    rounds to f16 once: finite), else rounded to the tensor's type (with no op: for every
    op a rule builds from it, as remainder's fmod and add)."""
    for a, b in ((x, y), (y, x)):
        if a.rank == 0 < b.rank and a.dtype != b.dtype and a.dtype.is_float and b.dtype.is_float:
            scalar = _cast(t, a, op_math(b.dtype) if _full_scalar(op, second=a is y) else b.dtype)
            return (scalar, b) if a is x else (b, scalar)
        if a.rank == 0 < b.rank and a.dtype != b.dtype and _integer(a.dtype) and _integer(b.dtype):
            scalar = _cast(t, a, b.dtype)  # wrapped into the tensor's type: 300 beside an int8 is 44
            return (scalar, b) if a is x else (b, scalar)
    return x, y


def _integer(dtype) -> bool:
    return not dtype.is_float and dtype != DType.bool


def _cast(t, x, dtype):
    """x in dtype; an f64 to a half through f32, as torch converts it (the interpreter
    converted an f64 straight to bf16 as 0)."""
    if x.dtype == DType.f64 and dtype in (DType.bf16, DType.f16):
        x = t.add("cast", x, dtype=DType.f32)
    return x if x.dtype == dtype else t.add("cast", x, dtype=dtype)


def _binary(t, node, a):
    return binary(t, _BINARY[node.target._schema.name.split("::")[-1]], a["self"], a["other"])


for _name in _BINARY:
    if _name != "div":
        rule(_name)(_binary)


def _rounding_check(a, n):
    """A rounding division compiles on f32, f64 and integers (an integer division, idiv).
    torch rounds each step of a bf16 or f16 one to that type, where the kernels compute in
    f32: a quotient a bit off floors to another integer."""
    dtype = n.meta["val"].dtype
    if a.get("rounding_mode") and dtype not in (torch.float32, torch.float64) and \
            (dtype.is_floating_point or dtype == torch.bool):
        return f"rounding_mode={a['rounding_mode']!r} on {dtype} is not supported"
    return None


@rule("div", check=_rounding_check)
def _div(t, node, a):
    """x / y, truncated or floored as torch does it. On floats a floor division is
    (x - fmod(x, y)) / y, one less where the remainder's sign differs from y's, rounded
    to the nearest integer; a zero quotient keeps x / y's sign (torch's div_floor). On
    integers it is C's truncated division (idiv), one less where the remainder's sign
    differs from y's: exact over the whole range, where f32 would round past 2**24."""
    mode, x, y = a.get("rounding_mode"), a["self"], a["other"]
    if mode is None:
        return binary(t, "div", *_in_float(t, node, x, y))
    x, y = _operands(t, x, y)
    if not node.meta["val"].dtype.is_floating_point:  # integers: C's division, floored where signs differ
        quotient = binary(t, "idiv", x, y)
        if mode == "trunc":
            return quotient
        return t.add("where", _sign_differs(t, binary(t, "fmod", x, y), y), binary(t, "sub", quotient, 1), quotient)
    quotient = binary(t, "div", x, y)
    if mode == "trunc":
        return t.add("trunc", quotient)
    m = binary(t, "fmod", x, y)
    div = binary(t, "div", binary(t, "sub", x, m), y)
    div = t.add("where", _sign_differs(t, m, y), binary(t, "sub", div, 1.0), div)
    floor = t.add("floor", div)
    floor = t.add("where", binary(t, "gt", binary(t, "sub", div, floor), 0.5), binary(t, "add", floor, 1.0), floor)
    floor = t.add("where", binary(t, "eq", div, 0.0), binary(t, "mul", quotient, 0.0), floor)
    # y = 0: x / y (inf or nan), as torch returns it
    return t.add("where", binary(t, "eq", y, 0.0), quotient, floor)


rule("floor_divide", check=lambda a, n: _rounding_check({"rounding_mode": "floor"}, n))(
    lambda t, n, a: _div(t, n, {**a, "rounding_mode": "floor"}))


def _in_out_dtype(t, node, x):
    """x cast to torch's result dtype (atan2 of integers computes in the default float)."""
    return _cast(t, x, t.out_dtype(node))


@rule("atan2", "arctan2", "prims.atan2", "hypot", "prims.hypot", "copysign.Tensor", "copysign.Scalar")
def _float_binary(t, node, a):
    op = node.target._schema.name.split("::")[-1].replace("arctan2", "atan2")
    x, y = _operands(t, *_in_float(t, node, a["self"], a["other"]))
    return t.add(op, _in_out_dtype(t, node, x), _in_out_dtype(t, node, y))


def _in_float(t, node, x, y):
    """The integer or bool tensors among x and y in the op's float result type, as torch
    converts them before a true division or atan2: a number or 0-dim tensor beside them is
    then not wrapped into their type (`u8 / u8.sum()` at a sum of 256 divided by 0, `i8 /
    300` by 44)."""
    out = t.out_dtype(node)
    if not out.is_float:
        return x, y
    return tuple(_cast(t, v, out) if hasattr(v, "graph") and not v.dtype.is_float else v for v in (x, y))


@rule("signbit", "prims.signbit")
def _signbit(t, node, a):
    """The sign bit, of -0.0 and a negative NaN too: copysign(1, x) < 0; x < 0 on integers."""
    x = a["self"]
    if not x.dtype.is_float:
        return t.add("lt", x, t.lift(0, x))
    return t.add("lt", t.add("copysign", t.lift(1.0, x), x), t.lift(0.0, x))


rule("prims.erf_inv")(lambda t, node, a: t.add("erfinv", _in_out_dtype(t, node, a["self"])))


@rule("fmod", "prims.fmod")
def _fmod(t, node, a):
    return binary(t, "fmod", a["self"], a["other"])


@rule("remainder", "prims.remainder")
def _remainder(t, node, a):
    """Python's modulo: fmod(x, y), plus y where that is not 0 and its sign differs from
    y's (torch's own algorithm, exact on floats and integers)."""
    x, y = _operands(t, a["self"], a["other"])
    m = binary(t, "fmod", x, y)
    return t.add("where", _sign_differs(t, m, y), binary(t, "add", m, y), m)


def _sign_differs(t, m, y):
    """m != 0 and (m < 0) != (y < 0)."""
    zero = t.lift(0, m)
    differs = t.add("ne", t.add("lt", m, zero), t.add("lt", y, t.lift(0, y)))
    return t.add("where", t.add("ne", m, zero), differs, t.const(False, "bool"))


def _operands(t, x, y):
    """x and y as nodes, a scalar (a number or a 0-dim tensor) beside a half rounded to
    its type, as torch takes it in these ops (remainder, atan2, a rounding division...)."""
    x = x if hasattr(x, "graph") else t.lift(x, _beside(y), rounded=True)
    return _zero_dim_as_the_other(t, x, t.lift(y, _beside(x), rounded=True))


for _name in COMPARE:  # prims.ne(x, x) is isnan's decomposition
    rule(f"prims.{_name}")(_binary)
rule("max.other", "min.other")(lambda t, n, a: binary(t, "max" if "max" in str(n.target) else "min",
                                                        a["self"], a["other"]))


def _no_bool_operand(a, n):
    """torch refuses a subtraction with a bool operand (`mask - 0.5`, `1 - mask`: "use the
    ~ operator"), where its meta function and the kernels would compute one. Left to
    torch, the call raises eager's error."""
    def is_bool(x):
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else x
        return isinstance(val, bool) or isinstance(val, torch.Tensor) and val.dtype == torch.bool
    operands = [*n.args[:2], *(n.kwargs[k] for k in ("self", "other") if k in n.kwargs)]
    return "torch refuses a subtraction with a bool operand" if any(map(is_bool, operands)) else None


@rule("add")
@rule("sub", check=_no_bool_operand)
def _add_sub(t, node, a):
    other = a["other"]
    if node.target._schema.name.endswith("add") and node.meta["val"].dtype == torch.bool:
        return _or(t, node, a)  # True + True is True: an add of 1-bit integers wraps to False
    if a.get("alpha", 1) != 1:
        other = _scaled(t, node, other, a["alpha"])
    return binary(t, node.target._schema.name.split("::")[-1], a["self"], other)


@rule("rsub", check=_no_bool_operand)
def _rsub(t, node, a):
    x = a["self"] if a.get("alpha", 1) == 1 else _scaled(t, node, a["self"], a["alpha"])
    return binary(t, "sub", a["other"], x)


def _scaled(t, node, x, alpha):
    """alpha * x as torch computes it inside add/sub: in the result's type (an int8 x times
    3 beside an int32 does not wrap at 8 bits); a number times alpha, a number."""
    if not hasattr(x, "graph"):
        return x * alpha
    if x.rank > 0:
        x = _cast(t, x, t.out_dtype(node))
    return binary(t, "mul", x, alpha)


def _integer_power_check(a, n):
    """An integer power is exact in torch; the kernels' pow goes through exp and log."""
    exp = a["exponent"]
    if n.meta["val"].dtype.is_floating_point or n.meta["val"].dtype == torch.bool:
        return None
    if isinstance(exp, int) and not isinstance(exp, bool) and exp in (0, 1, 2, 3):
        return None
    return "an integer power other than x**0..x**3 (kernels compute pow in floats)"


@rule("pow", check=_integer_power_check)
def _pow(t, node, a):
    base, exp = a["self"], a["exponent"]
    if not hasattr(base, "graph"):  # pow.Scalar: number ** tensor
        return binary(t, "pow", base, exp)
    want = t.out_dtype(node)
    if want.is_float and not base.dtype.is_float:  # int ** 2.0: a float power in torch, never wrapping
        base = t.add("cast", base, dtype=want)
    if isinstance(exp, (int, float)) and not isinstance(exp, bool):
        if exp == 0 and not base.dtype.is_float:  # torch: 1, in the base's integer type
            return t.add("broadcast", t.const(1, base.dtype), shape=base.shape)
        if exp == 1:
            return base
        if exp in _POW_SPECIAL:
            return t.add(_POW_SPECIAL[exp], base)
        if exp in (3, -2):  # as PyTorch computes them: x*x*x and 1/(x*x), not exp(3 log|x|)
            return _cube(t, base) if exp == 3 else t.add("recip", t.add("square", base))
    return binary(t, "pow", base, exp)


def _cube(t, x):
    return t.add("mul", x, t.add("square", x))


def _no_bools(a, n):
    """relu of bools: torch's kernel raises where a max with 0 would compute it."""
    return "torch refuses bool inputs here" if n.meta["val"].dtype == torch.bool else None


@rule("relu", check=_no_bools)
def _relu(t, node, a):
    return binary(t, "max", a["self"], 0)


@rule("gelu", check=floats_only)
def _gelu(t, node, a):
    """0.5 x (1 + erf(x / sqrt(2))), or with approximate='tanh'
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), each in the order torch's CPU
    kernels take: the tanh form halves x first (x times 2 overflowed past 1.7e38, where
    torch's result is finite), the erf form last (torch's is inf there too)."""
    x = a["self"]
    if a.get("approximate") == "tanh":
        inner = binary(t, "mul", t.add("add", x, binary(t, "mul", _cube(t, x), 0.044715)),
                       math.sqrt(2 / math.pi))
        return t.add("mul", binary(t, "mul", x, 0.5), binary(t, "add", t.add("tanh", inner), 1.0))
    return binary(t, "mul", t.add("mul", x, binary(t, "add", t.add("erf", binary(t, "mul", x, math.sqrt(0.5))), 1.0)),
                  0.5)


@converting("clamp", "clamp_min", "clamp_max", scalars=("min", "max"))
def _clamp(t, node, a):
    x, low, high = a["self"], a.get("min"), a.get("max")
    if low is not None:
        x = binary(t, "max", x, low)
    if high is not None:
        x = binary(t, "min", x, high)
    return x


@converting("where", scalars=("self", "other"), in_op_math=True)
def _where(t, node, a):
    """Both branches in torch's result type: where(m, m, 2) is int64, its 2 not True, and
    its bool branch 0 or 1."""
    out = t.out_dtype(node)

    def branch(v):
        if hasattr(v, "graph"):
            return _cast(t, v, out)
        return t.lift(int(v) if isinstance(v, bool) and out != DType.bool else v, out, rounded=True)
    return t.add("where", a["condition"], branch(a["self"]), branch(a["other"]))


@converting("masked_fill", scalars=("value",), tensors=True)
def _masked_fill(t, node, a):
    x = a["self"]
    return t.add("where", a["mask"], t.lift(a["value"], x, rounded=True), x)


def _logical_not(t, node, a):
    x = a["self"]
    return t.add("eq", x, t.const(False, "bool") if x.dtype.value == "bool" else t.lift(0, x))


rule("logical_not")(_logical_not)


def _and(t, node, a):
    x, y = _truths(t, a)
    return t.add("where", x, y, t.const(False, "bool"))


def _or(t, node, a):
    x, y = _truths(t, a)
    return t.add("where", x, t.const(True, "bool"), y)


def _xor(t, node, a):
    x, y = _truths(t, a)
    return t.add("ne", x, y)


def _truths(t, a):
    """Both operands as bools; a Python scalar on either side becomes a constant."""
    x, y = a["self"], a["other"]
    if not hasattr(x, "graph"):
        x, y = y, x
    if not hasattr(y, "graph"):
        return _truth(t, x), t.const(bool(y), "bool")
    return _truth(t, x), _truth(t, y)


rule("logical_and")(_and)
rule("logical_or")(_or)
rule("logical_xor")(_xor)


def _no_floats(a, n):
    dtype = n.meta["val"].dtype
    return f"bitwise ops of {dtype} are not supported" if dtype.is_floating_point else None


def _bitwise(op, logical):
    """On bools the logical op (what the rules know: selects and compares); on integers
    the bit op, in torch's result type."""
    def lower(t, node, a):
        if node.meta["val"].dtype == torch.bool:
            return logical(t, node, a)
        return binary(t, op, *_operands(t, a["self"], a["other"]))
    return lower


for _op, _fn in (("and", _and), ("or", _or), ("xor", _xor)):
    rule(f"bitwise_{_op}", f"__{_op}__", f"prims.bitwise_{_op}", check=_no_floats)(_bitwise(f"bit_{_op}", _fn))
for _op, _torch_dir, _prims in (("shl", "left", ("prims.shift_left",)),
                                ("shr", "right", ("prims.shift_right_arithmetic",))):
    rule(f"bitwise_{_torch_dir}_shift", f"__{_torch_dir[0]}shift__", *_prims, check=_no_floats)(
        _bitwise(_op, None))


@rule("bitwise_not", "prims.bitwise_not", check=_no_floats)
def _bitwise_not(t, node, a):
    x = a["self"]
    return _logical_not(t, node, {"self": x}) if x.dtype.value == "bool" else t.add("bit_not", x)


def _truth(t, x):
    return x if x.dtype.value == "bool" else t.add("ne", x, t.lift(0, x))


def _same(t, node, a):
    """Casts and copies: the translator casts to torch's result dtype when it differs."""
    return a["self"]


rule("to", "_to_copy", "type_as", "clone", "contiguous", "alias", "detach", "detach_", "lift_fresh_copy")(_same)
rule("prims.convert_element_type")(lambda t, node, a: a["a"])


@rule("dropout", check=lambda a, n: None if a["train"] is False or a["p"] == 0 else "dropout in training mode")
def _dropout(t, node, a):
    return a["input"]


@rule("rrelu_with_noise_functional", check=lambda a, n: "rrelu in training mode (random slopes)" if a.get("training")
      else floats_only(a, n))
def _rrelu_eval(t, node, a):
    """Out of training, rrelu is leaky_relu with the slope (lower + upper) / 2, as torch
    computes it: x where x > 0, else x times the slope; the noise buffer is not touched."""
    x, slope = a["self"], (a.get("lower", 0.125) + a.get("upper", 1 / 3)) / 2
    return t.add("where", t.add("gt", x, t.lift(0, x)), x, binary(t, "mul", x, slope)), a["noise"]


def fill(t, node, value):
    """A tensor of torch's output shape holding one value, in its dtype: a half's fill is
    rounded to it (torch.full_like(x_bf16, 0.1).float() is 0.10009765625)."""
    out = t.lift(value, t.out_dtype(node), rounded=True)
    dtype = t.out_dtype(node)
    if out.dtype != dtype:
        out = t.add("cast", out, dtype=dtype)
    shape = t.out_shape(node)
    return t.add("broadcast", out, shape=shape) if shape else out


rule("ones", "ones_like", "new_ones")(lambda t, n, a: fill(t, n, 1))
rule("zeros", "zeros_like", "new_zeros")(lambda t, n, a: fill(t, n, 0))
# torch.empty's values are whatever memory held: zeros are one such (rrelu's unused noise)
rule("empty.memory_format", "empty_like", "new_empty")(lambda t, n, a: fill(t, n, 0))
converting("full", "full_like", "new_full", scalars=("fill_value",))(
    lambda t, n, a: fill(t, n, a["fill_value"]))
converting("scalar_tensor", "prims.scalar_tensor", scalars=("s",), in_op_math=True)(
    lambda t, n, a: fill(t, n, a["s"]))


def _arange_check(a, n):
    start, step = a.get("start") or 0, a.get("step", 1)
    if step == 1:
        return None
    if isinstance(start, (int, torch.SymInt)) and isinstance(step, int):
        return None
    return "a step other than 1 needs an integer start and a constant integer step"


@rule("arange", check=_arange_check)
def _arange(t, node, a):
    """start + i·step. A step other than 1 is computed in i64 and cast once, as torch
    computes in a wider type and rounds once (exact for integer start and step); a half
    arange counts in f32 and is rounded once (bf16's 257 is 256)."""
    start, step = a.get("start") or 0, a.get("step", 1)
    length = t.out_shape(node)[0]
    if length.free_symbols:  # eager raises where the bounds run against the step: keep its error
        t.graph._constrain(Constraint("le", D.dim(0), length, f"{t.op}'s length (eager: upper bound and lower bound "
                                                             f"inconsistent with step sign)"))
    if step == 1:
        out = t.add("iota", shape=t.out_shape(node), axis=0, dtype=op_math(t.out_dtype(node)))
        return out if start == 0 else binary(t, "add", out, start)
    out = binary(t, "mul", t.add("iota", shape=t.out_shape(node), axis=0, dtype="i64"), step)
    return out if start == 0 else binary(t, "add", out, start)


def _tri(keep_lower: bool):
    def fn(t, node, a):
        x, diag = a["self"], a.get("diagonal", 0) or 0
        rows, cols = x.shape[-2], x.shape[-1]
        i = t.add("iota", shape=(rows, cols), axis=0, dtype="i64")
        j = t.add("iota", shape=(rows, cols), axis=1, dtype="i64")
        bound = i if diag == 0 else binary(t, "add", i, diag)
        keep = t.add("le", j, bound) if keep_lower else t.add("ge", j, bound)
        zero = t.const(False, "bool") if x.dtype.value == "bool" else t.lift(0, x)
        return t.add("where", keep, x, zero)
    return fn


rule("tril")(_tri(True))
rule("triu")(_tri(False))
