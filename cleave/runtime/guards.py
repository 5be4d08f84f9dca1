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
import dis
import enum
import functools
import inspect
import operator
import sys
import threading
import types
from typing import NamedTuple

import torch
from torch.nn.modules import module as nn_module
from torch.utils.hooks import RemovableHandle

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


class Guards:
    """What the capture bakes into the graph besides the arguments, as it was when fn was
    captured: the globals and closure cells fn's code reads (`_global_guard`), the
    attributes it reads off a module or callable object it is (`self.scale`) that hold
    a tensor, a Python scalar or a module, and the modules fn reaches (`_ModuleTree`).
    `hold()` runs per call, so it compares cheaply: a tensor by identity, version (an
    in-place change) and data pointer (a `.data` write), a scalar by type and value
    (x * 2 and x * 2.0 differ on integers), a module or function by identity, a
    container or plain object by content (`_Snapshot`). The same holds for what the functions fn calls
    read (a helper's global scale), wherever they are reached from: fn's globals and
    cells, and the methods and forwards of the modules it reaches (`_reached`); and for
    the class attributes those read off a module (`self.factor` set on the class). Those
    functions' code and defaults are guarded too, by identity (autoreload replaces
    `__code__`), and their defaults' contents as globals are (`_defaults_read`)."""

    def __init__(self, names: list, cells: list, modules: _ModuleTree | None, functions: list):
        self.names = names  # (globals or attribute dict, name, value or _Snapshot, version, data pointer)
        self.cells = cells  # (cell, value or _Snapshot, version, data pointer)
        self.modules = modules
        self.functions = functions  # (function, its __code__, __defaults__, __kwdefaults__)
        self.opaque: str | None = None  # a global or cell read whose changes cannot be compared
        self.effect: str | None = None  # a call whose effect a capture drops (`_dropped_call`)

    @classmethod
    def read_by(cls, fn) -> Guards | None:
        func = _python_function(fn)
        if func is None:
            return None
        owner = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
        # the modules fn reaches directly: itself or its method's, those in its globals and cells
        direct = [owner] + [func.__globals__.get(n) for n in _globals_read(func.__code__)] + \
            [_cell_value(c) for c in func.__closure__ or ()]
        near = [m for root in direct if isinstance(root, torch.nn.Module) for m in root.modules()]
        classes = [k for k in dict.fromkeys(type(m) for m in near) if not _library(k)]
        helpers = [v for m in near for v in vars(m).values() if isinstance(v, types.FunctionType)]
        names, cells, seen, opaque = [], [], set(), []

        def guard(scope, n, how):
            if (id(scope), n) in seen:
                return
            seen.add((id(scope), n))
            if how is _OPAQUE:
                opaque.append(n)
            elif how is not None:
                names.append((scope, n, *_guarded(how)))

        functions = _reached(func, classes, helpers)
        for f in functions:
            own = [vars(fn)] if f is func and func is not fn and hasattr(fn, "__dict__") else []
            attributes = sorted(_names_read(f.__code__))
            # and the user Python modules it reads, through a global or a cell (`config.SCALE`)
            namespaces = [f.__globals__] + [vars(m) for m in map(_cell_value, f.__closure__ or ()) if _user_module(m)]
            for scope in namespaces:
                for n in (sorted(_globals_read(f.__code__)) if scope is f.__globals__ else attributes):
                    if n in scope:
                        guard(scope, n, _global_guard(scope[n]))
                        if _user_module(scope[n]) and all(vars(scope[n]) is not d for d in namespaces):
                            namespaces.append(vars(scope[n]))
            for scope, n in _defaults_read(f):
                guard(scope, n, _global_guard(scope[n]))
            for n in attributes:
                for scope in own:  # attributes of the callable object fn itself
                    if n in scope and _guardable(scope[n]):
                        guard(scope, n, scope[n])
                for klass in classes:  # a class attribute read off a module: no instance entry holds it
                    scope = _defining_dict(klass, n)
                    if scope is not None and _guardable(scope[n]):
                        guard(scope, n, scope[n])
            for cell in f.__closure__ or ():
                how = _global_guard(_cell_value(cell))
                if how is _OPAQUE:
                    opaque.append(f"a closure variable of {f.__name__}")
                elif how is not None:
                    cells.append((cell, *_guarded(how)))
        values = [value for _, _, value, _, _ in names] + [value for _, value, _, _ in cells]
        reached = [value for value in values if isinstance(value, torch.nn.Module)]
        if isinstance(owner, torch.nn.Module) and owner is not fn:  # model.forward: its state is baked in
            reached.append(owner)
        compiled = fn if isinstance(fn, torch.nn.Module) else None
        modules = _ModuleTree(compiled, reached) if compiled is not None or reached else None
        guards = cls(names, cells, modules, [(f, f.__code__, f.__defaults__, f.__kwdefaults__) for f in functions])
        if opaque:
            guards.opaque = (f"it reads {opaque[0]!r}, an object whose changes cleave cannot tell (a capture "
                             f"would keep the value it read)")
        effect = _dropped_call(functions)
        if effect:
            guards.effect = f"it calls {effect}, whose effect a capture would drop (its trace makes it, once)"
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
                _refill(now if isinstance(now, (list, dict, set)) else vars(now), _copied(snapshot.held))
        return changed

    @property
    def needs_dynamo(self) -> str | None:
        """Why a capture cannot serve fn (an object it reads, a call made for its effect, a
        hook, ...), or None."""
        return self.opaque or self.effect or (self.modules.needs_dynamo if self.modules is not None else None)

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
        own_modules = list(compiled.modules()) if compiled is not None else []
        modules = dict.fromkeys(own_modules)  # unique, in order
        for root in reached:
            modules.update(dict.fromkeys(root.modules()))
        self.modules = list(modules)
        # why a capture cannot serve these modules (a hook, an attribute equality cannot
        # compare); None when it can
        self.needs_dynamo: str | None = None
        if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
            self.needs_dynamo = "a global forward hook is registered"
        self.hook_counter = RemovableHandle.next_id  # registering any hook anywhere advances it
        self.attributes = []  # per module: (a getter of its checked __dict__ entries, __dict__, its size, them)
        self.tables = []  # (parameter or buffer table of a global module, its size)
        self.tensors = []  # (table, key, tensor, version, data pointer)
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
        self.attributes.append((checked, d, len(d), _copied(checked(d))))  # lists and dicts compare by content
        if holds_state:
            for table in (m._parameters, m._buffers):
                self.tables.append((table, len(table)))
                # a one-element tensor is baked into the graph as a number: in place too
                self.tensors += [(table, key, *_guarded(t, versioned=t is not None and t.numel() == 1))
                                 for key, t in table.items()]

    def hold(self) -> bool:
        if RemovableHandle.next_id != self.hook_counter and not self._no_hooks():
            return False
        try:
            for checked, d, size, values in self.attributes:
                if len(d) != size or checked(d) != values:
                    return False
        except Exception:  # noqa: BLE001 - an entry deleted, or one equality cannot compare: changed
            return False
        for table, size in self.tables:
            if len(table) != size:
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
    """value with its lists, tuples, dicts and sets copied as they are now, other values shared."""
    if isinstance(value, list):
        return list(map(_copied, value))
    if isinstance(value, tuple):
        return tuple(map(_copied, value))
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, set):
        return set(value)
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
    function, another immutable _VALUES value), a _Snapshot, None where it needs no
    guard (a Python module or a class), or _OPAQUE where cleave cannot tell its changes."""
    if isinstance(value, (types.ModuleType, type)):
        return None
    if value is _MISSING or _guardable(value) or isinstance(value, _VALUES):  # _MISSING: an empty cell
        return value
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return _Snapshot(value, _copied(value)) if _comparable(value) else _OPAQUE
    held = getattr(value, "__dict__", None)
    if isinstance(held, dict) and not callable(value) and _comparable(held):
        return _Snapshot(value, _copied(held))
    return _OPAQUE


_OPAQUE = object()


def _guarded(value, versioned: bool = True) -> tuple:
    """value, and for a tensor its version (None where an in-place change needs no new
    capture) and data pointer."""
    if not isinstance(value, torch.Tensor):
        return value, None, None
    return value, value._version if versioned else None, _data_pointer(value)


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
# Functions looked into at most, per capture: a guard is checked at every call.
_MAX_FUNCTIONS = 64


def _reached(func: types.FunctionType, classes: list, helpers: list) -> list[types.FunctionType]:
    """func and the user functions it may call, breadth first: those its code names in
    its globals or holds in its cells, or reads off a user's module it so names, the
    methods of `classes` (the modules fn reaches) it names, those classes' forwards (a
    submodule's forward is traced too), and `helpers`, functions those modules hold
    (`self.act = my_gelu`)."""
    def user(f) -> bool:
        f = getattr(f, "__func__", f)
        return isinstance(f, types.FunctionType) and not _library(f)

    found = [func]
    for g in [inspect.getattr_static(klass, "forward", None) for klass in classes] + helpers:
        if user(g) and g not in found:
            found.append(g)
    i = 0
    while i < len(found) and len(found) < _MAX_FUNCTIONS:
        f = found[i]
        i += 1
        called = [f.__globals__.get(n) for n in _globals_read(f.__code__)] + \
            [_cell_value(c) for c in f.__closure__ or ()]
        names = _names_read(f.__code__)
        called += [inspect.getattr_static(klass, n, None) for klass in classes for n in names]
        # a user module's functions it calls (`settings.helper(x)`): their globals are read too
        called += [vars(m).get(n) for m in list(called) if _user_module(m) for n in names]
        for g in called:
            g = getattr(g, "__func__", g)  # a staticmethod's or classmethod's function
            if user(g) and g not in found:
                found.append(g)
    return found[:_MAX_FUNCTIONS]


def _library(obj) -> bool:
    """Whether a function or class is _LIBRARIES' code."""
    return (getattr(obj, "__module__", None) or "").split(".")[0] in _LIBRARIES


def _user_module(value) -> bool:
    """A Python module of the user's (a config module whose attributes fn reads), not
    one of _LIBRARIES."""
    return isinstance(value, types.ModuleType) and (value.__name__ or "").split(".")[0] not in _LIBRARIES


def _defining_dict(klass: type, name: str):
    """The __dict__ of the class in klass's MRO that defines name, where a user class
    does (nn.Module's own attributes are its business), else None."""
    for base in klass.__mro__:
        if name in vars(base):
            return None if _library(base) else vars(base)
    return None


def _globals_read(code: types.CodeType) -> set[str]:
    """The global names code and the code nested in it loads."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_read(const)
    return names


def _names_read(code: types.CodeType) -> set[str]:
    """The global (and attribute) names code and the code nested in it reads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_read(const)
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


def _dropped_call(functions: list) -> str | None:
    """A call of `functions` whose effect a capture would drop, as `print in fn`; None if
    there is none. A call whose result the code throws away (`print(x)`, `warnings.warn(w)`,
    `log.info(m)` as statements) is made for its effect. Where the code names what it calls
    (through a global, a cell or a builtin, and their attributes) and that is neither
    torch's (the trace records it) nor a user function (its own calls are looked into),
    only the capture's trace makes the effect: eager and dynamo make it at every call."""
    functions = list(functions)
    for f in functions:  # grows with the user functions called for their effect
        for code in _codes(f.__code__):
            for name, callee in _discarded_calls(f, code):
                if isinstance(callee, types.FunctionType) and not _library(callee):
                    if callee not in functions and len(functions) < _MAX_FUNCTIONS:
                        functions.append(callee)
                elif not _traced(callee):
                    return f"{name} in {f.__name__}"
    return None


def _codes(code: types.CodeType) -> list[types.CodeType]:
    """code and the code nested in it (inner functions, lambdas, comprehensions)."""
    return [code] + [c for const in code.co_consts if isinstance(const, types.CodeType) for c in _codes(const)]


_ROOT_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF"})
_ATTRIBUTE_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def _discarded_calls(f: types.FunctionType, code: types.CodeType):
    """(dotted name, callee) of each call in code whose result is popped unused and whose
    callee the code names: a global, builtin or (in f's own code) free variable, then
    attributes. The callee's instructions are those before the call that start where the
    call's source starts and end before it does (`warnings` then `warnings.warn` in
    `warnings.warn(m)`)."""
    instructions = list(dis.get_instructions(code))
    cells = dict(zip(code.co_freevars, f.__closure__ or ())) if code is f.__code__ else {}
    for i in range(len(instructions) - 1):
        call = instructions[i]
        if call.opname != "CALL" or instructions[i + 1].opname != "POP_TOP":
            continue
        chain = _callee_chain(instructions, i)
        if not chain or chain[0].opname not in _ROOT_LOADS or any(c.opname not in _ATTRIBUTE_LOADS
                                                                    for c in chain[1:]):
            continue  # a local's method (`parts.append(y)`, `x.add_(1)`): the trace records it
        value = _named_object(f, chain, cells)
        if value is not _MISSING:
            yield ".".join(c.argval for c in chain), value


def _named_object(f: types.FunctionType, chain: list, cells: dict):
    """What a chain of loads in f's code names (`warnings.warn`), read without running any
    of it (no property, no __getattr__); _MISSING where it cannot be read."""
    root = chain[0].argval
    if chain[0].opname in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
        value = _cell_value(cells[root]) if root in cells else _MISSING
    else:
        value = f.__globals__.get(root, vars(builtins).get(root, _MISSING))
    for step in chain[1:]:
        if value is _MISSING:
            break
        value = inspect.getattr_static(value, step.argval, _MISSING)
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def _callee_chain(instructions: list, call: int) -> list:
    """The instructions that evaluate the callee of the call at index `call`: back from it
    while inside its source span, those starting where it starts and ending before it
    ends, in order; empty when they do not each extend the one before."""
    span, chain = instructions[call].positions, []
    if span is None or span.lineno is None:  # a call the compiler added (a with block's exit)
        return chain
    for k in range(call - 1, -1, -1):
        at = instructions[k].positions
        if at is None or at.lineno is None or (at.lineno, at.col_offset) < (span.lineno, span.col_offset) or \
                (at.end_lineno, at.end_col_offset) > (span.end_lineno, span.end_col_offset):
            break
        if (at.lineno, at.col_offset) == (span.lineno, span.col_offset) and \
                (at.end_lineno, at.end_col_offset) < (span.end_lineno, span.end_col_offset):
            chain.append(instructions[k])
    chain.reverse()
    ends = [(c.positions.end_lineno, c.positions.end_col_offset) for c in chain]
    return chain if all(a < b for a, b in zip(ends, ends[1:])) else []


def _traced(callee) -> bool:
    """Whether what a call does is in the trace: torch's functions and methods, and modules
    (their forwards are traced, their state watched)."""
    if isinstance(callee, torch.nn.Module):
        return True
    owner = getattr(callee, "__objclass__", callee)  # a method of a builtin type: its class's
    module = getattr(owner, "__module__", None) or type(owner).__module__ or ""
    return module.split(".")[0] == "torch"


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
