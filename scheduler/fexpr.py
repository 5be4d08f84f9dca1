"""Print a Separable fact's rescale formula (in y_old, y_new) as Triton code."""
from __future__ import annotations

import sympy

Y_OLD, Y_NEW = sympy.Symbol("y_old"), sympy.Symbol("y_new")
# exp(x) as 2^(x log2 e): the GPU's ex2 instruction is what Triton lowers an fp32 exp to
EXP = "tl.exp2({x} * 1.4426950408889634)"


def parse_rescale(text: str) -> sympy.Expr:
    try:
        expr = sympy.sympify(text, locals={"y_old": Y_OLD, "y_new": Y_NEW, "exp": sympy.exp, "log": sympy.log})
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
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(fcode(a, names) for a in e.args) + ")"
    if isinstance(e, sympy.Mul):
        num, den = sympy.fraction(e)
        if den != 1:
            return f"({fcode(num, names)} / {fcode(den, names)})"
        return "(" + " * ".join(fcode(a, names) for a in e.args) + ")"
    if isinstance(e, sympy.Pow) and e.exp == -1:
        return f"(1.0 / {fcode(e.base, names)})"
    raise ValueError(f"rescale formula: cannot print {e}")
