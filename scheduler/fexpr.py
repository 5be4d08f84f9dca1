"""Print a Separable fact's rescale formula (in y_old, y_new) as Triton code."""
from __future__ import annotations

import sympy

from cleave.ir.ops import LOG2E

Y_OLD, Y_NEW = sympy.Symbol("y_old"), sympy.Symbol("y_new")
# exp(x) as 2^(x log2 e): the GPU's ex2 instruction is what Triton lowers an fp32 exp to
EXP = f"tl.exp2({{x}} * {LOG2E!r})"


def parse_rescale(text: str) -> sympy.Expr:
    try:
        expr = sympy.sympify(text, locals={"y_old": Y_OLD, "y_new": Y_NEW, "exp": sympy.exp,
                                              "exp2": lambda x: sympy.Pow(2, x), "log": sympy.log})
    except (sympy.SympifyError, SyntaxError) as err:
        raise ValueError(f"rescale formula {text!r} does not parse: {err}") from None
    extra = expr.free_symbols - {Y_OLD, Y_NEW}
    if extra:
        raise ValueError(f"rescale formula {text!r} uses {sorted(map(str, extra))} besides y_old, y_new")
    return expr


def fcode(e: sympy.Expr, names: dict) -> str:
    if e in names:
        return names[e]
    if isinstance(e, sympy.Number):
        return repr(float(e))
    if isinstance(e, sympy.exp):
        return EXP.format(x=fcode(e.args[0], names))
    if isinstance(e, sympy.log):
        return f"tl.log({fcode(e.args[0], names)})"
    if isinstance(e, sympy.Add):  # y_old - y_new, not y_old + (-1.0 * y_new)
        first, *rest = sorted(e.args, key=lambda a: a.could_extract_minus_sign())
        return "(" + fcode(first, names) + "".join(
            f" - {fcode(-a, names)}" if a.could_extract_minus_sign() else f" + {fcode(a, names)}" for a in rest) + ")"
    if isinstance(e, sympy.Mul):
        num, den = sympy.fraction(e)
        if den != 1:
            return f"({fcode(num, names)} / {fcode(den, names)})"
        return "(" + " * ".join(fcode(a, names) for a in e.args) + ")"
    if isinstance(e, sympy.Pow) and e.base == 2:
        return f"tl.exp2({fcode(e.exp, names)})"
    if isinstance(e, sympy.Pow) and e.exp == -1:
        return f"(1.0 / {fcode(e.base, names)})"
    raise ValueError(f"rescale formula: cannot print {e}")
