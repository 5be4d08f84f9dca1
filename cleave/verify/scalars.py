"""Scalar algebra with IEEE infinities folded in Python, the rest handed to a backend.

A scalar is one of: a Python bool, an exact finite number (Fraction), an IEEE
special (the floats inf, -inf, nan), or a backend expression (a z3 or sympy term,
always finite: inputs are finite reals). Pads of -inf are concrete at a concrete
binding, so folding them here keeps the provers' queries in plain real
arithmetic and gives max-with-pad rules their exact IEEE meaning. Where a special
would meet a symbolic value in a way that depends on that value (inf * x, or a
`where` choosing between inf and x), lowering raises Unsupported: the prover then
answers unknown instead of guessing.
"""
from __future__ import annotations

import math
import operator
from fractions import Fraction

from ..ir.ops import LOG2E, per_op

_BIT_OPS = {"bit_and": operator.and_, "bit_or": operator.or_, "bit_xor": operator.xor,
            "shl": operator.lshift, "shr": operator.rshift}

INF, NINF, NAN = math.inf, -math.inf, math.nan


class Unsupported(Exception):
    """The scalar lowering cannot express this exactly; the prover must say unknown."""


def is_special(v) -> bool:
    return isinstance(v, float)


def is_num(v) -> bool:
    return isinstance(v, (Fraction, int)) and not isinstance(v, bool)


def number(value) -> object:
    """A Python constant as a scalar: exact when finite, a special otherwise."""
    if isinstance(value, bool):
        return value
    f = float(value)
    if math.isinf(f) or math.isnan(f):
        return f
    return Fraction(value) if isinstance(value, int) else Fraction(f)


def _to_float(v) -> float:
    return float(v)


def _special_result(value: float):
    """The result of a float operation on specials/numbers, back as a scalar."""
    return number(value) if not (math.isinf(value) or math.isnan(value)) else value


class Algebra:
    """IEEE-folding front of a backend (see backends.py for the interface)."""

    def __init__(self, backend):
        self.b = backend

    def lift(self, v):
        if isinstance(v, bool):
            return self.b.boolean(v)
        if is_num(v):
            return self.b.num(Fraction(v))
        if is_special(v):
            raise Unsupported(f"{v} meets a symbolic value")
        return v

    # -- arithmetic -----------------------------------------------------
    def add(self, x, y):
        if is_special(x) or is_special(y):
            return _special_result(_to_float(x) + _to_float(y)) if self._concrete(x, y) else (x if is_special(x) else y)
        if is_num(x) and is_num(y):
            return Fraction(x) + Fraction(y)
        if is_num(x) and x == 0:
            return y
        if is_num(y) and y == 0:
            return x
        return self.b.add(self.lift(x), self.lift(y))

    def neg(self, x):
        if is_special(x) or is_num(x):
            return -x
        return self.b.neg(x)

    def sub(self, x, y):
        return self.add(x, self.neg(y))

    def mul(self, x, y):
        if is_special(x) or is_special(y):
            if self._concrete(x, y):
                return _special_result(_to_float(x) * _to_float(y))
            raise Unsupported("an infinity times a symbolic value (its sign and zeroness decide)")
        if is_num(x) and is_num(y):
            return Fraction(x) * Fraction(y)
        for a, c in ((x, y), (y, x)):
            if is_num(a) and a == 0:
                return Fraction(0)
            if is_num(a) and a == 1:
                return c
        return self.b.mul(self.lift(x), self.lift(y))

    def div(self, x, y):
        if is_num(y) and y == 0 or is_special(x) or is_special(y):
            if self._concrete(x, y):
                return _special_result(_ieee_div(_to_float(x), _to_float(y)))
            if is_special(y) and not is_special(x):
                return NAN if math.isnan(y) else Fraction(0)
            raise Unsupported("a division whose IEEE result depends on a symbolic value")
        if is_num(x) and is_num(y):
            return Fraction(x) / Fraction(y)
        if is_num(y) and y == 1:
            return x
        return self.b.div(self.lift(x), self.lift(y))

    def max(self, x, y):
        return self._extremum(x, y, max, self.b.max, NINF)

    def min(self, x, y):
        return self._extremum(x, y, min, self.b.min, INF)

    def _extremum(self, x, y, pick, sym, neutral):
        for a, c in ((x, y), (y, x)):
            if is_special(a):
                if math.isnan(a):
                    return NAN  # torch.maximum/minimum propagate NaN
                if a == neutral:
                    return c
                if not is_special(c) or not math.isnan(c):
                    return a  # the absorbing infinity
        if self._concrete(x, y):
            return pick(Fraction(x), Fraction(y))
        return sym(self.lift(x), self.lift(y))

    # -- comparisons and selection --------------------------------------
    def compare(self, op: str, x, y):
        if self._concrete(x, y) or is_special(x) or is_special(y):
            if not self._concrete(x, y):
                # a special against a finite symbolic value: the infinity decides
                fx = _to_float(x) if is_special(x) else 0.0
                fy = _to_float(y) if is_special(y) else 0.0
                return COMPARISONS[op](fx, fy)
            return COMPARISONS[op](_to_float(x) if is_special(x) else Fraction(x),
                                    _to_float(y) if is_special(y) else Fraction(y))
        return self.b.compare(op, self.lift(x), self.lift(y))

    def where(self, c, x, y):
        if isinstance(c, bool):
            return x if c else y
        if _same(x, y):
            return x
        if is_special(x) or is_special(y):
            raise Unsupported("a where choosing between an infinity and a symbolic value")
        return self.b.ite(c, self.lift(x), self.lift(y))

    def to_real(self, c):
        """A bool as 0/1 (cast of a comparison)."""
        if isinstance(c, bool):
            return Fraction(int(c))
        return self.b.ite(c, self.b.num(Fraction(1)), self.b.num(Fraction(0)))

    # -- transcendental --------------------------------------------------
    def exp(self, x):
        if is_special(x):
            return Fraction(0) if x == NINF else x
        if is_num(x) and x == 0:
            return Fraction(1)
        return self.b.exp(self.lift(x))

    def log(self, x):
        if is_special(x):
            return x if x == INF else NAN
        if is_num(x):
            if x == 1:
                return Fraction(0)
            if x == 0:
                return NINF
            if x < 0:
                return NAN
        return self.b.log(self.lift(x))

    def sqrt(self, x):
        if is_special(x):
            return x if x == INF else NAN
        if is_num(x) and x < 0:
            return NAN
        if is_num(x) and x in (0, 1):
            return Fraction(x)
        return self.b.sqrt(self.lift(x))

    def unary(self, op: str, x):
        """The ops defined by the others, or uninterpreted."""
        if op == "exp":
            return self.exp(x)
        if op == "exp2":  # 2^x = e^(x / LOG2E), LOG2E the float the rules multiply by (exact here)
            return self.exp(self.mul(x, 1 / Fraction(LOG2E)))
        if op == "log":
            return self.log(x)
        if op == "sqrt":
            return self.sqrt(x)
        if op == "rsqrt":
            return self.div(Fraction(1), self.sqrt(x))
        if op == "neg":
            return self.neg(x)
        if op == "recip":
            return self.div(Fraction(1), x)
        if op == "square":
            return self.mul(x, x)
        if op == "abs":
            return self.max(x, self.neg(x))
        if op == "bit_not" and isinstance(x, bool):
            return not x
        if op == "bit_not" and is_num(x) and Fraction(x).denominator == 1:
            return Fraction(~int(x))
        if op == "inf_to_zero":  # symbolic values are finite: only a special changes
            return Fraction(0) if is_special(x) and math.isinf(x) else x
        if op == "sigmoid":
            return self.div(Fraction(1), self.add(Fraction(1), self.exp(self.neg(x))))
        if op == "silu":
            return self.mul(x, self.unary("sigmoid", x))
        if is_special(x):
            raise Unsupported(f"{op} of an infinity")
        if is_num(x) and op in ("tanh", "sin") and x == 0:
            return Fraction(0)
        return self.b.uf(op, self.lift(x))

    def fmod(self, x, y):
        """x - trunc(x / y) * y, exact on numbers; uninterpreted on symbols."""
        if is_special(x) or is_special(y):
            raise Unsupported("fmod of an infinity")
        if is_num(x) and is_num(y) and y != 0:
            x, y = Fraction(x), Fraction(y)
            q = x / y
            return x - (math.floor(q) if q >= 0 else math.ceil(q)) * y
        return self.b.uf("fmod", self.lift(x), self.lift(y))

    def idiv(self, x, y):
        """trunc(x / y), exact on numbers; uninterpreted on symbols."""
        if is_special(x) or is_special(y):
            raise Unsupported("idiv of an infinity")
        if is_num(x) and is_num(y) and y != 0:
            q = Fraction(x) / Fraction(y)
            return Fraction(math.floor(q) if q >= 0 else math.ceil(q))
        return self.b.uf("idiv", self.lift(x), self.lift(y))

    def atan2(self, x, y):
        return self._transcendental("atan2", x, y)

    def hypot(self, x, y):
        return self._transcendental("hypot", x, y)

    def copysign(self, x, y):
        return self._transcendental("copysign", x, y)

    def bit_and(self, x, y):
        return self._bitwise("bit_and", x, y)

    def bit_or(self, x, y):
        return self._bitwise("bit_or", x, y)

    def bit_xor(self, x, y):
        return self._bitwise("bit_xor", x, y)

    def shl(self, x, y):
        return self._bitwise("shl", x, y)

    def shr(self, x, y):
        return self._bitwise("shr", x, y)

    def _bitwise(self, op, x, y):
        """Exact on integers (Python's ints are two's complement of unbounded width, as
        narrow ones are until they wrap); uninterpreted otherwise."""
        if isinstance(x, bool) and isinstance(y, bool):
            return _BIT_OPS[op](x, y)
        if is_num(x) and is_num(y) and Fraction(x).denominator == Fraction(y).denominator == 1 and \
                (op not in ("shl", "shr") or 0 <= y < 64):
            return Fraction(_BIT_OPS[op](int(x), int(y)))
        return self._transcendental(op, x, y)

    def _transcendental(self, op, x, y):
        """Uninterpreted: no rule rewrites these ops, so their values need only be equal."""
        if is_special(x) or is_special(y):
            raise Unsupported(f"{op} of an infinity")
        return self.b.uf(op, self.lift(x), self.lift(y))

    def pow(self, x, y):
        if is_num(y) and Fraction(y).denominator == 1 and 0 <= y <= 8:
            out = Fraction(1)
            for _ in range(int(y)):
                out = self.mul(out, x)
            return out
        if is_num(y) and y == Fraction(1, 2):
            return self.sqrt(x)
        if is_special(x) or is_special(y):
            raise Unsupported("pow of an infinity")
        return self.b.uf("pow", self.lift(x), self.lift(y))

    def sum(self, xs):
        specials = [v for v in xs if is_special(v)]
        if specials:
            total = 0.0
            for v in specials:
                total += v
            return total
        nums = sum((Fraction(v) for v in xs if is_num(v)), Fraction(0))
        terms = [v for v in xs if not is_num(v)]
        if not terms:
            return nums
        if nums != 0:
            terms.append(self.b.num(nums))
        return terms[0] if len(terms) == 1 else self.b.sum(terms)

    @staticmethod
    def _concrete(*vals) -> bool:
        return all(is_num(v) or is_special(v) for v in vals)


def _same(x, y) -> bool:
    if is_special(x) and is_special(y):
        return x == y or (math.isnan(x) and math.isnan(y))
    if is_num(x) and is_num(y):
        return x == y
    return x is y


def _ieee_div(x: float, y: float) -> float:
    if y == 0:
        if x == 0 or math.isnan(x):
            return NAN
        return math.copysign(INF, x)
    return x / y


# Python's comparison operators, which z3's terms overload too.
COMPARISONS = per_op({"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
                      "eq": operator.eq, "ne": operator.ne}, "compare", where="verify/scalars.py")
