"""Graph breaks over an aten-level FX graph (dynamo's graph as AOTAutograd lowered
it, see backend.py): maximal runs of nodes cleave can translate (in topological
order) become regions, each captured and compiled as one operator; the nodes it
cannot translate (`frontends.is_supported`) run eagerly between them, with one
warning per op naming it and the user's line. A region whose translation still
fails (a rule that rejects its arguments late) runs eagerly as a whole, so results
stay correct.
"""
from __future__ import annotations

import operator
import re

import torch
import torch.autograd.forward_ad as _forward_ad
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.passes.split_module import split_module

from .. import passes
from ..frontends.aten_layout import storage_dependent
from ..frontends.output_layout import eager_order, permute_outputs
from ..ir import BindingError
from .launch import remember
from .context import Context
from .operator import CompileFailure, NotReadyDuringCapture, f32_matmul_precision

# Why a call under autograd runs eagerly
GRAD_FALLBACK = ("inputs require grad and cleave's kernels have no backward (call it under torch.no_grad(), or "
                 "with requires_grad=False, to compile it)")


# The meta key of an input's name in the user's code (`x`, `self.lin.weight`), which the
# backend puts on AOTAutograd's inputs (`arg0_1`); warnings say it in their place.
LABEL = "cleave_user_name"


def _compute_nodes(gm: torch.fx.GraphModule):
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]




def _unsupported_nodes(gm, needed: set) -> list[torch.fx.Node]:
    """Nodes among `needed` (what the kernels compute, _kernel_made) that cleave cannot
    translate, the tuple projections (getitem) of them, and everything a storage-dependent
    op reads from."""
    from ..frontends import is_supported

    nodes = [n for n in _compute_nodes(gm) if n in needed]
    bad: dict[torch.fx.Node, None] = {}
    for n in nodes:
        projects_bad = n.target is operator.getitem and n.args and n.args[0] in bad
        if projects_bad or not is_supported(n):
            bad[n] = None
    # A cleave region's output is a new contiguous tensor: where eager would hand a
    # storage-dependent op a view or a tensor of other strides, its input is produced eagerly.
    # Its sizes and strides (sym_min(n, m) of a dynamic diagonal) are no storage: the
    # region reads them symbolically.
    stack = [n for n in nodes if storage_dependent(n)]
    while stack:
        for up in stack.pop().all_input_nodes:
            tensor = isinstance(up.meta.get("val"), torch.Tensor)
            if up.op in ("call_function", "call_method", "call_module") and up not in bad and tensor \
                    and not _fresh(up):
                bad[up] = None
                stack.append(up)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return sorted(bad, key=order.__getitem__)


def _fresh(n: torch.fx.Node) -> bool:
    """Whether eager gives n's value as a new contiguous tensor, as a region does: not a
    view, and contiguous (an elementwise op keeps a transposed input's strides)."""
    val = n.meta.get("val")
    view = isinstance(n.target, torch._ops.OpOverload) and n.target.is_view
    return isinstance(val, torch.Tensor) and not view and val.is_contiguous()


def build(gm: torch.fx.GraphModule, ctx: Context, name: str = "region"):
    """A callable running gm: one compiled region, or a split module of regions."""
    from ..frontends.errors import decomposed_from, op_name, source_of

    bad = _unsupported_nodes(gm, _kernel_made(gm))
    if not bad:
        return Region(gm, ctx, name, name)
    from ..frontends.aten_map import unsupported_reason

    for n in bad:  # the producers a storage-dependent op pulled in are not unsupported
        reason = unsupported_reason(n) if n.target is not operator.getitem else None
        if reason is not None:
            origin = decomposed_from(n)  # the user called dropout, not rand_like
            ctx.warn_unsupported(op_name(n) + (f" (of {origin})" if origin else ""), name, source_of(n), reason)
    bad = set(bad)
    ids, current, previous = {}, 0, None
    for n in _compute_nodes(gm):
        ok = n not in bad
        if previous is not None and ok != previous:
            current += 1
        previous, ids[n] = ok, (current, ok)
    kinds = {f"submod_{i}": ok for i, ok in ids.values()}
    # in the program's order: independent regions reordered ran two random ops swapped,
    # and every seeded value differed from eager's
    split = split_module(gm, None, lambda n: ids[n][0] if n in ids else 0, keep_original_order=True)
    for sub_name, ok in kinds.items():
        sub = getattr(split, sub_name, None)
        if sub is None:
            continue
        if ok:
            region = Region(sub, ctx, f"{name}_{sub_name.removeprefix('submod_')}", _part_of(name, sub))
            setattr(split, sub_name, _Callable(region))
        else:
            ctx.eager_regions += 1
    return split


def _part_of(name: str, gm: torch.fx.GraphModule) -> str:
    """How warnings name a region of a split graph: the function's part from its first
    line the region computes."""
    from ..frontends.errors import source_of

    source = next((s for n in _compute_nodes(gm) if (s := source_of(n))), None)
    return f"part of {name}" + (f" (from {source})" if source else "")


def user_names(text: str, labels: dict[str, str]) -> str:
    """text with the graph's input names (`arg0_1`) said as the user's code names them."""
    if not labels:
        return text
    return re.sub(r"\b(" + "|".join(map(re.escape, labels)) + r")\b", lambda m: labels[m.group()], text)


class _Callable(torch.nn.Module):
    """Lets a plain callable sit where split_module expects a submodule."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


# Values the host computes from the call's arguments with the graph's own arithmetic
# (sym_size, operator.mul, ...): sizes and flags, never tensors.
SCALARS = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def _output_values(gm: torch.fx.GraphModule):
    return next(n for n in gm.graph.nodes if n.op == "output").args[0]


def _output_list(gm: torch.fx.GraphModule) -> list:
    out = _output_values(gm)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _is_view(node: torch.fx.Node) -> bool:
    """An aten op whose result aliases its first argument without writing it (a list of
    such results, as split's, included), or one entry of such a list."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return isinstance(node.args[0], torch.fx.Node) and _is_view(node.args[0])
    return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view


def _host_made(node: torch.fx.Node) -> bool:
    """Whether the host makes node's value after the kernels ran, as eager makes it: a
    view, a size, or a constant attribute. A kernel's result is a new contiguous tensor:
    never a view, with none of eager's strides, storage offset or aliasing."""
    return node.op == "get_attr" or _is_view(node) or isinstance(node.meta.get("val"), SCALARS)


def plan_outputs(gm: torch.fx.GraphModule) -> tuple[list, dict]:
    """Split gm's outputs between the kernels and the host. The kernels compute each
    output that is a new tensor once (_kernel_writes), and every tensor the host's nodes
    read (the base of views of an intermediate: `h.view(b, t, 3, 4), h[..., :5]` of a
    Linear's result); the host makes the rest from the call's arguments and those
    tensors: views with eager's strides, storage offset and aliasing, and sizes.
    Returns the kernels' tensors, in order, and the host's nodes."""
    outputs = [v for v in _output_list(gm) if isinstance(v, torch.fx.Node)]
    roots = [_view_root(v) for v in outputs]
    shared = {r for r in roots if roots.count(r) > 1}
    kernel = dict.fromkeys(v for v, root in zip(outputs, roots) if _kernel_writes(v, root, shared))
    host: dict[torch.fx.Node, None] = {}
    stack = [v for v in outputs if v not in kernel]
    while stack:
        node = stack.pop()
        if node in host or node in kernel or node.op == "placeholder":
            continue
        if _host_made(node):
            host[node] = None
            stack.extend(node.all_input_nodes)
        else:
            kernel[node] = None
    return list(kernel), host


def _view_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose value node views, through a chain of views (node itself when it
    is no view)."""
    while _is_view(node):
        node = node.args[0]
    return node


def _kernel_writes(output: torch.fx.Node, root: torch.fx.Node, shared: set) -> bool:
    """Whether a kernel can write this output as eager returns it: a new tensor, or a
    view that nothing else returned aliases (its root is computed, returned by no other
    output) and that eager lays out contiguous from offset 0 (the reshape of a bmm's
    result into heads, which the kernels then compute in its own layout)."""
    if output.op == "placeholder":
        return False
    if not _is_view(output):
        return not _host_made(output)
    computed = root.op != "placeholder" and not _host_made(root)
    return computed and root not in shared and _row_major(output.meta.get("val"))


def _kernel_made(gm: torch.fx.GraphModule) -> set:
    """The nodes the kernels compute: all but those only the host's outputs need (an
    as_strided that is returned is never translated)."""
    kernel, host = plan_outputs(gm)
    needed, stack = set(), list(kernel)
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    return {n for n in gm.graph.nodes if n not in host or n in needed}


def _returning(gm: torch.fx.GraphModule, nodes: list) -> torch.fx.GraphModule:
    """gm returning `nodes` (as a tuple), what they do not need removed."""
    graph = torch.fx.Graph()
    env = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            graph.output(tuple(env[v] for v in nodes))
        else:
            env[n] = graph.node_copy(n, env.__getitem__)
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(gm, graph)


def host_outputs(gm: torch.fx.GraphModule, kernel: list, host: dict):
    """A function of the region's arguments, then the kernels' tensors, returning the
    region's outputs: the kernels' tensors as they are, the host's nodes made again by
    eager ops from this call's values (fx's generated code: plain Python, no
    interpreter). Sizes are evaluated so, from the call's arguments, never read off the
    operator's symbols (it binds only those its tensors carry)."""
    graph = torch.fx.Graph()
    env = {n: graph.node_copy(n) for n in gm.graph.nodes if n.op == "placeholder"}
    env.update({n: graph.placeholder(f"kernel_{k}") for k, n in enumerate(kernel)})
    for n in gm.graph.nodes:
        if n in host:
            env[n] = graph.node_copy(n, env.__getitem__)
    out = torch.fx.node.map_arg(_output_values(gm), env.__getitem__)
    graph.output(tuple(out) if isinstance(out, (tuple, list)) else out)
    return torch.fx.GraphModule(gm, graph).forward


def _unlike_eager(kernel: list, host: dict) -> str | None:
    """Why a host-made output would not be eager's, or None: it reads a tensor that eager
    lays out otherwise than the kernels give it (row-major from offset 0, or dense in
    another order: output_layout), so a view of it has other strides."""
    from ..frontends.errors import op_name, source_of

    kernel = set(kernel)
    for node in host:
        for base in node.all_input_nodes:
            val = base.meta.get("val")
            if base in kernel and not _row_major(val) and eager_order(val) is None:
                layout = f"strides {tuple(val.stride())}, offset {val.storage_offset()}" \
                    if isinstance(val, torch.Tensor) else "a layout it does not record"
                at = f" (at {source_of(node)})" if source_of(node) else ""
                return (f"{op_name(node)}{at} reads the result of {op_name(base)}, which eager lays out with "
                        f"{layout}, where the kernels write it densely from offset 0")
    return None


def _row_major(val) -> bool:
    """Whether eager lays val out as a kernel writes its output, known without a guard.
    An empty tensor has no layout to keep (eager's amax of (n, 1, 0) has strides (1, 0, 1))."""
    if not isinstance(val, torch.Tensor):
        return False
    if statically_known_true(val.numel() == 0):
        return True
    strides, step = [], 1
    for size in reversed(val.shape):
        strides.append(step)
        step = step * torch.sym_max(size, 1)
    same = [a == b for a, b in zip(val.stride(), reversed(strides))]
    return all(statically_known_true(s) for s in [*same, val.storage_offset() == 0])


class Region:
    """A supported run of aten nodes, captured and compiled on its first call per
    static signature (the non-dynamic dims, dtypes, and the static ints it reads).
    Every symbolic dim of the graph is a dynamic axis of the operator: torch made
    static whatever it specialised (a module's parameters among them). The operator
    computes the outputs that are new tensors; the views and sizes among them are made
    on the host after it (plan_outputs)."""

    def __init__(self, gm: torch.fx.GraphModule, ctx: Context, name: str, where: str):
        self.gm, self.ctx, self.name, self.where = gm, ctx, name, where  # its operator's name; the warnings'
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.labels = {p.name: p.meta[LABEL] for p in self.placeholders if LABEL in p.meta}
        self.tuple_output = isinstance(_output_values(gm), (tuple, list))
        self.kernel, host = plan_outputs(gm)
        self.host = None if self.kernel == _output_list(gm) else host_outputs(gm, self.kernel, host)
        self.unlike_eager = _unlike_eager(self.kernel, host)
        self.dynamic = {p.name: _dynamic_axes(p) for p in self.placeholders}
        self.runners: dict[tuple, object] = {}
        self.seen: dict[tuple, object] = {}  # exact arguments -> runner: skips the signature

    def signature(self, args) -> tuple:
        sig = []
        for p, a in zip(self.placeholders, args):
            if isinstance(a, torch.Tensor):
                dyn = self.dynamic.get(p.name, {})
                sig.append((a.dtype, a.device.type, tuple(-1 if i in dyn else s for i, s in enumerate(a.shape))))
            else:  # a size that varies (a SymInt when traced) is not a specialization
                sig.append(None if isinstance(p.meta.get("val"), torch.SymInt) else a)
        return tuple(sig)

    def __call__(self, *args):
        exact = exact_key(args)
        runner = self.seen.get(exact)
        if runner is not None:
            return runner(*args)
        sig = self.signature(args)
        runner = self.runners.get(sig)
        if runner is None:
            runner = self.runners[sig] = self._build(args)
        result = runner(*args)
        remember_fast(self.seen, exact, runner, args)
        return result

    def _build(self, args):
        from ..frontends.errors import CaptureError
        from ..frontends.fx_graph import translate_graph_module

        if self.unlike_eager is not None:
            self.ctx.warn_eager(self.where, self.unlike_eager)
            self.ctx.eager_regions += 1
            return self.gm
        if not self.kernel:  # views and sizes alone: eager makes them, at no cost
            return self.gm
        kernel_gm = self.gm if self.host is None else _returning(self.gm, self.kernel)
        try:
            with passes.recording(self.ctx.pass_seconds), passes.timed("translate"):
                captured = translate_graph_module(kernel_gm, self.name)
        except CaptureError as err:
            self.ctx.warn_unsupported(f"capture of {self.where} ({user_names(str(err), self.labels)})", self.where)
            self.ctx.eager_regions += 1
            return self.gm
        graph = captured.graph
        if not set(graph.inputs) - set(captured.constants):  # values from constants alone (an arange
            return self.gm  # between two breaks): no tensor names the device, and there is nothing to fuse
        symbols = {s.name for s in graph.symbols()}
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        unpermute = permute_outputs(graph, captured.output_orders)
        op = self.ctx.operator(graph, symbols, device)  # search and schedule run lazily, on its first call
        return Launcher(op, self.ctx, [p.name for p in self.placeholders], self.tuple_output, self.gm, self.where,
                        state=constant_getters(captured.constants, device), host=self.host,
                        size_inputs=size_carriers(captured.size_inputs, device), unpermute=unpermute,
                        labels=self.labels)


def size_carriers(size_inputs: list[tuple[str, str, str]], device) -> dict:
    """graph input -> (the int argument it carries, its kind, one element on the
    device), expanded (a view, no allocation) at each call to a length the int gives
    (Captured.size_inputs): n itself ("len"), or for an int that may be negative, read
    as p - q, max(n, 0) + 1 ("pos") and max(-n, 0) + 1 ("neg")."""
    return {name: (arg, kind, torch.empty(1, dtype=torch.bool, device=device))
            for name, arg, kind in size_inputs}


_INT64_MAX = 2 ** 63 - 1


def _carried_length(n: int, kind: str) -> int:
    return n if kind == "len" else max(n if kind == "pos" else -n, 0) + 1


def constant_getters(constants: dict, device) -> dict:
    """graph input -> a function returning the tensor constant it stands for
    (Captured.constants), on the operator's device: the code's `.to(x.device)` of it is
    a copy the graph does not hold."""
    on_device = {name: value.to(device) for name, (value, _) in constants.items()}
    return {name: (lambda value=value: value) for name, value in on_device.items()}


class Launcher:
    """Feeds arguments to an operator by input name and shapes the result like the
    code it replaces: a module's parameters and buffers are read off it at each call
    (`state`), and outputs that are an input's new value (an in-place op in the code,
    `writes`: output -> input) are copied into that input. If cleave cannot build the
    operator (CompileFailure: the search, the scheduler or the kernels' first launch
    failed), it warns once, saying why, and runs that code eagerly from then on. The
    code also runs eagerly, with one warning, when autograd would need a backward
    through the kernels (they have none), and when inputs it writes share memory."""

    def __init__(self, op, ctx: Context, names, tuple_output: bool, eager, where: str,
                 state: dict | None = None, writes: dict[str, str] | None = None, host=None,
                 size_inputs: dict | None = None, reads_storage: bool = False, unpermute: dict | None = None,
                 labels: dict[str, str] | None = None):
        self.op, self.ctx, self.names, self.tuple_output = op, ctx, list(names), tuple_output
        self.labels = labels or {}  # an input's name -> the user's, for warnings (user_names)
        self.unpermute = unpermute or {}  # output index -> the permutation giving eager's layout (permute_outputs)
        self.eager_fn, self.where, self.failed = eager, where, False
        self.host = host  # (*args, *results) -> the outputs, views and sizes made (host_outputs)
        self.state = state or {}
        self.size_inputs = size_inputs or {}  # graph input -> (int argument, kind, one element): size_carriers
        self.reads_storage = reads_storage  # Captured.reads_storage: other layouts than the traced run eagerly
        self.graph_inputs = [k for k in op.graph.inputs if k not in self.state and k not in self.size_inputs]
        self.by_name = set(self.graph_inputs) | {arg for arg, _, _ in self.size_inputs.values()} <= set(self.names)
        self.positions = [self.names.index(k) for k in self.graph_inputs] if self.by_name else None
        self.size_positions = {name: self.names.index(arg) for name, (arg, _, _) in self.size_inputs.items()} \
            if self.by_name else {}
        writes = writes or {}
        outputs = op.graph.output_names
        self.results = [i for i, name in enumerate(outputs) if name not in writes]
        self.writebacks = [(i, self.names.index(writes[name])) for i, name in enumerate(outputs) if name in writes]

    def __call__(self, *args):
        if self.failed or on_meta(args):  # meta tensors carry shapes only: eager infers them
            return self.eager_fn(*args)
        wide = self._uncarried(args)
        if wide:
            self.ctx.warn_eager(self.where, f"its integer argument {wide} is too large to pass as a size "
                                            f"(at most 2**63 - 2 in magnitude)")
            return self.eager_fn(*args)
        inputs = self.inputs(args)
        if self._runs_eagerly(args, inputs):
            return self.eager_fn(*args)
        if self.op.f32_matmul != f32_matmul_precision():  # set since: that precision's own operator
            self.op = self.ctx.operator(self.op.graph, self.op.dynamic, self.op.device)
        outs = None
        try:
            outs = self.ctx.run(self.op, inputs, self.labels)
        except CompileFailure as err:
            self.ctx.warn_failed(self.op.graph.name, self.where, str(err))
            self.failed = True
        except NotReadyDuringCapture as err:
            self.ctx.warn_capture(self.where, str(err))
        except BindingError as err:  # dims the graph reads as one symbol differ here (fx_graph):
            self.ctx.warn_eager(self.where, f"its inputs do not fit the compiled graph "
                                            f"({user_names(str(err), self.labels)})")
        if outs is None:  # PyTorch computes it, or says what is wrong: outside the except, its error unchained
            return self.eager_fn(*args)
        return self._finish(args, outs)

    def fits(self, args) -> bool:
        """Whether this call's shapes bind the captured graph and meet its constraints:
        the branch the code took on a dynamic size where it traced (`if x.shape[0] > 4`)
        is the one it takes here."""
        try:
            self.op.graph.bind({k: tuple(v.shape) for k, v in self.inputs(args).items()})
        except BindingError:
            return False
        return True

    def _uncarried(self, args) -> str | None:
        """The user's name of an int argument whose carried length (`_carried_length`)
        int64 cannot hold: `x + k` at k = 2**63 - 1 raised an overflow from torch's expand."""
        for name, (arg, kind, _) in self.size_inputs.items():
            if _carried_length(int(args[self.size_positions[name]]), kind) > _INT64_MAX:
                return self.labels.get(arg, arg)
        return None

    def inputs(self, args) -> dict[str, torch.Tensor]:
        if self.by_name:
            out = {k: args[i] for k, i in zip(self.graph_inputs, self.positions)}
        else:
            out = dict(zip(self.graph_inputs, [a for a in args if isinstance(a, torch.Tensor)]))
        for name, get in self.state.items():
            out[name] = get()
        for name, (_, kind, one) in self.size_inputs.items():
            out[name] = one.expand(_carried_length(int(args[self.size_positions[name]]), kind))
        return out

    def _finish(self, args, outs):
        for i, position in self.writebacks:
            args[position].copy_(outs[i])
        results = [outs[i].permute(self.unpermute[i]) if i in self.unpermute else outs[i] for i in self.results]
        if self.host is not None:
            return self.host(*args, *results)
        return tuple(results) if self.tuple_output else results[0]

    def _runs_eagerly(self, args, inputs) -> bool:
        why = untraceable_call(inputs.values())
        if why is not None:
            self.ctx.warn_eager(self.where, why)
            return True
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs.values()):
            self.ctx.warn_eager(self.where, GRAD_FALLBACK)
            return True
        if self.writebacks and overlapping(list(inputs.values())):  # a parameter or constant too
            self.ctx.warn_eager(self.where, "it changes an input in place and its inputs share memory")
            return True
        if any(self_overlapping(args[position]) for _, position in self.writebacks):
            # eager writes a shared element once per index reaching it (or refuses an
            # expanded one); the kernels' result is copied back once per element
            self.ctx.warn_eager(self.where, "it changes an input in place whose elements share memory (an "
                                            "expanded or self-overlapping view)")
            return True
        if self.reads_storage and not all(_row_major_from_start(a) for a in args if isinstance(a, torch.Tensor)):
            self.ctx.warn_eager(self.where, "it reads its input's storage (as_strided), traced contiguous from "
                                "offset 0, and an input here is laid out otherwise")
            return True
        return False

    def hot(self, args):
        """A callable for later calls whose arguments match these exactly (shapes, dtypes,
        devices), once they have run: the operator's prepared launch, without this
        launcher's, the context's and the operator's per-call lookups (a decode step's
        kernels take less time than the host spends launching them). The launcher
        itself once it runs eagerly for good; None while these arguments have not run
        compiled yet (first met during a CUDA graph capture)."""
        if self.failed or self.writebacks or self.reads_storage or self._uncarried(args):
            return self  # their checks run at every call
        launch = self.op.ready(self.inputs(args))
        if launch is None:
            return None
        stats, ctx, precision = self.op.stats, self.ctx, self.op.f32_matmul

        def launch_hot(*args):
            inputs = self.inputs(args)
            # explain records each launch, autograd needs the eager path, and another f32
            # MatMul precision another operator: the full path does
            if ctx.log is not None or (torch.is_grad_enabled() and any(t.requires_grad for t in inputs.values())) \
                    or f32_matmul_precision() != precision or untraceable_call(inputs.values()) is not None:
                return self(*args)
            stats["calls"] += 1
            return self._finish(args, launch(inputs))

        return launch_hot


def untraceable_call(values) -> str | None:
    """Why a call must run eagerly whatever its shapes: under a torch.func transform
    (vmap, grad, jvp), whose wrapped tensors have no storage a kernel can read, or with
    an argument carrying a forward-mode AD tangent, which the kernels would drop."""
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return "it is called under a torch.func transform (vmap, grad, jvp), whose tensors cleave's kernels cannot read"
    if _forward_ad._current_level >= 0 and any(isinstance(v, torch.Tensor) and _forward_ad.unpack_dual(v).tangent
                                               is not None for v in values):
        return "an argument carries a forward-mode AD tangent, and cleave's kernels have no forward derivative"
    return None


def _row_major_from_start(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.storage_offset() == 0


def on_meta(values) -> bool:
    """Whether a tensor among `values` is on the meta device or a fake tensor (shape
    inference: no data to launch kernels on; the candidate check ran on fake tensors and
    the call warned it could not compile)."""
    return any(isinstance(v, torch.Tensor) and (v.is_meta or isinstance(v, FakeTensor)) for v in values)


def overlapping(args) -> bool:
    from ..frontends.capture import shares_memory

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return any(shares_memory(a, b) for i, a in enumerate(tensors) for b in tensors[i + 1:])


def self_overlapping(t: torch.Tensor) -> bool:
    """Whether two indices of t reach one element (an expand, as_strided rows that
    overlap): torch's own check, and where that cannot tell (any strided view), whether
    some stride, smallest first, fails to step past every element the smaller ones reach."""
    verdict = torch._debug_has_internal_overlap(t)  # 0: no, 1: yes, 2: too hard for torch
    if verdict != 2:
        return verdict == 1
    reach = 0
    for stride, size in sorted((abs(st), n) for st, n in zip(t.stride(), t.shape) if n > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def exact_key(args) -> tuple:
    """What a region's prepared launch depends on: each tensor's shape, dtype and device,
    and every other argument's value (dynamo guards the rest: strides, global state)."""
    return tuple((a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)


def remember_fast(memo: dict, key: tuple, runner, args) -> None:
    """Keep for calls with exactly these arguments the runner's fastest form: a
    Launcher's hot path once they have run compiled, any other runner as it is."""
    fast = runner.hot(args) if isinstance(runner, Launcher) else runner
    if fast is not None:
        remember(memo, key, fast)


def _dynamic_axes(placeholder: torch.fx.Node) -> dict[int, str]:
    """Axes dynamo made symbolic (mark_dynamic, or automatic dynamic), named after their SymInt."""
    value = placeholder.meta.get("example_value", placeholder.meta.get("val"))
    if not isinstance(value, torch.Tensor):
        return {}
    out = {}
    for i, d in enumerate(value.shape):
        if isinstance(d, torch.SymInt) and not d.node.is_nested_int():
            expr = str(d)
            out[i] = expr if expr.isidentifier() else "d_" + "".join(c if c.isalnum() else "_" for c in expr)
    return out
