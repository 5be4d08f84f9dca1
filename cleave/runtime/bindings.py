"""What a capture's trace may assign outside fn's arguments and a capture cannot keep: a
global or closure variable rebound (`global G; G = G * 0.5 + x`), and an attribute of a
tensor fn reads outside its arguments (`W.grad`, set by a `loss.backward()` inside fn;
`t.tag = x`). The trace runs fn once on fake tensors, so such an assignment is left
holding a fake tensor, and a capture would not make it at later calls. `BindingWatch`
records them before the trace; after it, `put_back` gives each its value back and names
the first the trace changed (fn then runs through dynamo, which makes them at each call).
"""
from __future__ import annotations

import dis
import types
import warnings

import torch

_UNBOUND = object()
_STORES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})


class BindingWatch:
    def __init__(self, functions, tensors):
        """functions: the Python functions a call of fn runs (their global stores and closure
        cells are watched); tensors: (label, tensor) read outside fn's arguments."""
        self.globals = []  # (namespace, name, value or _UNBOUND)
        self.cells = []  # (cell, its variable's name, value or _UNBOUND)
        for f in functions:
            for name in sorted(_globals_stored(f.__code__)):
                self.globals.append((f.__globals__, name, f.__globals__.get(name, _UNBOUND)))
            for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
                self.cells.append((cell, name, _contents(cell)))
        unique = {id(t): (label, t) for label, t in tensors}
        self.tensors = [(label, t, _grad(t), dict(vars(t))) for label, t in unique.values()]

    def put_back(self) -> str | None:
        """Each binding and tensor attribute as it was before the trace; what the trace
        changed, said as the reason fn runs through dynamo, or None."""
        changed = []
        for scope, name, value in self.globals:
            if scope.get(name, _UNBOUND) is not value:
                changed.append(f"it assigns the global {name!r}")
                if value is _UNBOUND:
                    scope.pop(name, None)
                else:
                    scope[name] = value
        for cell, name, value in self.cells:
            if _contents(cell) is not value:
                changed.append(f"it assigns the closure variable {name!r}")
                if value is _UNBOUND:
                    del cell.cell_contents
                else:
                    cell.cell_contents = value
        for label, t, grad, attributes in self.tensors:
            if _grad(t) is not grad:
                changed.append(f"it sets {label}.grad (a backward pass, or an assignment)")
                t.grad = grad
            now = vars(t)
            if now.keys() != attributes.keys() or any(now[k] is not v for k, v in attributes.items()):
                changed.append(f"it sets an attribute of {label}")
                now.clear()
                now.update(attributes)
        return changed[0] if changed else None


def _globals_stored(code: types.CodeType) -> set[str]:
    """The global names code and the code nested in it assigns or deletes."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _STORES}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_stored(const)
    return names


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a variable assigned later)
        return _UNBOUND


def _grad(t: torch.Tensor):
    with warnings.catch_warnings():  # a non-leaf's .grad warns when read
        warnings.simplefilter("ignore")
        return t.grad
