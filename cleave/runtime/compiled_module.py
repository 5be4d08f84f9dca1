"""What `cleave.compile(module)` returns: an nn.Module that is the module, compiled.

Like torch.compile's OptimizedModule it holds the original (`_orig_mod`) and forwards
attribute reads and writes to it, but it shares the original's tables (parameters,
buffers, submodules, hooks) rather than holding it as a child: `state_dict()`,
`named_parameters()` and `load_state_dict()` use the original's keys, with no
`_orig_mod.` prefix, also where the compiled module is a submodule of a larger model.
What a module class may override (`train`, `eval`, `to` and the other dtype and
device moves, `_apply`, its state-dict hooks and versions) runs on the original
itself, so `eval()` sets the flags the compiled function's guards read, and `.to()`
moves what the original moves.

A call goes to the CompiledFunction, never through Module.__call__: the module's own
hooks (a hook registered on the wrapper is registered on the original) fire inside it,
once, as the compiled function runs the module.
"""
from __future__ import annotations

import copy

import torch

# The tables torch.nn.Module.__init__ makes: the wrapper's are the original's own
_SHARED = ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules", "_backward_pre_hooks",
           "_backward_hooks", "_is_full_backward_hook", "_forward_hooks", "_forward_hooks_with_kwargs",
           "_forward_hooks_always_called", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs",
           "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")
_OWN = frozenset(_SHARED) | {"_orig_mod", "_cleave_function", "_options", "_cleave_deleted"}


class CompiledModule(torch.nn.Module):
    """`module`, called through its CompiledFunction, whose `stats`, `operators`,
    `prepare`, `capture_error`, `calls` and `recaptures` are read off the wrapper (the
    module's own attributes of those names: off `_orig_mod`). Every other attribute,
    `forward` and the methods the wrapper runs on the original included, is the
    original's, read and written."""

    def __init__(self, module: torch.nn.Module, compiled, options: dict):
        object.__setattr__(self, "_orig_mod", module)  # before Module.__init__: attribute access forwards to it
        object.__setattr__(self, "_cleave_function", compiled)
        object.__setattr__(self, "_cleave_deleted", None)  # the last parameter or buffer `del`eted
        object.__setattr__(self, "_options", options)  # cleave.compile's arguments, for a deep copy
        for name in _SHARED:
            object.__setattr__(self, name, module.__dict__[name])

    # -- the compiled path --------------------------------------------------
    def __call__(self, *args, **kwargs):
        return self._cleave_function(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self._cleave_function(*args, **kwargs)

    @property
    def stats(self) -> dict:
        return self._cleave_function.stats

    @property
    def operators(self):
        return self._cleave_function.operators

    @property
    def capture_error(self):
        return self._cleave_function.capture_error

    @property
    def calls(self) -> int:
        return self._cleave_function.calls

    @property
    def recaptures(self) -> int:
        return self._cleave_function.recaptures

    def prepare(self, *args):
        return self._cleave_function.prepare(*args)

    # -- what runs on the original itself -----------------------------------
    @property
    def training(self) -> bool:
        return self._orig_mod.training

    @training.setter
    def training(self, mode: bool) -> None:
        self._orig_mod.training = mode

    def __repr__(self) -> str:
        return f"cleave.compile({self._orig_mod!r})"

    def __deepcopy__(self, memo):
        """A copy of the original, compiled afresh (the compiled function holds locks and
        kernels, which are not copied)."""
        return _compiled_again(copy.deepcopy(self._orig_mod, memo), self._options)

    def __reduce__(self):
        """Pickled (torch.save of the module, or of a model holding it) as the original and
        cleave.compile's arguments: loading compiles it again on its first call, from the
        kernel cache where that machine has the operators. The compiled function's locks,
        code objects and kernels are not pickled."""
        return _compiled_again, (self._orig_mod, self._options)

    # -- attribute access, as OptimizedModule forwards it -----------------
    def __getattr__(self, name: str):
        if name in _OWN:  # during __init__, or an unpickled half: no recursion through _orig_mod
            raise AttributeError(name)
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        elif name == "__class__":
            self._refuse_new_class(value)
        elif getattr(getattr(type(self), name, None), "fset", None):
            super().__setattr__(name, value)  # a property with a setter (`training`): set on the original
        else:  # `forward` patched too: the compiled function calls the original's
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        tables = (self._orig_mod._parameters, self._orig_mod._buffers)
        held = next(((t, t[name]) for t in tables if name in t), None)
        delattr(self._orig_mod, name)
        object.__setattr__(self, "_cleave_deleted", (name, *held) if held else None)

    def _refuse_new_class(self, cls) -> None:
        """torch.nn.utils.parametrize gives the module it is handed a class of its own,
        after deleting the tensor from it: the wrapper's class is cleave's, so that tensor
        is put back on the original and the change refused."""
        if self._cleave_deleted is not None:
            name, table, tensor = self._cleave_deleted
            table[name] = tensor
            object.__setattr__(self, "_cleave_deleted", None)
        raise TypeError(f"cleave.compile: a compiled module's class cannot become {cls.__name__} "
                        f"(torch.nn.utils.parametrize does this): register the parametrization on the "
                        f"module itself (`compiled._orig_mod`), before or after compiling; the compiled "
                        f"module reads it at its next call")

    def __dir__(self):
        return sorted(set(dir(self._orig_mod)) | set(super().__dir__()))


def _on_the_original(name: str):
    """Module method `name`, run on the original (its class may override it: an `eval()`
    that also sets an attribute); where it returns the original, the wrapper is returned."""
    def method(self, *args, **kwargs):
        result = getattr(self._orig_mod, name)(*args, **kwargs)
        return self if result is self._orig_mod else result
    method.__name__ = method.__qualname__ = name
    return method


# `_apply` and the state-dict methods are reached from a larger model holding the wrapper
for _name in ("train", "eval", "apply", "_apply", "to", "cuda", "cpu", "float", "half", "double", "bfloat16",
              "type", "requires_grad_", "zero_grad", "state_dict", "load_state_dict", "_load_from_state_dict",
              "extra_repr"):
    setattr(CompiledModule, _name, _on_the_original(_name))


def _compiled_again(module: torch.nn.Module, options: dict) -> CompiledModule:
    """A pickled CompiledModule, loaded: `module` compiled with the same arguments."""
    from .compile import CompiledFunction

    return CompiledModule(module, CompiledFunction(module, **options), options)
