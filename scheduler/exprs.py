"""Print sympy index and extent expressions as Triton/Python integer code."""
from __future__ import annotations

import functools
import math

import sympy


def code(expr, names: dict | None = None) -> str:
    """Integer code for `expr`; `names` maps symbols to the code that stands for them
    (an index tensor with its broadcast, a kernel argument)."""
    names = names or {}
    return _p(sympy.sympify(expr), names)


def _p(e, names) -> str:
    if e in names:
        return names[e]
    if isinstance(e, sympy.Symbol):
        return e.name
    if isinstance(e, sympy.Integer):
        return str(int(e))
    if isinstance(e, sympy.Rational):
        raise ValueError(f"index expression {e} is not an integer")
    if isinstance(e, sympy.Add):
        terms = [_p(a, names) for a in e.args]
        return "(" + " + ".join(terms) + ")"
    if isinstance(e, sympy.Mul):
        num, den = sympy.fraction(e)
        if den != 1:
            return _floor_code(num, den, names)
        return "(" + " * ".join(_p(a, names) for a in e.args) + ")"
    if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and e.exp > 0:
        return "(" + " * ".join([_p(e.base, names)] * int(e.exp)) + ")"
    if isinstance(e, sympy.ceiling):
        num, den = _fraction(e.args[0])
        n, d = _p(num, names), _p(den, names)
        if not _nonnegative(num):
            return f"(({n} + ({d} - {_mod(n, d)}) % {d}) // {d})"
        return f"(({n} + {d} - 1) // {d})"
    if isinstance(e, sympy.floor):
        num, den = _fraction(e.args[0])
        return _floor_code(num, den, names)
    if isinstance(e, sympy.Mod):
        a, m = _p(e.args[0], names), _p(e.args[1], names)
        return _mod(a, m) if not _nonnegative(e.args[0]) else f"({a} % {m})"
    if isinstance(e, (sympy.Max, sympy.Min)):
        return functools.reduce(lambda a, b: _pick(a, b, ">" if isinstance(e, sympy.Max) else "<"),
                                (_p(a, names) for a in e.args))
    if isinstance(e, sympy.Abs):  # an int argument's magnitude (`x << abs(k)`), in arithmetic as _pick
        a = _p(e.args[0], names)
        return f"({a} * (1 - 2 * ({a} < 0)))"
    raise ValueError(f"cannot print index expression {e}")


def _pick(a: str, b: str, better: str) -> str:
    """b where b is greater (less) than a, else a, in arithmetic: the same code serves a
    kernel's index tensors, its scalar arguments and the host's grid (max(1, n // 2) rows
    of a slice), where neither tl.maximum nor Python's max serves all three."""
    return f"({a} + ({b} - {a}) * ({b} {better} {a}))"


# Triton's // and % truncate toward 0 on integers, as C's (on the GPU and in the
# interpreter), where sympy's floor and Mod, and the host's grid in Python, floor: a
# numerator that may be negative (the pad to a multiple of n, Mod(-s, n)) gets forms
# exact under both, for a positive divisor.
def _mod(a: str, m: str) -> str:
    return f"((({a} % {m}) + {m}) % {m})"


def _floor_code(num, den, names) -> str:
    n, d = _p(num, names), _p(den, names)
    if not _nonnegative(num):
        return f"(({n} - {_mod(n, d)}) // {d})"
    return f"({n} // {d})"


@functools.lru_cache(maxsize=4096)
def _nonnegative(e) -> bool:
    return bool(e.is_nonnegative)


@functools.lru_cache(maxsize=4096)
def _fraction(e) -> tuple:
    """Numerator and denominator of a quotient: sympy's together() is slow, and codegen
    prints the same index expressions over and over."""
    return sympy.fraction(sympy.together(e))


def value(expr, env: dict) -> int:
    """The integer that `expr`'s printed code computes, with env giving each symbol's
    value by name (a loop bound evaluated at schedule time, as the kernel will)."""
    return _evaluator(sympy.sympify(expr))(env)


@functools.lru_cache(maxsize=4096)
def _evaluator(e):
    """expr as a function of the symbols' values, case by case as _p prints it (a
    quotient is a floor division there, not a rational)."""
    if isinstance(e, sympy.Symbol):
        name = e.name
        return lambda env: env[name]
    if isinstance(e, sympy.Integer):
        n = int(e)
        return lambda env: n
    if isinstance(e, sympy.Rational):
        raise ValueError(f"index expression {e} is not an integer")
    if isinstance(e, sympy.Add):
        terms = [_evaluator(a) for a in e.args]
        return lambda env: sum(t(env) for t in terms)
    if isinstance(e, sympy.Mul):
        num, den = sympy.fraction(e)
        if den != 1:
            return _floordiv(_evaluator(num), _evaluator(den))
        factors = [_evaluator(a) for a in e.args]
        return lambda env: math.prod(f(env) for f in factors)
    if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and e.exp > 0:
        base, k = _evaluator(e.base), int(e.exp)
        return lambda env: base(env) ** k
    if isinstance(e, sympy.ceiling):
        num, den = (_evaluator(x) for x in _fraction(e.args[0]))
        return lambda env: (num(env) + den(env) - 1) // den(env)
    if isinstance(e, sympy.floor):
        return _floordiv(*(_evaluator(x) for x in _fraction(e.args[0])))
    if isinstance(e, sympy.Mod):
        a, m = _evaluator(e.args[0]), _evaluator(e.args[1])
        return lambda env: a(env) % m(env)
    if isinstance(e, (sympy.Max, sympy.Min)):
        pick, args = (max if isinstance(e, sympy.Max) else min), [_evaluator(a) for a in e.args]
        return lambda env: pick(a(env) for a in args)
    raise ValueError(f"cannot evaluate index expression {e}")


def _floordiv(num, den):
    return lambda env: num(env) // den(env)


def evaluate(text: str, env: dict[str, int]) -> int:
    """Evaluate a printed grid or shape expression with integer symbol values."""
    return int(eval(text, {"__builtins__": {}, "cdiv": lambda a, b: -(-a // b), "max": max}, dict(env)))
