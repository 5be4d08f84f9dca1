"""cleave.capture: a PyTorch function -> an IR graph with symbolic dims, via torch.export."""
from __future__ import annotations

import contextlib
import inspect
import io
import keyword
import logging
import operator
import re
import sys
import types
import warnings
from dataclasses import dataclass, field

import torch

from ..ir import Graph, rebuild
from ..ir import dims as D
from ..ir.graph import fresh_name, kernel_name_clash
from . import aten_map
from .aten_layout import storage_dependent
from .aten_scatter import WRITTEN_BACK
from .errors import CaptureError, Unify, UnsupportedOpError, source_of
from .empty_values import fold_empty_values
from .layout_sink import sink_layouts
from .narrowing import aten_refusal
from .output_layout import eager_order, kernels_lay_out
from .unify import resolved
from .masks import simplify_masks
from .regroup import regroup_repeated_operands
from .size_decisions import constrain_to_decisions, recorded_comparisons
from .symbols import SymbolMap
from .translate import Translator, ir_dtype


@dataclass
class Captured:
    """A captured function: its graph, and how the graph meets the function's world."""
    graph: Graph
    # graph input -> the module's state_dict key it reads (a parameter or buffer)
    state: dict[str, str] = field(default_factory=dict)
    # graph output -> the function input it is the new value of (an in-place op on it)
    writes: dict[str, str] = field(default_factory=dict)
    # the user outputs eager returns as views of an input or parameter (`x.t()`, `x[0]`,
    # `x` itself), named: a kernel's result would be a new tensor, not an alias
    views: list[str] = field(default_factory=list)
    # graph input -> (value, source line) of a tensor constant the function makes
    # (`torch.tensor([1.0, 2.0])`, the index list of `x[:, [0, 2]]`): the IR holds no
    # tensor values, so the runner passes it as an input of its own
    constants: dict = field(default_factory=dict)
    # graph inputs standing for an int argument whose symbol no tensor carries (`x[:n]`):
    # a [n] tensor the runner makes from the int, so the operator reads n off the shapes
    size_inputs: list = field(default_factory=list)
    # whether an op reads the inputs' storage (as_strided), which the graph reads as
    # contiguous from offset 0 as the example inputs were: other layouts run eagerly
    reads_storage: bool = False
    # graph output -> the stride order eager lays it out in, where that is not row-major
    # (output_layout.eager_order): the runtime computes it permuted so
    output_orders: dict = field(default_factory=dict)


def capture(fn, *example_inputs, dynamic=None, name=None) -> Graph:
    """Trace `fn(*example_inputs)` and translate it into an IR graph.

    `dynamic` names the axes that stay symbolic: `{"q": {0: "b"}, "k": {2: "L"}}`
    (parameter name -> axis -> symbol; equal names are one symbol), or `"all"`
    (every axis, named `<param>_<axis>`; torch merges axes it proves equal and keeps
    size-1 axes static). Other axes become ints. Graph inputs take the parameter names
    (`a_0, a_1, ...` for the entries of `*a`); a module's parameters and buffers are
    inputs named by their state_dict key (`proj.weight` -> `proj_weight`). Example
    inputs that share memory are still distinct inputs. An in-place op on an input
    adds an output `<input>_inplace`, its new value (`capture_program` says which).
    Raises UnsupportedOpError (naming the aten op and the source line) for an op cleave
    cannot express, CaptureError when torch cannot trace the function.
    """
    captured = capture_program(fn, *example_inputs, dynamic=dynamic, name=name)
    if captured.constants:  # a graph alone cannot carry a constant's values
        value, source = next(iter(captured.constants.values()))
        raise UnsupportedOpError("tensor constant", source, f"a constant tensor of shape {list(value.shape)} is "
                                 f"made inside the function; pass it as an input (cleave.compile and the "
                                 f"torch.compile backend pass it themselves)")
    return captured.graph


def capture_program(fn, *example_inputs, dynamic=None, name=None, outside=frozenset(),
                    auto: bool | None = None, traced_sizes: bool = False) -> Captured:
    """`capture`, plus where the graph's other inputs come from and which outputs are
    inputs' new values (what a runtime needs to run it in the function's place).
    `outside`: the data pointers of tensors that live on after the call (a global, a
    module's attribute), which may change in place: one-element ones among them stay
    inputs of the graph (constant_node). `auto` (default: `dynamic == "all"`): an axis
    named dynamic that the code fixes to its size is captured static, not refused.
    `traced_sizes` (the runtime's captures): the unification chooses by the sizes torch
    traced (frontends/unify.py), so that a view's `d // 2` beside a cache's head dim, or
    a clamp's side, reads as torch guarded it; the user's own symbols may then be read as
    others (n as 12·n_by4_by3), which `cleave.capture` leaves as named."""
    params = param_names(fn, len(example_inputs))
    _check_arity(fn, len(example_inputs))
    for pname, x in zip(params, example_inputs):
        if not isinstance(x, torch.Tensor):
            raise CaptureError(f"capture: example input {pname!r} is a {type(x).__name__}, not a tensor "
                               f"(bind non-tensor arguments with functools.partial)")
    named = _dynamic_axes(params, example_inputs, dynamic)
    auto = dynamic == "all" if auto is None else auto
    try:
        ep, comparisons = _export(fn, params, example_inputs, named, auto)
    except UnsupportedOpError:
        raise
    except CaptureError as err:
        # A dynamic axis of extent 1 is traced at 2 (torch specialises 1), which fails
        # where that 1 broadcasts (a bias row y[1, n] beside x[m, n]): under auto such an
        # axis is captured static, as torch keeps it. Failing that too, the first error stands.
        shapes = dict(zip(params, (x.shape for x in example_inputs)))
        ones = {p: {a: sym for a, sym in axes.items() if shapes[p][a] != 1} for p, axes in named.items()}
        if not auto or ones == named:
            raise
        try:
            ep, comparisons = _export(fn, params, example_inputs, ones, auto)
        except CaptureError:
            raise err from err.__cause__  # torch's own error, as the first trace met it
        named = ones
    graph_name = name or getattr(fn, "__name__", None) or type(fn).__name__
    # Axes an op needs equal that torch traced as symbols of their own (SDPA's k and v
    # lengths under dynamic="all", or named apart): one is read as the other
    # (frontends/unify.py) and the graph translated again; the binding checks each
    # input's dims against the reading, so a call where they differ runs eagerly.
    reads: dict = {}
    while True:
        try:
            return _translate(ep, comparisons, params, named, auto, graph_name, reads, outside, traced_sizes)
        except Unify as err:
            # an input's axis, or a symbol an earlier reading made (x_2 read as 2·x_2_by2)
            ours = {s for axes in named.values() for s in axes.values()}
            if err.symbol in reads or not (err.symbol in ours or any(D.symbol(err.symbol) in e.free_symbols
                                                                     for e in reads.values())):
                raise
            reads[err.symbol] = err.expr


def param_names(fn, count: int) -> list[str]:
    """Names for the first `count` positional arguments of fn (a module: its forward):
    the parameters' names, `a_0, a_1, ...` for the entries of `*a`, `x<i>` past them."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return [f"x{i}" for i in range(count)]
    names, rest = [], None
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            rest = p.name
    start = len(names)
    names += [f"{rest}_{i - start}" if rest else f"x{i}" for i in range(start, count)]
    return names[:count]


def _check_arity(fn, count: int) -> None:
    """A call of fn with `count` positional examples binds its signature (torch.export's
    own error is about its dynamic-shapes structure)."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*range(count))
    except TypeError as err:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise CaptureError(f"capture: {name}{sig} cannot take {count} example input(s) ({err}); give an "
                           f"example tensor for each argument") from None


def _dynamic_axes(params, inputs, dynamic) -> dict[str, dict[int, str]]:
    """{param: {axis: symbol name}}, validated against the example inputs."""
    if dynamic is None:
        return {}
    if dynamic == "all":
        return {p: {a: axis_symbol(p, a, params) for a in range(x.dim())} for p, x in zip(params, inputs)}
    if not isinstance(dynamic, dict):
        raise CaptureError(f"capture: dynamic must be None, 'all' or {{input: {{axis: name}}}}, not {dynamic!r}")
    shapes = dict(zip(params, (x.shape for x in inputs)))
    out = {}
    sized: dict[str, tuple[str, int, int]] = {}  # symbol -> the first (input, axis, size) it names
    for pname, axes in dynamic.items():
        if pname not in shapes:
            raise CaptureError(f"capture: dynamic names input {pname!r}, but the function takes {', '.join(params)}")
        if not isinstance(axes, dict):
            raise CaptureError(f"capture: dynamic[{pname!r}] must be a dict {{axis: symbol}}, not {axes!r}")
        out[pname] = {}
        for axis, sym in axes.items():
            if not isinstance(axis, int) or isinstance(axis, bool):
                raise CaptureError(f"capture: dynamic[{pname!r}]: axis {axis!r} is not an int")
            rank = len(shapes[pname])
            if not -rank <= axis < rank:
                raise CaptureError(f"capture: input {pname!r} has rank {rank}; dynamic axis {axis} is out of range")
            if not (isinstance(sym, str) and sym.isidentifier()):
                raise CaptureError(f"capture: input {pname!r} axis {axis}: symbol {sym!r} is not an identifier")
            why = symbol_clash(sym, set(params))
            if why:
                raise CaptureError(f"capture: input {pname!r} axis {axis}: symbol {sym!r} is {why}; choose another "
                                   f"name")
            out[pname][axis % rank] = sym
            size = shapes[pname][axis]
            first, first_axis, first_size = sized.setdefault(sym, (pname, axis % rank, size))
            if first_size != size:  # the graph would not bind its own example inputs
                raise CaptureError(f"capture: symbol {sym!r} names input {first!r} axis {first_axis} "
                                   f"(size {first_size}) and input {pname!r} axis {axis % rank} (size {size}); one "
                                   f"symbol is one size, so give these axes different symbols")
    return out


def axis_symbol(param: str, axis: int, params) -> str:
    """The symbol dynamic="all" names an axis by: `x_0`, or where that is a name the
    kernels use or an argument's (an argument `s`: `s_0` reads as a split count),
    `dim_s_0`, prefixed until it is none."""
    symbol = f"{param}_{axis}"
    while symbol_clash(symbol, set(params)):
        symbol = f"dim_{symbol}"
    return symbol


def symbol_clash(symbol: str, arguments: set[str]) -> str | None:
    """Why a dynamic symbol (an identifier) cannot name a kernel parameter, or None: the
    generated kernels would not parse (`if`), or would read another value (`pid`)."""
    return kernel_name_clash(symbol) or ("also an argument's name (the kernels name both alike)"
                                         if symbol in arguments else None)


class _Wrap(torch.nn.Module):
    def __init__(self, fn, grads: dict):
        super().__init__()
        self.fn = _as_forward(fn)
        # what the trace saw of autograd, in the caller's dict (export puts back a copy of
        # the module's attributes after tracing): "flipped", an input made to require
        # grad (x.requires_grad_()); "out", an output requiring grad where no input does
        self.grads = grads

    def forward(self, *args):
        leaves = [a for a in torch.utils._pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]
        before = [a.requires_grad for a in leaves]
        out = self.fn(*args)
        self.grads["flipped"] = any(a.requires_grad and not b for a, b in zip(leaves, before))
        self.grads["out"] = not any(before) and any(isinstance(o, torch.Tensor) and o.requires_grad
                                                    for o in torch.utils._pytree.tree_leaves(out))
        return out


def _refuse_autograd_state(grads: dict, ep, fn) -> None:
    """Tensors the function makes require grad (`x.requires_grad_()`, a factory's
    `requires_grad=True`) carry autograd state the exported graph drops: its kernels'
    results would come back without it. An output requiring grad because a parameter,
    buffer or constant does is the launcher's to run eagerly (it checks them per call)."""
    state = list(ep.state_dict.values()) + list(ep.constants.values())
    if grads.get("flipped") or (grads.get("out") and not any(getattr(t, "requires_grad", False) for t in state)):
        raise CaptureError(f"capture: {getattr(fn, '__name__', fn)!s} returns tensors that require grad where "
                           f"no argument does: it makes them (requires_grad_(), a factory's requires_grad=True) "
                           f"or reads parameters that require grad through a global, a closure or a bound "
                           f"method, and a capture would drop their autograd state")


def _as_forward(fn):
    """A copy of a plain function whose code is named `forward`: torch.export records
    stack frames of functions named forward only, and errors should point at the
    user's line, not at this wrapper."""
    if isinstance(fn, types.MethodType):  # model.forward: the renamed function, bound again
        return types.MethodType(_as_forward(fn.__func__), fn.__self__)
    code = getattr(fn, "__code__", None)
    if isinstance(fn, torch.nn.Module) or not isinstance(code, types.CodeType):
        return fn
    renamed = types.FunctionType(code.replace(co_name="forward"), fn.__globals__, fn.__name__,
                                 fn.__defaults__, fn.__closure__)
    renamed.__kwdefaults__ = fn.__kwdefaults__
    return renamed


def _export(fn, params, inputs, named, auto: bool):
    """The exported program, and the comparisons of sizes its trace made
    (size_decisions.recorded_comparisons)."""
    from torch.export import Dim, export

    # DYNAMIC, not Dim(name): torch infers ranges itself (x[:4] needs n >= 4) instead of
    # failing; axes sharing a name get one IR symbol, and binding checks they agree.
    kind = Dim.AUTO if auto else Dim.DYNAMIC
    specs = [{a: kind for a in named.get(pname, {})} or None for pname in params]

    def trace(examples=inputs):
        with _quiet_torch():
            with recorded_comparisons() as comparisons:
                grads = {}
                ep = export(_Wrap(fn, grads), _traceable(params, examples, named), dynamic_shapes=(tuple(specs),))
            _refuse_autograd_state(grads, ep, fn)
            # export keeps in-place ops; functionalized, each becomes a new value (an output).
            # Under autocast its graph leaves the casts implicit (aten.linear of an f32 weight
            # gives bf16); retraced inside the caller's autocast, they become ops of the graph.
            mutates = _mutates(ep)
            if mutates:
                _refuse_narrowing_writes(ep)
            if mutates or torch._C._is_any_autocast_enabled():
                return ep.run_decompositions({}), comparisons
            return ep, comparisons

    try:
        try:
            return trace()
        except torch._dynamo.exc.UserError as err:
            if err.error_type != torch._dynamo.exc.UserErrorType.CONSTRAINT_VIOLATION:
                raise
            # A dynamic axis of extent 0 or 1 in this call (one request: indptr[1:-1] is
            # empty) specialises; traced as if it were any extent, the IR's symbolic axes
            # never broadcast, so the graph holds for every extent the binding accepts.
            from torch.fx.experimental import _config as fx_config
            from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

            with fx_config.patch(backed_size_oblivious=True):
                traced = trace()
            if not any(free_unbacked_symbols(n.meta.get("val")) for n in traced[0].graph.nodes):
                return traced
            # torch 2.11 gives such a size an unbacked symbol no input binds. Traced at
            # wider examples instead (every short dynamic extent shifted by one amount,
            # which keeps relations such as len_indptr = batch_size + 1), the graph is
            # the same; failing that, the specialisation is what to report.
            try:
                return trace(_widened(params, inputs, named))
            except Exception:  # noqa: BLE001 - the first error says what went wrong
                raise err from None
    except CaptureError:  # cleave's own (UnsupportedOpError among them), said already
        raise
    except Exception as err:  # torch raises many types; keep its message, drop its traceback
        text = str(err).strip().splitlines()
        detail = "\n".join(text[:12]) if text else type(err).__name__
        raise CaptureError(f"capture: torch.export could not trace {getattr(fn, '__name__', fn)!s}: {detail}") from err


@contextlib.contextmanager
def _quiet_torch():
    """torch logs each failing meta kernel with its traceback (40+ lines) before export
    raises; the error cleave raises says it in one line. Its own deprecation notices
    (pytree internals) are not the user's concern either; nor the partial graphs export
    prints to stderr for a branch on a tensor's value (the capture fails, and the
    function runs through dynamo), nor the resize its fake tensors make of an `out=`
    argument beside a dynamic input. What a trace that succeeds wrote to stderr is
    written out after it."""
    loggers = [logging.getLogger(name) for name in ("torch._subclasses.fake_tensor",
                                                     "torch.fx.experimental.symbolic_shapes")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.CRITICAL)
    written = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(written):
            warnings.simplefilter("ignore", FutureWarning)
            # an out= argument the trace holds static beside a dynamic input: a fake resize
            warnings.filterwarnings("ignore", message="An output with one or more elements was resized")
            yield
        sys.stderr.write(written.getvalue())
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def _mutates(ep) -> bool:
    return any(n.op == "call_function" and getattr(getattr(n.target, "_schema", None), "is_mutable", False)
               for n in ep.graph.nodes)


def _refuse_narrowing_writes(ep) -> None:
    """The capture fails where an in-place write's result type is one its tensor cannot
    hold (frontends/narrowing.py): the call runs eagerly, raising torch's error."""
    for node in ep.graph.nodes:
        why = aten_refusal(node)
        if why is not None:
            raise CaptureError(f"capture: {node.target} at {source_of(node)}: {why}")


# Dynamic extents below WIDEN_BELOW in the examples are traced WIDEN_BY larger when
# the examples themselves specialise an axis (torch 2.11, `_export`).
WIDEN_BELOW, WIDEN_BY = 8, 8


def _widened(params, inputs, named) -> tuple:
    """The example inputs with every dynamic extent below WIDEN_BELOW made WIDEN_BY
    larger, per symbol (axes of one name keep one extent); zeros, as export traces
    shapes, not values."""
    extents = {sym: x.shape[a] for pname, x in zip(params, inputs) for a, sym in named.get(pname, {}).items()}
    grow = {sym for sym, n in extents.items() if n < WIDEN_BELOW}
    out = []
    for pname, x in zip(params, inputs):
        axes = {a: sym for a, sym in named.get(pname, {}).items() if sym in grow}
        if axes:
            x = x.new_zeros([n + WIDEN_BY if a in axes else n for a, n in enumerate(x.shape)])
        out.append(x)
    return tuple(out)


def _traceable(params, inputs, named) -> tuple:
    """torch specializes axes of size 0 and 1, so a dynamic axis with such an example
    size is traced at size 2 (zeros: export traces shapes, not values). Inputs that
    share memory with an earlier one are traced as copies: export would merge them into
    one input, and later calls pass distinct tensors."""
    out, seen = [], []
    for pname, x in zip(params, inputs):
        small = [a for a in named.get(pname, {}) if x.shape[a] < 2]
        if small:
            shape = [2 if a in small else n for a, n in enumerate(x.shape)]
            x = x.new_zeros(shape)
        elif any(shares_memory(x, y) for y in seen):
            x = x.clone()
        seen.append(x)
        out.append(x)
    return tuple(out)


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may overlap in memory (views of one storage)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _translate(ep, comparisons, params, named, auto: bool, graph_name: str, reads: dict,
               outside=frozenset(), traced_sizes: bool = False) -> Captured:
    from torch.export.graph_signature import InputKind

    symbols = SymbolMap()
    kinds = {spec.arg.name: spec for spec in ep.graph_signature.input_specs}
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    user = [n for n in placeholders if kinds[n.name].kind == InputKind.USER_INPUT]
    traced = {}  # torch symbol -> the size torch traced it at (the unification chooses by it)
    for pname, node in zip(params, user):  # name torch's symbols before reading any shape
        for axis, size in enumerate(node.meta["val"].shape):
            if axis not in named.get(pname, {}):
                continue
            if isinstance(size, torch.SymInt):
                hint = size.node.hint if traced_sizes and isinstance(size.node.hint, int) else None
                traced[size.node.expr] = hint
                symbols.name(size.node.expr, named[pname][axis], hint)
            elif not auto:
                raise CaptureError(f"capture: input {pname!r} axis {axis} ({named[pname][axis]}) cannot be dynamic: "
                                   f"torch specialized it to {size} (the function's code depends on its value)")
    for torch_symbol, ours in list(symbols.subs.items()):
        if ours.is_Symbol and ours.name in reads:
            symbols.read_as(torch_symbol, resolved(reads, ours.name), traced.get(torch_symbol))
    graph = Graph(graph_name)
    t = Translator(graph, symbols)
    user_names = dict(zip((n.name for n in user), params))
    state, constants = {}, {}
    for node in placeholders:
        val = node.meta["val"]
        spec = kinds[node.name]
        if spec.kind == InputKind.CONSTANT_TENSOR:
            t.set(node, constant_node(t, ep.constants[spec.target], node, constants, set(params), outside))
            continue
        if not isinstance(val, torch.Tensor):  # an object the trace lifted (a torch.Generator the code makes)
            use = next(iter(node.users), None)
            kind = getattr(val, "class_fqn", None) or type(val).__name__
            raise UnsupportedOpError(str(getattr(use, "target", node.name)), source_of(use),
                                     f"it takes a {kind} object the function makes, which a graph cannot carry")
        input_name = user_names.get(node.name)
        if input_name is None:  # a module's parameter or buffer, named by its state_dict key
            key = str(spec.target).removeprefix("fn.")
            input_name = state_input_name(key, set(params) | set(state) | set(constants))
            state[input_name] = key
        shape = tuple(t.size(d) for d in val.shape)
        t.set(node, graph.input(input_name, shape, ir_dtype(val.dtype, f"input {input_name!r}")))
    _no_float_of_a_size(ep)
    _mark_written_back(ep)
    _guarded_ranges(ep, symbols, graph)
    constrain_to_decisions(graph, symbols, comparisons)
    writes, views, orders = {}, [], {}
    for node in ep.graph.nodes:
        if node.op == "call_function" and not aten_map.is_ignored(node) and not _raised_in_trace(node):
            t.translate(node)
        elif node.op == "output":
            writes, orders = _outputs(t, graph, node, ep.graph_signature, user_names)
            views = _view_outputs(node, ep.graph_signature, graph.output_names)
    for fact in symbols.facts:
        graph._constrain(fact)
    reads_storage = any(storage_dependent(n) for n in ep.graph.nodes)
    return Captured(tidied(graph), state, writes, views, constants=constants, reads_storage=reads_storage,
                    output_orders=orders)


def tidied(graph: Graph) -> Graph:
    """A translated graph in the form the search and the scheduler read, as both
    frontends leave it: live nodes only, values of no elements constant, masks as one
    compare, repeated operands regrouped, layouts sunk to the outputs."""
    return sink_layouts(regroup_repeated_operands(simplify_masks(fold_empty_values(rebuild(graph)))))


def _mark_written_back(ep) -> None:
    """Mark the values torch.export returns as an input's or a buffer's new value (an
    in-place write, functionalized): aten_scatter keeps such writes eager."""
    from torch.export.graph_signature import OutputKind

    output = next(n for n in ep.graph.nodes if n.op == "output")
    for raw, spec in zip(output.args[0], ep.graph_signature.output_specs):
        if isinstance(raw, torch.fx.Node) and spec.kind in (OutputKind.USER_INPUT_MUTATION,
                                                            OutputKind.BUFFER_MUTATION):
            raw.meta[WRITTEN_BACK] = True


def _raised_in_trace(node) -> bool:
    """An op that raised while torch.export traced it, the function catching the error
    (`try: x.view(-1, 4) except RuntimeError: ...`): export keeps the call, with no value
    and no user. Nothing reads it; translated, its missing shape was an AttributeError."""
    target = node.target
    returns = target._schema.returns if isinstance(target, torch._ops.OpOverload) else ()
    return bool(returns) and node.meta.get("val") is None and not node.users and \
        all(isinstance(r.type, torch.TensorType) for r in returns)


def _no_float_of_a_size(ep) -> None:
    """A float computed from a dynamic size (`x * math.sqrt(x.shape[0])`) is traced as the
    constant it was at the example, under a guard pinning the size that cleave does not
    read (the graph served every n with sqrt(4)): such a function is not captured whole
    (dynamo's graphs guard it)."""
    pinned = [g for g in getattr(ep, "_guards_code", None) or [] if "sym_float" in g]
    if pinned:
        raise CaptureError(f"capture: the function computes a float from a dynamic size, which torch.export "
                           f"traces as a constant (guard {pinned[0]})")


def _guarded_ranges(ep, symbols, graph) -> None:
    """The ranges torch guarded a dynamic dim to, as constraints every binding is checked
    against (`x[-(n // 2):]` holds its traced form for n >= 2 only; at n = 1 it returned
    nothing). A lower bound of 2 is export's own default, not a guard: the capture traces
    dims of 0 and 1 at 2, and cleave serves them where no comparison the code made on
    sizes comes out otherwise there (size_decisions.constrain_to_decisions)."""
    from ..ir import Constraint

    for sym, bounds in ep.range_constraints.items():
        ours = symbols.subs.get(sym)
        if ours is None:
            continue
        lower, upper = _finite_int(bounds.lower), _finite_int(bounds.upper)
        if lower is not None and lower > 2:
            graph._constrain(Constraint("le", D.dim(lower), ours, "torch's guard on its range"))
        if upper is not None:
            graph._constrain(Constraint("le", ours, D.dim(upper), "torch's guard on its range"))


def _finite_int(bound) -> int | None:
    """A range bound as an int; None for torch's infinities (int_oo)."""
    try:
        return int(bound)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


def _view_outputs(node, signature, names) -> list[str]:
    """The user outputs that eager returns as aliases: those that reach an input through
    ops returning an alias of their first operand only (views, in-place ops, the pieces
    of `chunk`, `split` and `unbind`), a placeholder or an input's new value where an
    in-place op changed it (`x.mul_(2); return x, x.t()`); and those sharing the value
    they alias with another output (`return y, y`, `return z, z.t()`); and views eager
    lays out so that no kernel writes them (`y[:, ::2]`, `y[1:]`, an `expand`)."""
    from torch.export.graph_signature import OutputKind

    written = {raw for raw, spec in zip(node.args[0], signature.output_specs)
               if spec.kind == OutputKind.USER_INPUT_MUTATION}

    def aliased(raw):
        """The value raw aliases (itself if it aliases nothing); None for an input."""
        while isinstance(raw, torch.fx.Node):
            if raw in written or raw.op == "placeholder":
                return None
            if raw.target is operator.getitem:  # one piece of split/unbind/chunk's list
                if not _returns_aliases(raw.args[0]):  # max's values and indices: new tensors
                    return raw
                raw = raw.args[0]
                continue
            if not _returns_aliases(raw) or _converts(raw):
                return raw
            raw = raw.args[0]
        return raw

    user = [(name, raw, aliased(raw)) for name, raw, spec in zip(names, node.args[0], signature.output_specs)
            if spec.kind == OutputKind.USER_OUTPUT]
    bases = [base for _, _, base in user if isinstance(base, torch.fx.Node)]
    return [name for name, raw, base in user if base is None or bases.count(base) > 1
            or isinstance(raw, torch.fx.Node) and not kernels_lay_out(raw.meta.get("val"))]


def _same_shape_written(output, value, placeholder: str, name: str) -> None:
    """An input's new value has its shape, or the capture is refused (dynamo's graphs
    then run it): `out=` of another size, which eager resizes, and `x.t_()` change the
    tensor's metadata, which a copy into it cannot."""
    src = next((n for n in output.graph.nodes if n.op == "placeholder" and n.name == placeholder), None)
    old = getattr(src, "meta", {}).get("val")
    new = getattr(value, "meta", {}).get("val")
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and \
            (old.dim() != new.dim() or any(str(a) != str(b) for a, b in zip(old.shape, new.shape))):
        raise UnsupportedOpError(f"in-place resize of {name}", source_of(value) if isinstance(value, torch.fx.Node)
                                 else None, f"the function gives argument {name!r} the shape {list(new.shape)} in "
                                 f"place (out= of another size, t_, resize_), which a write into it cannot")


def _returns_aliases(node) -> bool:
    """Whether node's result aliases its first operand (a view, an in-place op, the
    pieces of split, unbind and chunk; type_as, whose schema does not say that it
    returns self where nothing converts, as `to`'s does)."""
    if not isinstance(getattr(node, "target", None), torch._ops.OpOverload):
        return False
    returns = node.target._schema.returns
    return bool(returns) and returns[0].alias_info is not None or node.target._schema.name == "aten::type_as"


def _converts(node: torch.fx.Node) -> bool:
    """Whether node is a `.to()` / `.type_as()` that converts (another dtype or device):
    its schema says it may return self, and it does only where nothing changes."""
    if node.target._schema.name not in ("aten::to", "aten::type_as"):
        return False
    val, src = node.meta.get("val"), getattr(node.args[0], "meta", {}).get("val")
    return isinstance(val, torch.Tensor) and isinstance(src, torch.Tensor) and \
        (val.dtype != src.dtype or val.device != src.device)


def state_input_name(key: str, taken: set[str]) -> str:
    """A graph input name for a state_dict key, an identifier and unique: `proj.weight`
    -> `proj_weight`, `0.weight` (an nn.Sequential's) -> `p0_weight`."""
    name = re.sub(r"\W", "_", key)
    if not name[:1].isalpha() and name[:1] != "_" or keyword.iskeyword(name):
        name = "p" + name
    while name in taken:
        name += "_"
    return name


def constant_node(t, value: torch.Tensor, node, constants: dict, taken: set, outside=frozenset()):
    """A one-element tensor made inside the function becomes a const; a larger one, or
    one whose data lives on outside the call (`outside`: a global's or a module's,
    changed in place through `.data` or numpy with no version to tell), an input of
    the graph, named after its node and not after anything in `taken`, that `constants`
    records with its value (Captured.constants)."""
    users = [u for u in node.users if u.op == "call_function"]
    source = source_of(users[0]) if users else None
    dtype = ir_dtype(value.dtype, "tensor constant", source)
    if value.layout != torch.strided or torch._C._functorch.is_functorch_wrapped_tensor(value):
        # a sparse tensor, or one torch.func wraps (a transform's inputs inside the function)
        raise UnsupportedOpError("tensor constant", source, f"a {value.layout} tensor or one wrapped by a torch.func "
                                 "transform: cleave reads a constant's memory as a dense tensor")
    if value.numel() != 1 or value.numel() and value.data_ptr() in outside:
        name = state_input_name(node.name, taken | set(t.graph.inputs) | set(constants))
        constants[name] = (value, source)
        return t.graph.input(name, tuple(value.shape), dtype)
    out = t.graph.add("const", value=value.item(), dtype=dtype, loc=source)
    return t.graph.add("reshape", out, shape=tuple(value.shape), loc=source) if value.dim() else out


def _outputs(t, graph, node, signature, user_names) -> tuple[dict[str, str], dict]:
    """The function's outputs, named out / out0, out1, ..., then the new value of each
    input an in-place op changed, named <input>_inplace. Returns {output: input} for
    those, and the outputs eager lays out in another order than row-major
    (Captured.output_orders)."""
    from torch.export.graph_signature import OutputKind

    values, names, writes, orders = [], [], {}, {}
    specs = signature.output_specs
    user = sum(spec.kind == OutputKind.USER_OUTPUT for spec in specs)
    for k, (raw, spec) in enumerate(zip(node.args[0], specs)):
        v = t.value(raw)
        if spec.kind == OutputKind.USER_OUTPUT:
            if not hasattr(v, "graph"):
                raise UnsupportedOpError("output", source_of(node), f"output {k} is {v!r}, not a tensor")
            names.append(fresh_name("out" if user == 1 else f"out{len(names)}", graph.inputs))
            order = eager_order(raw.meta.get("val")) if isinstance(raw, torch.fx.Node) else None
            if order is not None:
                orders[names[-1]] = order
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            target = user_names[spec.target]
            _same_shape_written(node, raw, spec.target, target)
            names.append(fresh_name(f"{target}_inplace", graph.inputs))
            writes[names[-1]] = target
        else:  # a module's buffer changed in place (batch norm's running stats in training)
            raise UnsupportedOpError(f"in-place update of {spec.target}", source_of(node),
                                     f"the function changes {spec.kind.name.lower().replace('_', ' ')} "
                                     f"{spec.target!r}, which cleave does not write back")
        values.append(v)
    graph.output(*values, names=names)
    return writes, orders
