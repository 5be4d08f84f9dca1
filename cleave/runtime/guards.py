"""What a whole-function capture depends on besides its arguments (`Guards`, checked at
every call) and what its trace must leave as it found it (`StateWatch`).

torch.export runs fn once and keeps the graph: the values fn read are baked in, and
what its forwards assign (`self.pos += n`, a buffer reassigned as a growing cache) or
its hooks do is dropped. The module exported gets its attributes back; a module reached
through a global keeps the trace's fake tensors. A capture therefore serves fn only while
what it read holds and when its modules' forwards change nothing; otherwise fn runs
through dynamo (`compile._dynamo_compile`), which guards what its trace reads and keeps
attribute writes and hooks.
"""
from __future__ import annotations

import builtins
import copy
import dis
import enum
import functools
import inspect
import itertools
import operator
import sys
import threading
import types
import typing
from typing import NamedTuple

import torch
from torch.nn.modules import module as nn_module
from torch.utils.hooks import RemovableHandle

from ..ir.errors import CleaveError
from .bindings import BindingWatch

_SCALARS = (bool, int, float, complex, str)
_MISSING = object()
# nn.Module's own entries in a module's __dict__ (torch's list in _detect_attribute_assignment)
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) | {"_initialize_hook", "_load_hook"}
# Attribute values that equality compares fully: immutable values, and functions, classes
# and Python modules (equal when they are the same object).
_VALUES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout,
           torch.memory_format, enum.Enum, type(Ellipsis), types.FunctionType, types.BuiltinFunctionType, type,
           types.ModuleType)
# A longer container is compared at every call at more cost than dynamo's guards.
_COMPARED_ITEMS = 64
# What code may read of a tensor that a capture's key leaves out (its offset's value:
# a slice per step of a loop would be a capture per step); dynamo guards each.
_PER_TENSOR_FACTS = frozenset({"storage_offset", "is_inference"})


class Guards:
    """What the capture bakes into the graph besides the arguments, as it was when fn was
    captured: what fn's code and the functions it calls read (`_Reads`): the globals and
    closure cells, the attributes of the user's Python modules and classes read through
    them, of fn's owner (a bound method's object or class, a callable object), of the
    functions themselves (`helper.scale`) and the arguments a `functools.partial` binds
    (`_global_guard`), and the modules fn reaches (`_ModuleTree`). `hold()` runs per
    call, so it compares cheaply: a tensor by identity, version (an in-place change) and
    data pointer (a `.data` write), a scalar by type and value (x * 2 and x * 2.0 differ
    on integers), a module or function by identity, a container or plain object by
    content (`_Snapshot`). Those functions' code and defaults are guarded too, by
    identity (autoreload replaces `__code__`), and their defaults' contents as globals
    are (`_defaults_read`)."""

    def __init__(self, names: list, cells: list, modules: _ModuleTree | None, functions: list):
        self.names = names  # (globals or attribute dict, name, value or _Snapshot, version, data pointer)
        self.cells = cells  # (cell, value or _Snapshot, version, data pointer)
        self.modules = modules
        self.functions = functions  # (function, its __code__, __defaults__, __kwdefaults__)
        self.opaque: str | None = None  # a global or cell read whose changes cannot be compared
        self.effect: str | None = None  # a call a capture would not make at each call (`_Reads.check`)
        self.tensor_fact: str | None = None  # a fact of a tensor the code reads and no call key holds
        # the global and closure variables fn may assign, and the tensors' attributes, before a trace
        self.bindings: BindingWatch | None = None

    @classmethod
    def read_by(cls, fn) -> Guards | None:
        reads = _Reads.of(fn)
        if reads is None:
            return None
        names = [(scope, n, *_guarded(how)) for scope, n, how in reads.guards.values() if how is not _OPAQUE]
        cells = [(cell, *_guarded(how)) for cell, how, _ in reads.cells.values() if how is not _OPAQUE]
        opaque = [n for _, n, how in reads.guards.values() if how is _OPAQUE] + \
            [f"a closure variable of {name}" for _, how, name in reads.cells.values() if how is _OPAQUE]
        compiled = fn if isinstance(fn, torch.nn.Module) else None
        reached = list(reads.modules.values())  # the compiled module's own are told apart by _ModuleTree
        modules = _ModuleTree(compiled, reached) if compiled is not None or reached else None
        functions = [(f, f.__code__, f.__defaults__, f.__kwdefaults__) for f in reads.functions]
        guards = cls(names, cells, modules, functions)
        if opaque:
            guards.opaque = (f"it reads {opaque[0]!r}, an object whose changes cleave cannot tell (a capture "
                             f"would keep the value it read)")
        guards.effect = reads.call
        held = [(n, v) for _, n, v, _, _ in names] + [(f"a closure variable of {name}", _cell_value(cell))
                                                      for cell, _, name in reads.cells.values()]
        tensors = [found for label, value in held for found in _tensors_in(label, value)]
        if modules is not None:
            tensors += [(key, t) for _, key, t, _, _ in modules.tensors if isinstance(t, torch.Tensor)]
        guards.bindings = BindingWatch(list(reads.functions), tensors)
        told = sorted(reads.names & _PER_TENSOR_FACTS)
        if told:
            guards.tensor_fact = (f"it reads a tensor's {told[0]}(), which a capture would keep as the traced "
                                  f"tensor's")
        return guards

    def put_back(self) -> str | None:
        """The name of a global or cell container or object the capture's trace changed
        (`LOG.append(y)`: it got a fake tensor), each such one given its contents back;
        None when the trace changed none."""
        changed = None
        for name, now, snapshot in [(n, scope.get(n, _MISSING), v) for scope, n, v, _, _ in self.names] + \
                [("a closure variable", _cell_value(c), v) for c, v, _, _ in self.cells]:
            if isinstance(snapshot, _Snapshot) and now is snapshot.obj and not _same(now, snapshot, None, None):
                changed = changed or name
                if not isinstance(now, (tuple, frozenset)):  # immutable: what changed is inside, and told
                    _refill(now if isinstance(now, (list, dict, set)) else vars(now), _copied(snapshot.held))
        return changed

    def plain_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The tensors fn reads that torch.export holds as constants, named: globals,
        closure cells, modules' tensor attributes and the buffers of modules reached
        through a global (parameters are left out: none is changed in place)."""
        found = [(n, v) for _, n, v, _, _ in self.names] + [("a closure variable", v) for _, v, _, _ in self.cells]
        if self.modules is not None:
            found += [(key, t) for _, key, t, _, _ in self.modules.tensors]
        return [(n, t) for n, t in found if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter)]

    def outside_pointers(self) -> frozenset:
        """The data pointers of the tensors fn reads that outlive the call (globals, cells,
        modules' tensors and the parameters and buffers of modules reached through a
        global): a capture passes the one-element ones as inputs, since a change through
        `.data`, numpy or inference mode bumps no version these guards could compare."""
        pointers = [p for *_, p in self.names] + [p for *_, p in self.cells]
        if self.modules is not None:
            pointers += [p for *_, p in self.modules.tensors]
        return frozenset(p for p in pointers if p is not None)

    @property
    def needs_dynamo(self) -> str | None:
        """Why a capture cannot serve fn (an object it reads, a call made for its effect, a
        hook, ...), or None."""
        return self.opaque or self.effect or self.tensor_fact or \
            (self.modules.needs_dynamo if self.modules is not None else None)

    def hold(self) -> bool:
        for f, code, defaults, kwdefaults in self.functions:
            if f.__code__ is not code or f.__defaults__ is not defaults or f.__kwdefaults__ is not kwdefaults:
                return False
        if self.modules is not None and not self.modules.hold():
            return False
        for scope, name, value, version, pointer in self.names:
            if not _same(scope.get(name, _MISSING), value, version, pointer):
                return False
        for cell, value, version, pointer in self.cells:
            if not _same(_cell_value(cell), value, version, pointer):
                return False
        return True


def _modules(root: torch.nn.Module) -> list[torch.nn.Module]:
    """root.modules(), each compiled one (cleave.compile's CompiledModule, torch.compile's
    OptimizedModule) as its original: the module whose flags and attributes its forward
    reads (the wrapper's `training` is the original's, kept in no __dict__ of its own)."""
    from .compiled_module import CompiledModule

    wrappers = (CompiledModule, torch._dynamo.eval_frame.OptimizedModule)
    out = []
    for m in root.modules():
        while isinstance(m, wrappers):
            m = m._orig_mod
        out.append(m)
    return out


class _ModuleTree:
    """The modules fn reaches (itself; those in the globals and cells it reads) and all
    their submodules, as the capture read them: each module's training flag, children and
    plain attributes (numbers, strings, functions, and tuples, lists and dicts of them),
    wherever forward or a helper method reads them, compared by equality (2 and 2.0 are
    equal here: Guards compares those forward itself reads by type too); tensors held as
    plain attributes; the parameters and buffers of a module reached through a global,
    which the capture holds as constants (fn's own are read off it at each call); and
    that no forward hook was registered on any of them."""

    def __init__(self, compiled: torch.nn.Module | None, reached: list):
        """compiled: fn itself, where it is a module; reached: the modules in the globals
        and cells it reads."""
        own_modules = _modules(compiled) if compiled is not None else []
        modules = dict.fromkeys(own_modules)  # unique, in order
        for root in reached:
            modules.update(dict.fromkeys(_modules(root)))
        self.modules = list(modules)
        # why a capture cannot serve these modules (a hook, an attribute equality cannot
        # compare); None when it can
        self.needs_dynamo: str | None = None
        if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
            self.needs_dynamo = "a global forward hook is registered"
        self.hook_counter = RemovableHandle.next_id  # registering any hook anywhere advances it
        # per module: (it, its class, a getter of its checked __dict__ entries, __dict__, its size, them)
        self.attributes = []
        self.tables = []  # (parameter or buffer table, its size)
        self.unset = []  # (parameter or buffer table, a key holding None)
        self.tensors = []  # (table, key, tensor, version, data pointer)
        self.grad_flags = []  # (parameter or buffer of a global module, its requires_grad)
        own_ids = set(map(id, own_modules))
        for m in self.modules:
            self._read(m, holds_state=id(m) not in own_ids)

    def _read(self, m: torch.nn.Module, holds_state: bool) -> None:
        if self.needs_dynamo is None and (m._forward_hooks or m._forward_pre_hooks):
            self.needs_dynamo = f"{type(m).__name__} has a forward hook, which runs only while the capture traces"
        d = vars(m)
        keys = ["training", "_modules"]
        for key, value in d.items():
            if key in _MODULE_INTERNALS:
                continue
            if isinstance(value, torch.Tensor):
                self.tensors.append((d, key, *_guarded(value)))
            elif _comparable(value):
                keys.append(key)
            elif self.needs_dynamo is None:
                self.needs_dynamo = (f"{type(m).__name__}.{key} is a {type(value).__name__}, whose changes cleave "
                                     f"cannot tell")
        checked = operator.itemgetter(*keys)
        # lists and dicts compare by content; `m.__class__ = Other` changes forward and is in no __dict__
        self.attributes.append((m, type(m), checked, d, len(d), _copied(checked(d))))
        for table in (m._parameters, m._buffers):
            # one added or set from None after the capture (register_buffer, a parameter that
            # forward iterates): fn's own tensors are read at each call, but only those it had
            self.tables.append((table, len(table)))
            self.unset += [(table, key) for key, t in table.items() if t is None]
        if holds_state:
            for table in (m._parameters, m._buffers):
                # a one-element tensor is baked into the graph as a number: in place too
                self.tensors += [(table, key, *_guarded(t, versioned=t is not None and t.numel() == 1))
                                 for key, t in table.items()]
                # held as constants, which no autograd check reads: a flag changed means a new capture
                self.grad_flags += [(t, t.requires_grad) for t in table.values() if t is not None]

    def hold(self) -> bool:
        if RemovableHandle.next_id != self.hook_counter and not self._no_hooks():
            return False
        try:
            for m, cls, checked, d, size, values in self.attributes:
                if type(m) is not cls or len(d) != size or checked(d) != values:
                    return False
        except Exception:  # noqa: BLE001 - an entry deleted, or one equality cannot compare: changed
            return False
        for table, size in self.tables:
            if len(table) != size:
                return False
        for table, key in self.unset:
            if table.get(key) is not None:
                return False
        for t, flag in self.grad_flags:
            if t.requires_grad is not flag:
                return False
        for table, key, t, version, pointer in self.tensors:  # _same, inlined: a model holds many
            now = table.get(key, _MISSING)
            if now is not t or version is not None and now._version != version or (
                    pointer is not None and now.data_ptr() != pointer):
                return False
        return True

    def _no_hooks(self) -> bool:
        """Whether the hooks registered since the capture are none of these modules'
        (another module's, or removed since); they then need no check until the next."""
        if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
            return False
        if any(m._forward_hooks or m._forward_pre_hooks for m in self.modules):
            return False
        self.hook_counter = RemovableHandle.next_id
        return True


class TensorContents:
    """The contents of the constant tensors a capture's trace reaches (Guards.
    plain_tensors), kept while torch.export traces: it runs forward on those tensors
    themselves, so `self.count.add_(1)` (an attribute, no buffer) or `STEP.add_(1)` (a
    global) happened in the trace and again when the call then ran, a step ahead for
    good. Those the trace changed get their contents back; one too large to copy that
    the trace changed is an error, not a result computed from changed state."""

    LIMIT = 64 << 20  # bytes: a larger tensor is only watched

    def __init__(self, guards):
        tensors = guards.plain_tensors() if guards is not None else []
        self.kept = [(name, t, _version(t), t.detach().clone() if _nbytes(t) <= self.LIMIT else None)
                     for name, t in {id(t): (name, t) for name, t in tensors}.values()]

    def restore(self) -> None:
        for name, t, version, kept in self.kept:
            # an inference tensor has no counter: its contents tell
            changed = t._version != version if version is not None else kept is not None and not torch.equal(t, kept)
            if not changed:
                continue
            if kept is None:
                raise CleaveError(f"cleave: capturing changed {name} ({tuple(t.shape)}, {_nbytes(t)} bytes), a "
                                   f"tensor held as a constant, in place, and it is too large to put back: register "
                                   f"it as a buffer of the module (register_buffer), or pass it as an argument")
            with torch.inference_mode(t.is_inference()), torch.no_grad():
                t.detach().copy_(kept)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _State(NamedTuple):
    """One module's state as a trace may change it."""
    module: torch.nn.Module
    attributes: dict  # name -> (the object, a copy of what it holds: _copied)
    tables: tuple  # copies of its parameters, buffers and children
    training: bool


class StateWatch:
    """The state of the modules a capture reaches, as it was before the trace: whether the
    trace changed it (forward assigned an attribute or a buffer, appended to a list), and
    that state put back afterwards. `start` and `end` run inside the trace, around fn's
    call: by then the exported module's tensors are the trace's, in both."""

    def __init__(self, modules: list):
        self.modules = modules
        self.before = _states(modules)
        self.changed = False
        self._start: list = []

    def start(self) -> None:
        self._start = _states(self.modules)

    def end(self) -> None:
        self.changed |= not all(map(_unchanged, self._start, _states(self.modules)))

    def restore(self) -> None:
        for state in self.before:
            _put_back(state)


def _states(modules: list) -> list[_State]:
    return [_State(m, {k: (v, _copied(v)) for k, v in vars(m).items() if k not in _MODULE_INTERNALS},
                   (dict(m._parameters), dict(m._buffers), dict(m._modules)), m.training) for m in modules]


def _unchanged(old: _State, new: _State) -> bool:
    return (old.training == new.training and all(map(_same_entries, old.tables, new.tables))
            and old.attributes.keys() == new.attributes.keys()
            and all(_alike(copy, new.attributes[k][1]) for k, (_, copy) in old.attributes.items()))


def _put_back(state: _State) -> None:
    """The module as it was: attributes the trace added removed, others given back their
    objects and those objects their contents, parameters, buffers and children restored."""
    m = state.module
    d = vars(m)
    for key in [k for k in d if k not in _MODULE_INTERNALS and k not in state.attributes]:
        del d[key]
    for key, (value, contents) in state.attributes.items():
        if not _alike(_copied(value), contents):
            _refill(value, contents)
        d[key] = value
    for table, held in zip((m._parameters, m._buffers, m._modules), state.tables):
        if not _same_entries(table, held):
            table.clear()
            table.update(held)
    d["training"] = state.training


def _refill(container, contents) -> None:
    if isinstance(container, list):
        container[:] = contents
    elif isinstance(container, (dict, set)):
        container.clear()
        container.update(contents)


def _same_entries(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k] is v for k, v in b.items())


def _comparable(value) -> bool:
    """Whether equality tells every change of value, cheaply: a _VALUES value, or a
    short tuple, list, set or dict of them."""
    if isinstance(value, (tuple, list, set, frozenset, dict)):
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        return len(value) <= _COMPARED_ITEMS and all(map(_comparable, items))
    return isinstance(value, _VALUES)


def _copied(value):
    """value with its lists, tuples, dicts and sets copied as they are now, of their own
    types (a namedtuple, torch.Size, an OrderedDict or defaultdict stay one), other
    values shared."""
    if isinstance(value, tuple):
        items = map(_copied, value)
        return value._make(items) if hasattr(value, "_make") else type(value)(items)
    if isinstance(value, (list, dict, set)):
        copied = copy.copy(value)  # keeps the type and, for a defaultdict, its factory
        if isinstance(value, dict):
            copied.update({k: _copied(v) for k, v in value.items()})
        elif isinstance(value, list):
            copied[:] = map(_copied, value)
        return copied
    return value


def _alike(a, b) -> bool:
    """Whether two _copied values hold the same: containers item by item, other values
    the same object or equal scalars of one type."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_alike, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_alike(v, b[k]) for k, v in a.items())
    return isinstance(a, (*_SCALARS, set)) and a == b


def _guardable(value) -> bool:
    return isinstance(value, (torch.Tensor, torch.nn.Module, *_SCALARS))


class _Snapshot(NamedTuple):
    """A global or cell holding a container or a plain object (a config): the object,
    and what it held when captured (its items, or its attributes), compared at each
    call (`x * CONFIG["scale"]` kept the first value after the dict changed)."""
    obj: object
    held: object


def _global_guard(value):
    """How a global or cell fn's code reads is guarded: the value itself (_guardable, a
    function, a user class, another immutable _VALUES value), a _Snapshot, None where it
    needs no guard (a Python module, a library's class), or _OPAQUE where cleave cannot
    tell its changes."""
    if isinstance(value, types.ModuleType) or isinstance(value, type) and _library(value):
        return None
    if value is _MISSING or _guardable(value) or isinstance(value, _VALUES):  # _MISSING: an empty cell
        return value
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return _Snapshot(value, _copied(value)) if _comparable(value) else _OPAQUE
    held = getattr(value, "__dict__", None)
    if isinstance(held, dict) and not callable(value) and _comparable(held):
        return _Snapshot(value, _copied(held))
    return _OPAQUE


def _class_guard(value):
    """How a class attribute read is guarded: a method, property or other descriptor by
    identity (one replaced changes what runs), other values as globals are."""
    descriptors = (staticmethod, classmethod, property, types.GetSetDescriptorType, types.MemberDescriptorType)
    return value if isinstance(value, descriptors) else _global_guard(value)


_OPAQUE = object()


def _guarded(value, versioned: bool = True) -> tuple:
    """value, and for a tensor its version (None where an in-place change needs no new
    capture) and data pointer."""
    if not isinstance(value, torch.Tensor):
        return value, None, None
    return value, _version(value) if versioned else None, _data_pointer(value)


def _version(t: torch.Tensor) -> int | None:
    """t's in-place change counter; None for a tensor made under torch.inference_mode,
    which has none (reading it raised)."""
    return None if t.is_inference() else t._version


def _same(now, value, version, pointer) -> bool:
    if isinstance(value, torch.Tensor):
        return now is value and (version is None or now._version == version) and _data_pointer(now) == pointer
    if isinstance(value, _Snapshot):
        if now is not value.obj:
            return False
        # compared as they stand: _alike reads both sides, so nothing is copied per call
        return _alike(now if isinstance(now, (list, tuple, dict, set, frozenset)) else vars(now), value.held)
    return type(now) is type(value) and now == value


def _data_pointer(t: torch.Tensor) -> int | None:
    try:
        return t.data_ptr()
    except RuntimeError:  # a sparse tensor has none
        return None


def _tensors_in(label: str, value) -> list[tuple[str, torch.Tensor]]:
    """The tensors a global or cell holds, itself or as a container's items, labelled."""
    value = value.obj if isinstance(value, _Snapshot) else value
    if isinstance(value, torch.Tensor):
        return [(label, value)]
    if isinstance(value, (list, tuple, dict)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return [(f"{label}[{k!r}]", v) for k, v in itertools.islice(items, _COMPARED_ITEMS)
                if isinstance(v, torch.Tensor)]
    return []


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a variable assigned later)
        return _MISSING


def _python_function(fn):
    """The Python function whose code a capture of fn runs: a module's forward, a
    method's function, a callable object's __call__; None for other callables."""
    if isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    elif not isinstance(fn, (types.FunctionType, types.MethodType)) and callable(fn):
        fn = getattr(type(fn), "__call__", None)
    fn = getattr(fn, "__func__", fn)
    return fn if isinstance(fn, types.FunctionType) else None


# Packages whose functions a capture's guards do not look into, besides the standard
# library's: what they read is theirs.
_LIBRARIES = frozenset({"torch", "cleave", "numpy", "triton", "einops", "transformers"}) | sys.stdlib_module_names
# Packages whose calls the trace records: torch's, and einops' (it calls torch's).
_TRACED_PACKAGES = frozenset({"torch", "einops"})
# Functions looked into at most, per capture: a guard is checked at every call.
_MAX_FUNCTIONS = 64
# Functions (and the modules' functions and classes) whose result depends on their
# arguments alone: a capture may keep it.
_PURE_FUNCTIONS = frozenset(map(id, (
    abs, all, any, ascii, bin, bool, callable, chr, complex, dict, divmod, enumerate, filter, float, format,
    frozenset, getattr, hasattr, hash, hex, int, isinstance, issubclass, iter, len, list, map, max, min, next,
    oct, ord, pow, range, repr, reversed, round, set, slice, sorted, str, sum, super, tuple, type, zip,
    functools.reduce, typing.cast)))
_PURE_MODULES = frozenset({"math", "cmath", "operator", "_operator", "itertools"})


def _torch_functions(*names: str) -> frozenset:
    """The ids of those of torch's functions (dotted names under torch) this torch has."""
    found = []
    for name in names:
        value = torch
        for part in name.split("."):
            value = getattr(value, part, None)
        if value is not None:
            found.append(id(value))
    return frozenset(found)


# torch's process state that a call's key does not hold (it holds grad and inference
# mode, the default dtype, deterministic algorithms and autocast): a trace reads it once
# (`torch.get_float32_matmul_precision() == "highest"` kept its first answer) or sets it
# once (`torch.manual_seed(7)` inside fn reseeded at the first call only). Dynamo guards
# or runs each at every call.
_PROCESS_STATE = _torch_functions(
    "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "cuda.manual_seed",
    "cuda.manual_seed_all", "cuda.seed", "cuda.initial_seed", "cuda.get_rng_state", "cuda.set_rng_state",
    "set_default_dtype", "set_default_device", "get_default_device", "set_default_tensor_type",
    "set_float32_matmul_precision", "get_float32_matmul_precision", "use_deterministic_algorithms",
    "is_deterministic_algorithms_warn_only_enabled", "set_deterministic_debug_mode",
    "get_deterministic_debug_mode", "set_num_threads", "get_num_threads", "set_num_interop_threads",
    "get_num_interop_threads", "set_flush_denormal", "is_anomaly_enabled", "is_anomaly_check_nan_enabled",
    "set_anomaly_enabled", "get_autocast_dtype", "get_autocast_cpu_dtype", "get_autocast_gpu_dtype",
    "set_autocast_dtype", "is_autocast_cache_enabled", "set_autocast_cache_enabled", "set_printoptions")
# Builtin types whose methods compute from the value and their arguments (`"-".join`, `d.get`).
_VALUE_TYPES = (str, bytes, int, float, complex, bool, tuple, list, dict, set, frozenset, range, slice)
_DESCRIPTORS = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType)
_CALLS = frozenset({"CALL", "CALL_KW", "CALL_FUNCTION_EX"})
_DEREFS = frozenset({"LOAD_DEREF", "LOAD_CLASSDEREF"})
_ROOT_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST", "LOAD_CONST"}) | _DEREFS
_ATTRIBUTE_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_STEPS = _ROOT_LOADS | _ATTRIBUTE_LOADS | _CALLS | {"BINARY_SUBSCR"}


class _Unknown(enum.Enum):
    """What a callee (or a subscripted container) is where no object can be read for it
    without running fn."""
    TRACED = "a value the trace records"  # a local (a tensor, a number), an expression's value, a tensor's
    RESULT = "a call's result"  # its call is checked where it is made; a user function's is looked into
    UNRESOLVED = "an attribute or item cleave cannot read"  # one a __getattr__ gives, a missing key


class _Reads:
    """What fn's code may read and call, followed from fn through each value it reads
    (`absorb`): the user functions it calls or names (looked into, up to _MAX_FUNCTIONS),
    the modules it reaches, and the scopes their code reads by name (`look_up`): globals,
    and the attributes of the user's Python modules and classes (`PM.k`, `cls.k`, `self.k`
    set on the class), of fn's owner (a plain object's bound method or a callable object:
    `self.s`) and of the functions (`fnattr.scale`). `guards` holds how each entry read
    is guarded (`_global_guard`). Each call those functions make is checked (`check`):
    one that is neither torch's, a module's, a user function's (looked into) nor, where
    its result is used, a pure builtin's (`_pure`) is made once, by the capture's trace
    (`random.uniform(...)`, `open(p, "a").write(...)`); `call` names the first."""

    def __init__(self):
        self.functions: dict = {}  # function looked into -> the objects bound to its first parameter
        self.homes: dict = {}  # function -> the user classes it was found on (a method: self is an instance)
        self.objects: dict = {}  # id -> an object whose methods may run: fn's owner, the modules, objects read
        self.modules: dict = {}  # id -> a module reached
        self.spaces: dict = {}  # id -> (namespace, the names read in it or None: every attribute name, class)
        self.classes: dict = {}  # id -> a user class whose attributes are read
        self.names: set = set()  # the attribute names the functions read
        self.guards: dict = {}  # (id of the scope or its class, name) -> (scope, name, how it is guarded)
        self.cells: dict = {}  # id -> (cell, how it is guarded, the name of the function it is of)
        self.done: set = set()  # the ids of the functions read and the values absorbed, (id, name) looked up
        self.grew = False  # whether anything was found since `follow` last looked
        self.package: str | None = None  # fn's package, where fn is a library's: its helpers are looked into
        self.too_many: str | None = None
        self.call: str | None = None  # the first call a capture would not make at each call

    @classmethod
    def of(cls, fn) -> _Reads | None:
        reads = cls()
        while isinstance(fn, functools.partial):
            reads.partial(fn)
            fn = fn.func
        func = _python_function(fn)
        if func is None:
            return reads if reads.guards else None
        owner = fn.__self__ if isinstance(fn, types.MethodType) else None if func is fn else fn
        if _library(func) and _package(func) not in _TRACED_PACKAGES:  # cleave's workloads call their helpers
            reads.package = _package(func)
        reads.functions[func] = [] if owner is None else [owner]  # read even where a library's (nn.Linear)
        if owner is fn:  # a module's forward or an object's __call__ is read off its class at each call
            reads.names.add(func.__name__)
        if owner is not None:
            reads.absorb(owner)
            if not isinstance(owner, (torch.nn.Module, type)) and isinstance(getattr(owner, "__dict__", None), dict):
                reads.spaces[id(owner)] = (vars(owner), None, type(owner))  # a module's: _ModuleTree's
        reads.follow()
        return reads

    def partial(self, p: functools.partial) -> None:
        """The arguments a partial binds, each read as a global is, and its keywords by
        content too (`p.keywords["s"] = 7.0` kept the first value)."""
        keywords = {"keywords": p.keywords}
        self.guard(keywords, "keywords", _Snapshot(p.keywords, _copied(p.keywords)))
        for scope in ({f"args[{i}]": value for i, value in enumerate(p.args)}, p.keywords):
            for name, value in scope.items():
                self.guard(scope, name, _global_guard(value))
                self.absorb(value)

    def follow(self) -> None:
        self.grew = True
        while self.grew:
            self.grew = False
            for f in list(self.functions):
                self.read(f)
            self.look_up()
            self.call = None
            for f in list(self.functions):  # a call may reach another function: checked in the next round
                self.call = self.call or self.check(f)
        self.call = self.call or self.too_many

    def guard(self, scope, name, how, holder=None) -> None:
        key = (id(scope if holder is None else holder), name)
        if how is not None and key not in self.guards:
            self.guards[key] = (scope, name, how)

    def add(self, f, bound=None, home=None) -> None:
        """Look into f, a user function; `bound`: what its first parameter is bound to (a
        method's object, a classmethod's class); `home`: a class it was found on."""
        if not isinstance(f, types.FunctionType) or not self.mine(f) and f not in self.functions:
            return
        if f not in self.functions:
            if len(self.functions) >= _MAX_FUNCTIONS:
                self.too_many = self.too_many or (f"it calls more than {_MAX_FUNCTIONS} functions of the user's "
                                                  f"({f.__name__} is one), more than cleave looks into")
                return
            self.functions[f] = []
            self.grew = True
        if bound is not None and all(b is not bound for b in self.functions[f]):
            self.functions[f].append(bound)
            self.grew = True
        if home is not None and home not in self.homes.setdefault(f, []):
            self.homes[f].append(home)
            self.grew = True

    def read(self, f: types.FunctionType) -> None:
        """f's code: the names it reads, its globals (by name), cells, defaults and own attributes."""
        if id(f) in self.done:
            return
        self.done.add(id(f))
        self.grew = True
        self.names |= _names_read(f.__code__)
        self.spaces.setdefault(id(f.__globals__), (f.__globals__, set(), None))[1].update(_globals_read(f.__code__))
        if vars(f):
            self.spaces[id(vars(f))] = (vars(f), None, None)
        for cell in f.__closure__ or ():
            how = _global_guard(_cell_value(cell))
            if how is not None:
                self.cells.setdefault(id(cell), (cell, how, f.__name__))
            self.absorb(_cell_value(cell))
        for scope, n in _defaults_read(f):
            self.guard(scope, n, _global_guard(scope[n]))
        for value in (*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values()):
            self.absorb(value)

    def look_up(self) -> None:
        """Each name read, in each scope read by name: how its entry is guarded, and its value followed."""
        for scope, names, klass in list(self.spaces.values()):
            for n in list(self.names if names is None else names):
                if (id(scope), n) in self.done:
                    continue
                self.done.add((id(scope), n))
                self.grew = True
                if n in scope:
                    self.guard(scope, n, _global_guard(scope[n]))
                    self.absorb(scope[n])
                elif klass is not None and any(n in vars(base) for base in self.bases(klass)):
                    self.guard(scope, n, _MISSING)  # an object's attribute would hide its class's
        for klass in list(self.classes.values()):
            for n in list(self.names):
                if (id(klass), n) not in self.done:
                    self.done.add((id(klass), n))
                    self.grew = True
                    self.class_attribute(klass, n)

    def class_attribute(self, klass: type, n: str) -> None:
        """n read off klass or an instance: guarded where a user class of its MRO defines it,
        and as absent in those before the first that does (one set there would hide it);
        each definition followed (super() reaches those after the first)."""
        missing, defined = [], False
        for base in self.bases(klass):
            if n in vars(base):
                self.guard(vars(base), n, _class_guard(vars(base)[n]), base)
                self.absorb(vars(base)[n], base)
                defined = True
            elif not defined:
                missing.append(base)
        for base in missing if defined else ():
            self.guard(vars(base), n, _MISSING, base)

    def absorb(self, value, home=None) -> None:
        """Follow a value fn's code reads: a function is looked into (with the class it was
        found on), a method's object followed; a module's tree is reached and its classes'
        forwards and the functions it holds looked into; a user class's or Python module's
        attributes are read by name; a container's items are followed."""
        if isinstance(value, staticmethod):
            self.add(value.__func__)
        elif isinstance(value, classmethod):
            self.add(value.__func__, bound=home)
        elif isinstance(value, property):
            self.add(value.fget, home=home)
        elif isinstance(value, types.FunctionType):
            self.add(value, home=home)
            self.absorb(vars(value).get("__wrapped__"))  # a decorated function's own code (functools.wraps)
        elif isinstance(value, types.MethodType):
            self.add(value.__func__, bound=value.__self__)
            self.absorb(value.__self__)
        elif id(value) not in self.done and not isinstance(value, (torch.Tensor, *_SCALARS, type(None))):
            self.done.add(id(value))
            self.grew = True
            if isinstance(value, torch.nn.Module):
                self.module(value)
            elif isinstance(value, type):
                if self.mine(value):
                    self.classes[id(value)] = value
            elif isinstance(value, types.ModuleType):
                if _user_module(value):
                    self.spaces[id(value)] = (vars(value), None, None)
            elif isinstance(value, (list, tuple, dict, set, frozenset)):
                for item in list(value.values() if isinstance(value, dict) else value)[:_COMPARED_ITEMS]:
                    self.absorb(item)
            elif isinstance(getattr(value, "__dict__", None), dict):
                self.objects[id(value)] = value
                self.absorb(type(value))

    def module(self, module: torch.nn.Module) -> None:
        for m in _modules(module):
            if id(m) in self.modules:
                continue
            self.modules[id(m)] = self.objects[id(m)] = m
            self.absorb(type(m))
            self.absorb(inspect.getattr_static(type(m), "forward", None), type(m))  # a submodule's is traced too
            for key, value in vars(m).items():  # functions it holds (`self.act = my_gelu`), classes
                if key not in _MODULE_INTERNALS:
                    self.absorb(value)

    def mine(self, obj) -> bool:
        """Whether a function or class is code the analysis looks into: the user's, or of
        fn's own package where fn is a library's."""
        return not _library(obj) or self.package is not None and _package(obj) == self.package

    def bases(self, klass: type) -> list[type]:
        """The classes of klass's MRO up to the first that is not `mine` (nn.Module's
        attributes are its business)."""
        return list(itertools.takewhile(self.mine, klass.__mro__))

    def runs(self, callee) -> list | None:
        """The functions a call of callee runs that the analysis looks into, each with what
        its first parameter is bound to: a function, a method of one, a class's `__new__`,
        `__init__` and `__post_init__`, an object's `__call__`; None where callee is not
        `mine`."""
        if isinstance(callee, types.FunctionType):
            return [(callee, None)] if self.mine(callee) else None
        if isinstance(callee, types.MethodType):
            return self.runs(callee.__func__) and [(callee.__func__, callee.__self__)]
        klass = callee if isinstance(callee, type) else type(callee)
        if not self.mine(klass):
            return None
        found = [inspect.getattr_static(klass, n, None) for n in
                 (("__new__", "__init__", "__post_init__") if callee is klass else ("__call__",))]
        runs = [(g, None if callee is klass else callee) for g in (getattr(g, "__func__", g) for g in found)
                if isinstance(g, types.FunctionType) and self.mine(g)]
        return runs if runs or callee is klass else None

    def selves(self, f) -> list:
        """What f's first parameter may be: what it was bound to, and the objects reached that
        are instances of a class it was found on."""
        homes = tuple(self.homes.get(f, ()))
        return self.functions[f] + [o for o in self.objects.values() if homes and isinstance(o, homes)]

    def check(self, f: types.FunctionType) -> str | None:
        """The first call in f's code (or one of the code nested in it) a capture would not
        make at each call, or subscript it would not read again (`os.environ[k]`): its
        callee read statically, from the name it starts with through each attribute, item
        and call (`_spine`), as each object it may be. A user function it calls is looked
        into (`add`)."""
        code = f.__code__
        cells = dict(zip(code.co_freevars, f.__closure__ or ()))
        this = code.co_varnames[0] if code.co_argcount else None
        for inner in _codes(code):
            instructions = list(dis.get_instructions(inner))
            for at, ins in enumerate(instructions):
                if ins.opname not in _CALLS and ins.opname != "BINARY_SUBSCR":
                    continue
                spine = _spine(instructions, at)
                if not spine:
                    continue
                values = self.roots(f, inner, instructions[spine[0]], cells, this)
                for before, k in zip(spine, spine[1:]):
                    values = [v for value in values for v in self.step(value, instructions[before + 1:k + 1])]
                    values = values if len(values) <= _COMPARED_ITEMS else [_Unknown.UNRESOLVED]
                what = _source(instructions, spine)
                if ins.opname == "BINARY_SUBSCR":
                    if not all(map(self.item_read, values)):
                        return f"it reads {what}[...] in {f.__name__}, which a capture would read once, at its trace"
                elif not all(self.made(v, instructions[at + 1].opname != "POP_TOP") for v in values):
                    kept = "result a capture would keep" if instructions[at + 1].opname != "POP_TOP" else \
                        "effect a capture would drop"
                    return f"it calls {what} in {f.__name__}, whose {kept} (its trace makes the call, once)"
        return None

    def roots(self, f, code, ins, cells: dict, this: str | None) -> list:
        """What the first instruction of a callee loads: a global's or builtin's value, a
        cell's, a constant, the objects f's first parameter may be; TRACED for another local
        or an expression's value; nothing where the name is unbound (the trace raises)."""
        op, name = ins.opname, ins.argval
        if op in ("LOAD_GLOBAL", "LOAD_NAME"):
            found = f.__globals__.get(name, vars(builtins).get(name, _MISSING))
        elif op == "LOAD_CONST":
            found = name
        elif name == this and (op == "LOAD_FAST" and code is f.__code__ or op in _DEREFS and name not in cells):
            return self.selves(f) or [_Unknown.TRACED]
        elif op in _DEREFS and name in cells:
            found = _cell_value(cells[name])
        else:
            return [_Unknown.TRACED]
        return [] if found is _MISSING else [found]

    def step(self, value, instructions: list) -> list:
        """What the next step of a callee gives from value: `instructions` ends with the
        step (an attribute read, a subscript, a call) and holds what it takes before it."""
        ins = instructions[-1]
        if isinstance(value, _Unknown):
            return [value]
        if ins.opname in _ATTRIBUTE_LOADS and not _traced(value):
            return [self.attribute(value, ins.argval)]
        if ins.opname in _ATTRIBUTE_LOADS and isinstance(value, types.ModuleType):  # torch.cuda.manual_seed
            found = inspect.getattr_static(value, ins.argval, _MISSING)  # (_PROCESS_STATE)
            return [found if found is not _MISSING else _Unknown.TRACED]
        if isinstance(value, torch.nn.Module) or _traced(value):
            return [_Unknown.TRACED]
        if ins.opname == "BINARY_SUBSCR":
            return _items(value, _constant(instructions[:-1]))
        return [_Unknown.RESULT]

    def attribute(self, value, name: str):
        """value.name, read without running code: a module's parameter, buffer or child, or
        what its type defines, bound as the read would bind it; a property's getter is
        looked into."""
        if isinstance(value, torch.nn.Module):
            for table in (value._parameters, value._buffers, value._modules):
                if name in table:
                    return table[name]
        found = inspect.getattr_static(value, name, _MISSING)
        if found is _MISSING:
            return _Unknown.UNRESOLVED
        if isinstance(found, staticmethod):
            return found.__func__
        if isinstance(found, classmethod):
            return types.MethodType(found.__func__, value if isinstance(value, type) else type(value))
        if isinstance(found, property):
            self.add(found.fget, bound=value)
            return _Unknown.RESULT
        bound = not isinstance(value, (type, types.ModuleType)) and name not in getattr(value, "__dict__", {})
        return types.MethodType(found, value) if bound and isinstance(found, types.FunctionType) else found

    def made(self, callee, used: bool) -> bool:
        """Whether a capture makes a call of callee as eager does, at each call: torch's and
        modules' calls are in the trace, a user function's code is looked into, and a call
        whose result is used may be of a pure builtin."""
        if callee is _Unknown.TRACED or callee is _Unknown.RESULT and used:
            return True
        if isinstance(callee, _Unknown) or id(callee) in _PROCESS_STATE:
            return False
        if isinstance(callee, torch.nn.Module) or _traced(callee):
            return True
        runs = self.runs(callee)
        for g, bound in runs or ():
            self.add(g, bound)
        return runs is not None or used and _pure(callee)

    def item_read(self, container) -> bool:
        """Whether a capture reads container[k] as eager does: a builtin container's item
        (its contents are guarded), a tensor's, a module's, or a user __getitem__'s (looked
        into)."""
        if isinstance(container, (_Unknown, torch.nn.Module, type)) or _traced(container):
            return True
        if container is sys.modules:  # a library's dict: the modules it gives are not followed
            return False
        getitem = inspect.getattr_static(type(container), "__getitem__", None)
        if isinstance(getitem, types.FunctionType) and self.mine(getitem):
            self.add(getitem, bound=container)
            return True
        return getitem is None or _pure(getitem)


def _items(container, key) -> list:
    """What container[key] may be, for a list, tuple or dict (a constant key's item, or any
    item); RESULT for other containers (the subscript is checked where it is made)."""
    getitem = inspect.getattr_static(type(container), "__getitem__", None)
    if not any(getitem is g for g in (list.__getitem__, tuple.__getitem__, dict.__getitem__)):
        return [_Unknown.RESULT]
    if key is not _MISSING:
        try:
            return [container[key]]
        except (LookupError, TypeError):
            return [_Unknown.UNRESOLVED]
    return list(container.values() if isinstance(container, dict) else container)


def _constant(instructions: list):
    """The constant `instructions` load, where they load one only (a subscript's key); else _MISSING."""
    return instructions[0].argval if len(instructions) == 1 and instructions[0].opname == "LOAD_CONST" else _MISSING


def _traced(value) -> bool:
    """Whether value is torch's (or einops'): a tensor, or a function, class, object or
    Python module of theirs. What a call of it or on it does is in the trace."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, types.ModuleType):
        module = value.__name__
    elif isinstance(value, types.MethodType):
        return _traced(value.__func__)
    elif isinstance(value, (types.FunctionType, type)):
        module = value.__module__
    elif isinstance(value, types.BuiltinFunctionType):  # a builtin function, or a method of a builtin object
        module = value.__module__ or type(value.__self__).__module__
    elif isinstance(value, _DESCRIPTORS):
        module = value.__objclass__.__module__
    else:
        module = type(value).__module__
    return (module or "").split(".")[0] in _TRACED_PACKAGES


def _pure(callee) -> bool:
    """Whether a call of callee gives what its arguments (and what fn's guards hold) alone
    give: a builtin such as len, min or isinstance, a function or class of math, operator
    or itertools, a method of a builtin value (`"-".join`, `CONFIG.get`), an exception's
    class (`raise ValueError(...)`), a NumPy ufunc, functools.reduce, typing.cast."""
    if id(callee) in _PURE_FUNCTIONS:
        return True
    if isinstance(callee, type):
        return issubclass(callee, BaseException) or callee.__module__ in _PURE_MODULES
    if isinstance(callee, _DESCRIPTORS):
        return callee.__objclass__ in _VALUE_TYPES
    if isinstance(callee, types.BuiltinFunctionType):  # a builtin function, or a builtin object's or class's method
        owner = callee.__self__ if isinstance(callee.__self__, type) else type(callee.__self__)
        return callee.__module__ in _PURE_MODULES or owner in _VALUE_TYPES or owner.__module__ in _PURE_MODULES
    return type(callee).__name__ == "ufunc" and type(callee).__module__ == "numpy"


def _library(obj) -> bool:
    """Whether a function or class is _LIBRARIES' code."""
    return _package(obj) in _LIBRARIES


def _package(obj) -> str:
    return (getattr(obj, "__module__", None) or "").split(".")[0]


def _user_module(value) -> bool:
    """A Python module of the user's (a config module whose attributes fn reads), not
    one of _LIBRARIES."""
    return isinstance(value, types.ModuleType) and (value.__name__ or "").split(".")[0] not in _LIBRARIES


def _globals_read(code: types.CodeType) -> set[str]:
    """The global names code and the code nested in it loads."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_read(const)
    return names


def _names_read(code: types.CodeType) -> set[str]:
    """The global and attribute names code and the code nested in it reads, and the names
    it spells as strings (`getattr(self, "scale")`)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_read(const)
        elif isinstance(const, str) and const.isidentifier():
            names.add(const)
    return names


def _defaults_read(f: types.FunctionType) -> list[tuple[dict, str]]:
    """(scope, name) of the defaults of f whose contents a call can change while f keeps
    its defaults tuple and dict (Guards.functions holds those by identity): each
    keyword-only default (`f.__kwdefaults__["k"] = 7` changes the dict in place), and each
    positional one that is not an immutable _VALUES value (a tensor, a list, a config)."""
    code, defaults = f.__code__, f.__defaults__ or ()
    names = code.co_varnames[code.co_argcount - len(defaults):code.co_argcount]
    positional = dict(zip(names, defaults))
    keyword_only = f.__kwdefaults__ or {}
    return [(keyword_only, n) for n in keyword_only] + \
        [(positional, n) for n, v in positional.items() if not isinstance(v, _VALUES)]


def _codes(code: types.CodeType) -> list[types.CodeType]:
    """code and the code nested in it (inner functions, lambdas, comprehensions)."""
    return [code] + [c for const in code.co_consts if isinstance(const, types.CodeType) for c in _codes(const)]


def _spine(instructions: list, at: int) -> list[int]:
    """The indices of the instructions that compute the callee of the call at `at` (or the
    container of the subscript there), in order, each a longer prefix of its source:
    `logging`, `logging.getLogger`, its call, `.warning` in `logging.getLogger(n).warning(m)`.
    They are those before it that start where it starts and end before it ends. Empty for
    a call the compiler added (a with block's exit)."""
    span = instructions[at].positions
    if span is None or span.lineno is None:
        return []
    start, end = (span.lineno, span.col_offset), (span.end_lineno, span.end_col_offset)
    spine = []
    for k in range(at - 1, -1, -1):
        where = instructions[k].positions
        if where is None or where.lineno is None:
            continue
        if (where.lineno, where.col_offset) < start:
            break
        if (where.lineno, where.col_offset) == start and (where.end_lineno, where.end_col_offset) < end and \
                instructions[k].opname in _STEPS:
            spine.append(k)
    return spine[::-1]


def _source(instructions: list, spine: list[int]) -> str:
    """A callee's source as a message names it: `logging.getLogger(...).warning`, `CALLBACKS[0]`."""
    text = ""
    for before, k in zip([None, *spine], spine):
        ins = instructions[k]
        if ins.opname in _ATTRIBUTE_LOADS:
            text += f".{ins.argval}"
        elif ins.opname == "BINARY_SUBSCR" and before is None:  # `(x * 2)[:1].expand(...)`: of an expression
            text += "(...)[...]"
        elif ins.opname == "BINARY_SUBSCR":
            key = _constant(instructions[before + 1:k])
            text += "[...]" if key is _MISSING else f"[{key!r}]"
        elif ins.opname in _CALLS:
            text += "(...)"
        else:
            text += repr(ins.argval) if ins.opname == "LOAD_CONST" else str(ins.argval)
    return text


class _DynamoHookGuards:
    """torch.compile guards no hook of a module that had none when it compiled (torch's
    `skip_nnmodule_hook_guards`, on by default): a hook registered later would not run.
    The frames compiled for cleave.compile's dynamo path are compiled with the option
    off, so their guards see a hook added later and the frame compiles again. A frame's
    guards are built after its backend returns, in the same call: the backend turns the
    option off and the end of the call (`call_done`) turns it back, once no compile of
    another thread needs it off."""

    def __init__(self):
        self.lock = threading.Lock()
        self.compiling = 0  # calls in flight that compiled with the option off
        self.saved = True
        self.here = threading.local()

    def backend(self, backend):
        @functools.wraps(backend)
        def compile_guarding_hooks(gm, example_inputs):
            if not getattr(self.here, "compiled", False):
                with self.lock:
                    if self.compiling == 0:
                        self.saved = torch._dynamo.config.skip_nnmodule_hook_guards
                        torch._dynamo.config.skip_nnmodule_hook_guards = False
                    self.compiling += 1
                self.here.compiled = True
            return backend(gm, example_inputs)
        return compile_guarding_hooks

    def call_done(self) -> None:
        if getattr(self.here, "compiled", False):
            self.here.compiled = False
            with self.lock:
                self.compiling -= 1
                if self.compiling == 0:
                    torch._dynamo.config.skip_nnmodule_hook_guards = self.saved


DYNAMO_HOOK_GUARDS = _DynamoHookGuards()
