"""The torch.compile backend: `torch.compile(model, backend="cleave")`.

Registered through the `torch_dynamo_backends` entry point in pyproject.toml.
Dynamo hands over an FX graph per frame. AOTAutograd lowers it, as backends built
on it do, with PyTorch's decompositions (frontends/decompositions.py) into a
functional aten graph: parameters and buffers are its inputs, static; the dims
dynamo made symbolic (mark_dynamic, automatic dynamic, dynamic=True) are its only
symbols. Supported runs of that graph become cleave operators, unsupported nodes
run eagerly (graph_breaks.py). Under autograd the forward graph is compiled this way
and the backward graph runs eagerly, so gradients are PyTorch's own.

All graphs of a process share one Context, so a dynamo recompile of the same graph
reuses its operator: `context()` gives it, `reset()` starts a fresh one.
"""
from __future__ import annotations

import itertools
import os
import re
import warnings

import torch

from .. import passes
from .context import Context
from .user_frame import _user_level
from .graph_breaks import LABEL, build

_CONTEXT = Context()
_FRAMES = itertools.count()


def context() -> Context:
    return _CONTEXT


def reset() -> Context:
    global _CONTEXT
    _CONTEXT = Context()
    return _CONTEXT


def partitioning_backend(ctx: Context, name: str | None = None):
    """A torch.compile backend compiling into `ctx`; regions are named after `name`
    (the compiled function) or numbered per frame."""
    def backend(gm, example_inputs):
        from torch._dynamo.exc import TorchDynamoException
        from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

        from ..frontends.decompositions import table, wrongly_decomposed
        from ..frontends.narrowing import dynamo_refusal

        region = name or _compiled_function_name(gm) or f"frame{next(_FRAMES)}"
        arguments = _argument_names(gm)
        refused = next(((n, why) for n in gm.graph.nodes if (why := dynamo_refusal(n)) is not None), None)
        if refused is not None:  # functionalized, the write would hold the truncated value: eager raises
            ctx.warn_eager(region, f"{refused[0].target} writes a type its tensor cannot hold ({refused[1]})")
            ctx.eager_regions += 1
            return gm.forward
        wrong = next((why for n in gm.graph.nodes if (why := wrongly_decomposed(n)) is not None), None)
        if wrong is not None:
            ctx.warn_eager(region, wrong)
            ctx.eager_regions += 1
            return gm.forward

        def forward(graph, inputs):
            _label_inputs(graph, arguments)
            _mark_written_back(graph)
            return make_boxed_func(build(graph, ctx, region))

        # Compiled lazily, when a backward runs: where that is inside fn's frame (a
        # `loss.backward()` past a graph break), dynamo would trace this and call its
        # skipped helpers graph breaks in fn.
        @torch._dynamo.disable
        def backward(graph, inputs):
            return make_boxed_func(graph)

        try:
            with passes.recording(ctx.pass_seconds), passes.timed("decompose"):
                return aot_module_simplified(gm, example_inputs, fw_compiler=forward, bw_compiler=backward,
                                             decompositions=table())
        except TorchDynamoException:  # dynamo's own control flow (restart the analysis, skip the frame)
            raise
        except Exception as err:  # noqa: BLE001 - lowering failed inside torch: run the frame as traced
            first = (str(err).strip().splitlines() or [""])[0][:200]
            why = f"lowering it through AOTAutograd failed ({type(err).__name__}: {first})"
            if type(err).__name__ == "DataDependentOutputException":
                why = _value_as_index(gm) or why
            ctx.warn_eager(region, why)
            ctx.eager_regions += 1
            return gm.forward
    return backend


def _compiled_function_name(gm) -> str | None:
    """The qualified name of the function whose frame dynamo compiles (`Model.forward`), for
    the warnings: the code after a graph break (`torch_dynamo_resume_in_forward_at_12`) is
    the function's too. A torch module compiled itself (`torch.compile(nn.Linear(..))`)
    runs in a wrapper of dynamo's (`wrap_inline.<locals>.inner`): it is named after the
    module's class. None where dynamo does not say (the regions are numbered then)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        code = InstructionTranslator.current_tx().f_code
    except Exception:  # noqa: BLE001 - dynamo's internals differ between versions
        return None
    if os.path.sep + os.path.join("torch", "_dynamo") + os.path.sep in code.co_filename:
        stacks = (n.meta.get("nn_module_stack") for n in gm.graph.nodes)
        outer = next((next(iter(stack.values())) for stack in stacks if stack), None)
        kind = outer[1] if outer else None
        return f"{kind.__qualname__}.forward" if isinstance(kind, type) else None
    return re.sub(r"torch_dynamo_resume_in_(\w+?)_at_\d+", r"\1", getattr(code, "co_qualname", code.co_name))


def _argument_names(gm) -> list[str | None]:
    """What the user calls each input of dynamo's graph, in order (`x`, `self.lin.weight`,
    `x.size()[0]`), from the source dynamo records; None where it records none."""
    names = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = getattr(source, "name", None)
        name = name() if callable(name) else name  # a method in older torch, a property now
        names.append(_user_name(name) if isinstance(name, str) else None)
    return names


def _user_name(source: str) -> str:
    """dynamo's source `L['self']._modules['lin']._parameters['weight']` as the code spells
    it: `self.lin.weight`."""
    name = re.sub(r"^[LG]\['([^']+)'\]", r"\1", source)
    return re.sub(r"\._(?:modules|parameters|buffers)\['([^']+)'\]", r".\1", name)


def _label_inputs(graph, arguments: list[str | None]) -> None:
    """Mark each input of AOTAutograd's graph (`arg0_1`, `primals_1`) with the user's name
    for it (graph_breaks.LABEL), where the inputs are dynamo's one for one (AOTAutograd
    takes a tensor passed twice once: then none is marked). split_module copies the marks
    onto the regions' inputs."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(arguments):
        return
    for node, name in zip(placeholders, arguments):
        if name is not None:
            node.meta[LABEL] = name


def _mark_written_back(graph) -> None:
    """Mark the outputs of AOTAutograd's forward that are inputs' new values (an in-place
    write it functionalized, copied back by its wrapper): aten_scatter keeps such writes
    eager, as capture does for torch.export's."""
    from ..frontends.aten_scatter import WRITTEN_BACK

    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None:
        return
    first = len(meta.tokens)
    outputs = graph.graph.find_nodes(op="output")[0].args[0]
    for raw in outputs[first:first + meta.num_mutated_inp_runtime_indices]:
        if isinstance(raw, torch.fx.Node):
            raw.meta[WRITTEN_BACK] = True


def _value_as_index(gm) -> str | None:
    """Where dynamo's graph indexes with a one-element integer tensor (`cache[:, pos] = k`,
    pos a 0-d tensor): the index is the tensor's value, which AOTAutograd cannot trace
    (aten._local_scalar_dense); None where no such index is found."""
    import operator

    from ..frontends.errors import source_of

    def scalar_tensor(arg) -> bool:
        val = arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else None
        return isinstance(val, torch.Tensor) and val.numel() == 1 and not val.is_floating_point() \
            and val.dtype != torch.bool

    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in (operator.getitem, operator.setitem) and len(n.args) > 1:
            index = n.args[1] if isinstance(n.args[1], tuple) else (n.args[1],)
            if any(scalar_tensor(i) for i in index):
                at = f" at {source_of(n)}" if source_of(n) else ""
                return (f"it indexes with a one-element tensor's value{at} (aten._local_scalar_dense), which a "
                        f"traced graph cannot hold; a Python int index compiles")
    return None


def cleave_backend(gm, example_inputs, mode=None, options=None):
    """`torch.compile(..., backend="cleave")`. torch.compile's `mode` and `options` are
    inductor's knobs: none applies to cleave (it has no modes, and every graph of the
    process shares one context), so each one given is said once and ignored."""
    if mode is not None:
        _ignore_once(f"mode={mode!r}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"torch.compile's options must be a dict, not {type(options).__name__} {options!r:.40}")
    for key in options or {}:
        _ignore_once(f"option {key!r}")
    return partitioning_backend(_CONTEXT)(gm, example_inputs)


_IGNORED: set[str] = set()


def _ignore_once(what: str) -> None:
    if what not in _IGNORED:
        _IGNORED.add(what)
        # at the user's call, not torch's wrapper (stacklevel 3 named torch/__init__.py)
        warnings.warn(f"cleave: torch.compile {what} does not apply to the cleave backend; ignored",
                      stacklevel=_user_level())
