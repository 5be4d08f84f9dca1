"""The two symbolic backends of the scalar algebra: z3 (the prover) and sympy (its fallback).

Both build terms for finite reals. Transcendental functions are uninterpreted in z3;
instead of quantified axioms (which time out), `Z3Backend.laws()` returns ground
instances of the exp/log/sqrt laws on exactly the terms that occur, plus the domain
premises (non-zero divisors, positive log arguments, non-negative sqrt arguments).
"""
from __future__ import annotations

from fractions import Fraction

import sympy
import z3

from .scalars import COMPARISONS, Unsupported


# Monotonicity is stated for every pair of exp atoms when there are at most this many.
MONOTONE_PAIRS_UP_TO = 40


class _FieldOps:
    """+, - and * are the host library's own operators in both backends."""

    def add(self, a, b):
        return a + b

    def neg(self, a):
        return -a

    def mul(self, a, b):
        return a * b


class Z3Backend(_FieldOps):
    def __init__(self):
        self._funcs: dict[tuple[str, int], z3.FuncDeclRef] = {}
        self.exp_args: dict[int, z3.ArithRef] = {}
        self.log_args: dict[int, z3.ArithRef] = {}
        self.sqrt_args: dict[int, z3.ArithRef] = {}
        self.premises: list[z3.BoolRef] = []
        self.domains: set[int] = set()  # the premises that are log and sqrt domains (not divisors)
        self.obligations: list[z3.BoolRef] = []  # the rhs's domain, where the lhs's does not imply it
        self._extrema: dict[int, tuple] = {}  # id of a max/min term -> (kind, its leaves)
        self._canon: dict[tuple, z3.ArithRef] = {}

    def functions(self) -> list[str]:
        """The ops z3 holds as uninterpreted functions (exp, erf, sin...), constrained by
        the laws given for them only."""
        return sorted({name for name, _ in self._funcs})

    def _f(self, name: str, arity: int = 1) -> z3.FuncDeclRef:
        key = (name, arity)
        if key not in self._funcs:
            self._funcs[key] = z3.Function(name, *([z3.RealSort()] * (arity + 1)))
        return self._funcs[key]

    # -- leaves ---------------------------------------------------------
    def var(self, name: str, kind: str):
        return {"real": z3.Real, "int": z3.Int, "bool": z3.Bool}[kind](name)

    def num(self, value: Fraction):
        return z3.RealVal(value)

    def boolean(self, value: bool):
        return z3.BoolVal(value)

    # -- operations -----------------------------------------------------
    def div(self, a, b):
        self.premises.append(b != 0)
        return _real(a) / _real(b)

    def max(self, a, b):
        return self._extremum("max", a, b)

    def min(self, a, b):
        return self._extremum("min", a, b)

    def _extremum(self, kind, a, b):
        """max/min are associative and commutative: one canonical term per set of leaves,
        so max(max(a,b),c) and max(a,max(b,c)) are the same z3 term."""
        leaves: dict[int, z3.ArithRef] = {}
        for t in (a, b):
            k, ls = self._extrema.get(t.get_id(), (None, None))
            for leaf in (ls if k == kind else (t,)):
                leaves.setdefault(leaf.get_id(), leaf)
        key = (kind, tuple(sorted(leaves)))
        if key not in self._canon:
            items = [leaves[i] for i in sorted(leaves)]
            out = items[0]
            for t in items[1:]:
                out = z3.If(out >= t, out, t) if kind == "max" else z3.If(out <= t, out, t)
            self._canon[key] = out
            self._extrema[out.get_id()] = (kind, tuple(items))
        return self._canon[key]

    def compare(self, op, a, b):
        if z3.is_bool(a) or z3.is_bool(b):
            a, b = _as_int(a), _as_int(b)
        return COMPARISONS[op](a, b)

    def ite(self, c, a, b):
        return z3.If(c, a, b)

    def sum(self, terms):
        return z3.Sum(*terms)

    def assume(self, fact):
        self.premises.append(fact)

    def exp(self, a):
        """exp in normal form: exp(c0 + sum c_k t_k) = E(c0) * prod E(t_k)^c_k over the
        non-linear atoms t_k of the argument. This applies exp(a+b) = exp(a)exp(b) and
        exp(-a) = 1/exp(a) once and for all, so no pair laws are needed (they grow as
        the square of the terms and dominated the time)."""
        atoms, const = _linear(_real(a))
        factors = []
        if const != 0:
            factors.append(self._exp_atom(z3.RealVal(const)))
        for atom, c in atoms.values():
            if z3.is_app_of(atom, z3.Z3_OP_ITE):  # exp(If(p, a, b)) = If(p, exp a, exp b)
                p, then, other = atom.children()
                factors.append(z3.If(p, self.exp(c * then), self.exp(c * other)))
                continue
            if c.denominator != 1:
                factors.append(self._exp_atom(z3.simplify(z3.RealVal(c) * atom)))
                continue
            base = self._exp_atom(atom)
            power = base if abs(c) == 1 else z3.Product(*([base] * abs(int(c))))
            factors.append(power if c > 0 else 1 / power)
        if not factors:
            return z3.RealVal(1)
        return factors[0] if len(factors) == 1 else z3.Product(*factors)

    def _exp_atom(self, t):
        self.exp_args.setdefault(t.get_id(), t)
        return self._f("exp")(t)

    def log(self, a):
        a = z3.simplify(_real(a))
        self.log_args.setdefault(a.get_id(), a)
        self.premises.append(a > 0)
        self.domains.add(self.premises[-1].get_id())
        return self._f("log")(a)

    def sqrt(self, a):
        a = z3.simplify(_real(a))
        self.sqrt_args.setdefault(a.get_id(), a)
        self.premises.append(a >= 0)
        self.domains.add(self.premises[-1].get_id())
        return self._f("sqrt")(a)

    def uf(self, name, *args):
        return self._f(name, len(args))(*(_real(a) for a in args))

    # -- ground laws ------------------------------------------------------
    def laws(self) -> list[z3.BoolRef]:
        """Ground instances, over the terms that occur, of: exp > 0, exp monotone,
        log(exp t) = t, exp(log a) = a, log(a) = log(b) + log(a/b), log monotone,
        sqrt(a)^2 = a, sqrt >= 0, sqrt monotone (exp's algebra is in its normal form)."""
        E, L, S = self._f("exp"), self._f("log"), self._f("sqrt")
        out = list(self.premises)
        exps = list(self.exp_args.values())
        for a in exps:
            out.append(E(a) > 0)
            out.append(L(E(a)) == a)
        if len(exps) <= MONOTONE_PAIRS_UP_TO:
            for i, a in enumerate(exps):
                for b in exps[i + 1:]:
                    out.append(z3.Implies(a < b, E(a) < E(b)))
                    out.append(z3.Implies(b < a, E(b) < E(a)))
        logs = list(self.log_args.values())
        for a in logs:
            out.append(E(L(a)) == a)
        for i, a in enumerate(logs):
            for j, b in enumerate(logs):
                if i != j:
                    out.append(L(a) == L(b) + L(z3.simplify(a / b)))
                if i < j:
                    out.append(z3.Implies(a < b, L(a) < L(b)))
                    out.append(z3.Implies(b < a, L(b) < L(a)))
        roots = list(self.sqrt_args.values())
        for a in roots:
            out.append(S(a) >= 0)
            out.append(S(a) * S(a) == a)
        for i, a in enumerate(roots):
            for b in roots[i + 1:]:
                out.append(z3.Implies(a < b, S(a) < S(b)))
                out.append(z3.Implies(b < a, S(b) < S(a)))
        return out


def _linear(e) -> tuple[dict[int, tuple], Fraction]:
    """e as c0 + sum c_k t_k: {id(t_k): (t_k, c_k)}, c0; the t_k are its non-linear atoms."""
    atoms: dict[int, tuple] = {}
    const = Fraction(0)

    def walk(t, c: Fraction):
        nonlocal const
        if z3.is_rational_value(t):
            const += c * t.as_fraction()
        elif z3.is_add(t):
            for k in t.children():
                walk(k, c)
        elif z3.is_sub(t):
            first, *rest = t.children()
            walk(first, c)
            for k in rest:
                walk(k, -c)
        elif t.decl().kind() == z3.Z3_OP_UMINUS:
            walk(t.children()[0], -c)
        elif z3.is_to_real(t):
            walk(t.children()[0], c)
        elif z3.is_mul(t) and len(t.children()) == 2 and z3.is_rational_value(t.children()[0]):
            walk(t.children()[1], c * t.children()[0].as_fraction())
        elif z3.is_mul(t) and len(t.children()) == 2 and z3.is_rational_value(t.children()[1]):
            walk(t.children()[0], c * t.children()[1].as_fraction())
        else:
            key = t.get_id()
            atom, old = atoms.get(key, (t, Fraction(0)))
            atoms[key] = (atom, old + c)

    walk(e, Fraction(1))
    return {k: v for k, v in atoms.items() if v[1] != 0}, const


def _real(a):
    if z3.is_bool(a):
        return z3.If(a, z3.RealVal(1), z3.RealVal(0))
    return z3.ToReal(a) if z3.is_int(a) else a


def _as_int(a):
    return z3.If(a, 1, 0) if z3.is_bool(a) else a


class SympyBackend(_FieldOps):
    """Exact sympy terms; comparisons that sympy decides come back as Python bools."""

    def __init__(self):
        self.premises: list = []

    def var(self, name: str, kind: str):
        if kind == "bool":
            return sympy.Symbol(name)
        return sympy.Symbol(name, real=True, integer=(kind == "int"))

    def num(self, value: Fraction):
        return sympy.Rational(value.numerator, value.denominator)

    def boolean(self, value: bool):
        return sympy.true if value else sympy.false

    def div(self, a, b):
        return a / b

    def max(self, a, b):
        return sympy.Max(a, b)

    def min(self, a, b):
        return sympy.Min(a, b)

    def compare(self, op, a, b):
        rel = {"lt": sympy.Lt, "le": sympy.Le, "gt": sympy.Gt, "ge": sympy.Ge,
               "eq": sympy.Eq, "ne": sympy.Ne}[op](a, b)
        if rel in (sympy.true, sympy.false):
            return bool(rel)
        return rel

    def ite(self, c, a, b):
        # sympy's Piecewise construction alone took 40 s on a top-k network, and
        # simplify rarely decides it: leave such terms to z3
        raise Unsupported("sympy is not used on piecewise (where/top-k) terms")

    def sum(self, terms):
        return sympy.Add(*terms)

    def assume(self, fact):
        self.premises.append(fact)

    def exp(self, a):
        return sympy.exp(a)

    def log(self, a):
        return sympy.log(a)

    def sqrt(self, a):
        return sympy.sqrt(a)

    def uf(self, name, *args):
        return sympy.Function(name)(*args)
