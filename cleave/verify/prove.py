"""Prove lhs == rhs elementwise at one concrete binding: z3 first, sympy where z3 is unsure.

z3 sees uninterpreted exp/log/sqrt plus ground instances of their laws (backends.py),
so a z3 model may satisfy the laws yet not be real arithmetic: every model is
re-checked in fp64 by the interpreter, and only a confirmed one is a counterexample.
The proof holds on the real-valued domain (divisors non-zero, log arguments
positive, sqrt arguments non-negative); IEEE specials coming from pads and
constants are exact (scalars.py), and so are those a mask selects: bool inputs are
enumerated. Infinities and NaN in the data, and f32's range and rounding, are the
numeric gate's (numeric.py). Unknown is never proven.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
import sympy
import torch
import z3

from ..interpreter import TORCH_DTYPES
from ..ir import CleaveError
from ..ir.contracts import RuleInstance
from .backends import SympyBackend, Z3Backend
from .bindings import Binding
from .scalarise import input_arrays, scalarise
from .numeric import STYLES, evaluate, first_mismatch, random_inputs, show_inputs
from .scalars import Algebra, Unsupported, is_num, is_special


# The first z3 attempt: what z3 proves, it mostly proves fast; sympy gets its turn next.
SHORT_MS = 500
# Bool inputs are enumerated (bool_cases): at most 8 elements, within the provers' 12.
MAX_CASES = 256


@dataclass
class ProofResult:
    status: str  # "proven", "refuted", "unknown"
    method: str  # "z3", "sympy" or "" when neither decided
    detail: str = ""


def bool_cases(inst: RuleInstance, env) -> list[dict] | None:
    """Each assignment of the bool input elements (a where's condition: a mask), as
    {input: array of Python bools}; [{}] without bool inputs, None past MAX_CASES.
    Proven case by case, a where that chooses an infinity (a mask's -inf fill) folds
    exactly instead of meeting a symbolic condition."""
    shapes = {name: inst.lhs.concrete_shape(node, env) for name, node in inst.lhs.inputs.items()
              if str(node.dtype) == "bool"}
    sizes = {name: int(np.prod(shape, dtype=np.int64)) for name, shape in shapes.items()}
    total = sum(sizes.values())
    if 2 ** total > MAX_CASES:
        return None
    cases = []
    for bits in itertools.product((False, True), repeat=total):
        case, at = {}, 0
        for name, shape in shapes.items():
            arr = np.empty(shape, dtype=object)
            arr.reshape(-1)[:] = bits[at:at + sizes[name]]
            case[name], at = arr, at + sizes[name]
        cases.append(case)
    return cases


def _scalarise_both(inst: RuleInstance, env, backend, fixed: dict):
    alg = Algebra(backend)
    inputs = {**input_arrays(inst.lhs, env, alg), **fixed}
    lhs = scalarise(inst.lhs, env, inputs, alg)
    assumed = len(getattr(backend, "premises", ()))
    rhs = scalarise(inst.rhs, env, {k: v for k, v in inputs.items() if k in inst.rhs.inputs}, alg)
    if assumed < len(getattr(backend, "premises", ())):
        # the rhs's domain (its log and sqrt arguments) is not assumed: it must follow from
        # the lhs's, or log((a+100)(b+100)) => log(a+100) + log(b+100) is proven
        # (a divisor's non-zero premise stays assumed: the divisors stage refuses new ones)
        lhs_domain = {p.get_id() for p in backend.premises[:assumed]}
        added = backend.premises[assumed:]
        backend.obligations = [p for p in added if p.get_id() in backend.domains and p.get_id() not in lhs_domain]
        del backend.premises[assumed:]
        backend.premises += [p for p in added if p.get_id() not in backend.domains]
    return inputs, lhs, rhs


def _static_equal(x, y) -> bool | None:
    """True/False when both are concrete (numbers, specials, bools); None otherwise.
    A special against a symbolic (always finite) value is never equal."""
    concrete = lambda v: is_num(v) or is_special(v) or isinstance(v, bool)  # noqa: E731
    if concrete(x) and concrete(y):
        if is_special(x) and is_special(y):
            return x == y or (x != x and y != y)
        if is_special(x) or is_special(y):
            return False
        return x == y
    if is_special(x) or is_special(y):
        return False
    return None


def prove_z3(inst: RuleInstance, binding: Binding, timeout_ms: int) -> ProofResult:
    """One query per set of output elements over the same input elements, each with
    only the laws over those inputs (dropping premises keeps a proof valid), within 4
    timeouts in all: the rows of a top-k network are independent, so their case splits
    need not multiply. With bool inputs, each of their assignments in turn (bool_cases)."""
    cases = bool_cases(inst, binding.dict)
    if cases is None:
        return ProofResult("unknown", "", f"z3: over {MAX_CASES} assignments of the bool inputs at {binding}")
    deadline = time.perf_counter() + 4 * timeout_ms / 1000
    for fixed in cases:
        result = _prove_z3_case(inst, binding, timeout_ms, fixed, deadline)
        if result.status != "proven":
            return result
    return ProofResult("proven", "z3")


def _prove_z3_case(inst: RuleInstance, binding: Binding, timeout_ms: int, fixed: dict, deadline: float) -> ProofResult:
    env = binding.dict
    backend = Z3Backend()
    try:
        inputs, lhs, rhs = _scalarise_both(inst, env, backend, fixed)
    except Unsupported as err:
        return ProofResult("unknown", "", f"z3 lowering: {err}")
    alg = Algebra(backend)
    outside = [z3.Not(p) for p in backend.obligations]  # the rhs's domain left, asked first: a real model
    differs = []
    for a, b in zip(lhs, rhs):
        for idx in np.ndindex(*a.shape):
            x, y = a[idx], b[idx]
            same = _static_equal(x, y)
            if same is None:
                differs.append(alg.lift(x) != alg.lift(y))
            elif not same:  # differs for every input: any input is a counterexample
                gen = torch.Generator().manual_seed(0)
                return _confirm(inst, binding, random_inputs(inst.lhs, env, STYLES[0][1], gen), _unknown_ops(inst, backend))
    if not differs and not outside:
        return ProofResult("proven", "z3")
    laws = backend.laws()
    memo: dict[int, frozenset] = {}
    by_inputs: dict[frozenset, list] = {}
    for d in differs:
        by_inputs.setdefault(_variables(d, memo), []).append(d)
    queries = [([law for law in laws if _variables(law, memo) <= wanted], group) for wanted, group in by_inputs.items()]
    if outside:  # the lhs's domain alone (no function laws): a model of it is real arithmetic
        wanted = frozenset().union(*(_variables(d, memo) for d in outside))
        queries.insert(0, ([p for p in backend.premises if _variables(p, memo) <= wanted], outside))
    for premises, group in queries:
        left_ms = int((deadline - time.perf_counter()) * 1000)
        if left_ms <= 0:
            return ProofResult("unknown", "", f"z3 unknown at {binding}: timeout ({len(queries)} independent queries)")
        solver = z3.Then("simplify", "purify-arith", "smt").solver()  # about 3x faster on top-k rows
        solver.set("timeout", min(timeout_ms, left_ms))
        solver.add(*premises)
        solver.add(z3.Or(*group))
        result = solver.check()
        if result == z3.sat:
            return _confirm(inst, binding, _model_inputs(inst, inputs, solver.model()), _unknown_ops(inst, backend))
        if result == z3.unknown:
            return ProofResult("unknown", "", f"z3 unknown at {binding}: {solver.reason_unknown()}")
    return ProofResult("proven", "z3")


def _variables(e, memo: dict[int, frozenset]) -> frozenset:
    """The uninterpreted constants (input elements) of a z3 term, memoized over its DAG."""
    key = e.get_id()
    if key not in memo:
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            memo[key] = frozenset([e.decl().name()])
        else:
            out = frozenset()
            for c in e.children():
                out |= _variables(c, memo)
            memo[key] = out
    return memo[key]


def _model_inputs(inst: RuleInstance, inputs, model) -> dict[str, torch.Tensor]:
    tensors = {}
    for name, arr in inputs.items():
        node = inst.lhs.inputs[name]
        values = np.empty(arr.shape, dtype=object)
        for idx in np.ndindex(*arr.shape):  # a bool of the case at hand is a Python bool
            v = arr[idx]
            values[idx] = v if isinstance(v, bool) else _model_value(model.eval(v, model_completion=True))
        dtype = torch.float64 if node.dtype.is_float else TORCH_DTYPES[node.dtype]
        tensors[name] = torch.tensor(values.tolist(), dtype=dtype).reshape(arr.shape)
    return tensors


def _unknown_ops(inst: RuleInstance, backend: Z3Backend) -> list[str]:
    """The instance's ops that z3 holds as uninterpreted functions."""
    used = {n.op for g in (inst.lhs, inst.rhs) for n in g.nodes}
    return [f for f in backend.functions() if f in used]


def _confirm(inst: RuleInstance, binding: Binding, tensors: dict[str, torch.Tensor],
             functions: list[str] = ()) -> ProofResult:
    """A candidate counterexample counts only if the interpreter agrees in fp64; else the
    verdict names the ops z3 held as unknown functions (`functions`), whose model values
    need not be any real function's."""
    env = binding.dict
    try:
        lhs, rhs = evaluate(inst, tensors, env)
    except (CleaveError, RuntimeError, IndexError) as err:
        return ProofResult("unknown", "", f"z3 model at {binding} could not be interpreted: {err}")
    bad = first_mismatch(lhs, rhs)
    if bad:
        return ProofResult("refuted", "z3", f"at {binding}, inputs {show_inputs(tensors)}: {bad}")
    if functions:
        why = (f"z3 holds {', '.join(functions)} as {'an unknown function' if len(functions) == 1 else 'unknown functions'}"
               " with only the laws it was given, and its model's values are no real function's")
    elif _fractional_constants(inst):
        # 0.1 x + 0.9 x => x: false for the f32 constants (0.1f + 0.9f is not 1), by less
        # than the fp64 comparison tells apart
        why = ("the sides differ there by less than fp64's comparison tolerance: the rule holds at best up to "
               "the rounding of its f32 constants")
    else:
        why = "its model breaks a law of real arithmetic it was not given"
    return ProofResult("unknown", "", f"z3's counterexample at {binding} is not confirmed by fp64 arithmetic ({why})")


def _fractional_constants(inst: RuleInstance) -> bool:
    """Whether a side holds a constant that is not an integer (f32 rounds it)."""
    return any(n.op == "const" and isinstance(n.attrs.get("value"), float) and not float(n.attrs["value"]).is_integer()
               for g in (inst.lhs, inst.rhs) for n in g.nodes)


def _model_value(v):
    if z3.is_true(v) or z3.is_false(v):
        return bool(z3.is_true(v))
    if z3.is_int_value(v):
        return v.as_long()
    if z3.is_rational_value(v):
        return float(v.as_fraction())
    if z3.is_algebraic_value(v):
        return float(v.approx(20).as_fraction())
    return 0.0


def prove_sympy(inst: RuleInstance, binding: Binding, max_ops: int = 400) -> ProofResult:
    """lhs - rhs simplifies to 0 for every element (with exp(a+b) expanded), in each
    assignment of the bool inputs."""
    cases = bool_cases(inst, binding.dict)
    if cases is None:
        return ProofResult("unknown", "", f"sympy: over {MAX_CASES} assignments of the bool inputs at {binding}")
    for fixed in cases:
        try:
            _, lhs, rhs = _scalarise_both(inst, binding.dict, SympyBackend(), fixed)
        except Unsupported as err:
            return ProofResult("unknown", "", f"sympy lowering: {err}")
        result = _sympy_case(lhs, rhs, binding, max_ops)
        if result.status != "proven":
            return result
    return ProofResult("proven", "sympy")


def _sympy_case(lhs, rhs, binding: Binding, max_ops: int) -> ProofResult:
    for a, b in zip(lhs, rhs):
        for idx in np.ndindex(*a.shape):
            x, y = a[idx], b[idx]
            same = _static_equal(x, y)
            if same is True:
                continue
            if same is False:
                return ProofResult("unknown", "", f"sympy: element {list(idx)} differs ({x} vs {y})")
            if not _sympy_zero(_sym(x), _sym(y), max_ops):
                return ProofResult("unknown", "", f"sympy could not show element {list(idx)} equal at {binding}")
    return ProofResult("proven", "sympy")


def _sym(v):
    if isinstance(v, bool):
        return sympy.true if v else sympy.false
    if is_num(v):
        return sympy.Rational(v.numerator, v.denominator) if hasattr(v, "numerator") else sympy.Integer(v)
    return v


def _sympy_zero(x, y, max_ops: int) -> bool:
    if x == y:
        return True
    if not (isinstance(x, sympy.Expr) and isinstance(y, sympy.Expr)):
        return False
    if sympy.count_ops(x) + sympy.count_ops(y) > max_ops:
        return False  # sympy would spend minutes here and rarely succeed: leave it unknown
    d = sympy.expand(x - y, power_exp=True)
    if d == 0:
        return True
    if sympy.count_ops(d) > max_ops:
        return False
    return sympy.simplify(sympy.powsimp(d)) == 0


def prove_at(inst: RuleInstance, binding: Binding, timeout_ms: int) -> ProofResult:
    """z3 with a short timeout, then sympy, then z3 with the full timeout."""
    first = prove_z3(inst, binding, min(timeout_ms, SHORT_MS))
    if first.status != "unknown":
        return first
    second = prove_sympy(inst, binding)
    if second.status == "proven":
        return second
    if timeout_ms > SHORT_MS and ("timeout" in first.detail or "canceled" in first.detail):
        third = prove_z3(inst, binding, timeout_ms)
        if third.status != "unknown":
            return third
        return ProofResult("unknown", "", f"{third.detail}; {second.detail}")
    return ProofResult("unknown", "", f"{first.detail}; {second.detail}")
