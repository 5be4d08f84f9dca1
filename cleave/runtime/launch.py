"""Run a Plan: bind symbols from the tensors, find memory for outputs and
intermediates, load each kernel's module once per plan, launch. Imports torch and
triton only (plus the IR's binder), never egglog, z3, cleave.search or cleave.verify.

Memory kept between calls. An allocation costs the host about 8 us (H200, measured),
a decode step's kernels 5-150 us, so the hot path allocates nothing once warm:
- intermediates share one workspace per lane (`_workspace`);
- an output is written into memory an earlier call of the same shape returned, once
  nothing outside cleave can reach it any more (`_Kept.free`); a result the caller
  still holds, through any tensor, view or storage, is never written again.
A lane is a device, its current stream and the calling thread: kept memory serves
only the lane it was last used on (the caching allocator's rule: the stream's order
puts the new call's kernels after every earlier use). While a CUDA graph is captured
nothing kept is used: the graph's own pool serves the capture. A result's
`record_stream` marks the allocator's block, which no PyTorch API reads back: a caller
using a result on another stream joins that stream back before dropping it, as
PyTorch asks of any tensor used on another stream without `record_stream`."""
from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import math
import os
import shutil
import sys
import tempfile
import threading
import warnings
import weakref
from typing import Callable

import torch
from triton import knobs
from triton.compiler import CompiledKernel
from triton.runtime import driver
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from cleave.interpreter import TORCH_DTYPES
from cleave.ir import BindingError, parse_graph
from cleave.ir.dtypes import dtype as ir_dtype

from ..scheduler.exprs import evaluate
from ..scheduler.plan import Plan

WORKSPACE_ALIGN = 256  # bytes: what cudaMalloc guarantees (the caching allocator gives 512)
# Workspaces and outputs up to this size are kept between calls. Larger ones (a prefill
# layer's activations) come from the caching allocator each call, so the memory is not
# pinned while other work needs it.
WORKSPACE_KEPT_BYTES = 64 << 20
OUTPUT_KEPT_BYTES = 64 << 20
_WORKSPACES: dict = {}  # lane -> uint8 tensor, grown to the largest need
# lane -> int32 zeros, the arrival counters of kernels that run a split's combine
# (Kernel.arrivals): each such kernel leaves its counters zero again, so every kernel on
# the lane, which runs after the one before it, may use the same ones
_ARRIVALS: dict = {}
LANES_KEPT = 16
# Copies kept per output of a prepared shape and lane: a result the caller still holds
# (the previous layer's, an input of this call) is skipped for a free one.
OUTPUT_COPIES_KEPT = 4
OUTPUTS_KEPT_BYTES = 256 << 20  # all kept outputs together; past it they are all forgotten
# Kept outputs live on their prepared shape (`_Prepared.kept`) and go with it.
_POOLS: weakref.WeakSet = weakref.WeakSet()  # every live _Pool, to forget them all
_OUTPUTS_LOCK = threading.RLock()  # allocations only (off the hot path); reentrant: a
# pool's finalizer may run inside an allocation, when the garbage collector does
_outputs_bytes = 0  # over the kept outputs of every live pool
# SMs a persistent kernel's programs are counted against where no GPU says (Triton's
# CPU interpreter runs programs one after another: a few exercise the tile loop).
INTERPRETER_SMS = 4
_MODULES: dict[tuple, object] = {}  # (kernel name, source hash) -> the jitted function


@functools.cache
def _kernel_dir() -> str:
    """This process's directory of kernel files, made on first need and removed at exit
    (by the process that made it, not by a forked child)."""
    path = tempfile.mkdtemp(prefix="cleave_kernels_")
    atexit.register(_remove_kernel_dir, path, os.getpid())
    return path


def _remove_kernel_dir(path: str, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


def _kernel_fn(plan: Plan, k):
    key = (k.name, hash(k.source))
    fn = _MODULES.get(key)
    if fn is None:
        # Triton reads a jitted function's source from its file: write it, then import.
        path = os.path.join(_kernel_dir(), f"{k.name}_{abs(hash(k.source)):x}.py")
        with open(path, "w") as f:
            f.write(k.source)
        spec = importlib.util.spec_from_file_location(f"cleave_kernel_{abs(hash(k.source)):x}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        fn = getattr(module, k.name)
        _MODULES[key] = fn
    return fn


def bind(plan: Plan, inputs: dict[str, torch.Tensor]) -> dict[str, int]:
    graph = _cached(plan).get("graph")
    if graph is None:
        graph = _cached(plan)["graph"] = parse_graph(plan.graph)
    unknown = [name for name in inputs if name not in graph.inputs]
    if unknown:  # a misspelt name was ignored, and the input it meant reported missing or taken from elsewhere
        raise BindingError(f"launch: {', '.join(map(repr, unknown))} is not an input of graph {graph.name!r} "
                           f"(its inputs: {', '.join(graph.inputs)})")
    env = graph.bind({k: tuple(v.shape) for k, v in inputs.items()}, extra=dict(plan.split))
    _bind_from_plan(plan, graph, env)
    failed = plan.fits(env)
    if failed:
        raise BindingError(f"plan (split {plan.split}) does not serve this shape: {failed} fails for "
                           + ", ".join(f"{k}={v}" for k, v in sorted(env.items())))
    for name, value in plan.env.items():
        if name not in plan.dynamic and env.get(name, value) != value:
            raise BindingError(f"plan was scheduled for {name}={value}, got {name}={env[name]} "
                               f"(declare {name!r} dynamic to vary it)")
    return env


def _bind_from_plan(plan: Plan, graph, env: dict[str, int]) -> None:
    """Symbols no input's shape binds (an iota's extent): a static one takes the value the
    plan was scheduled at, the only one it serves; a dynamic one has no value to take."""
    unbound = sorted(s.name for s in graph.symbols() if s.name not in env)
    valueless = [name for name in unbound if name in plan.dynamic or name not in plan.env]
    if valueless:
        raise BindingError(f"plan: no input's shape binds symbol(s) {', '.join(valueless)}, and launch reads dynamic "
                           f"symbols from the input shapes only: schedule with them static (not in dynamic) "
                           f"to launch at the values in shapes, or give the graph an input with those axes")
    env.update({name: plan.env[name] for name in unbound})


class _Prepared:
    """Everything a launch at one set of input shapes needs, as plain ints: binding
    symbols through sympy costs milliseconds, so it happens once per shape."""

    def __init__(self, plan: Plan, inputs: dict[str, torch.Tensor]):
        env = bind(plan, inputs)
        # a persistent grid fills the GPU's SMs (a CPU scalar input does not name the device)
        cuda = [t.device for t in inputs.values() if isinstance(t, torch.Tensor) and t.device.type == "cuda"]
        device = cuda[0] if cuda else torch.device("cpu")
        shapes = {b.name: ([evaluate(d, env) for d in b.shape], TORCH_DTYPES[ir_dtype(b.dtype)].itemsize)
                  for b in plan.inputs + plan.outputs + plan.intermediates}
        # A Gluon kernel runs where Gluon does and its descriptors take these shapes; else
        # its `tl` twin (the same arguments) runs. A call whose tensors start unaligned
        # launches the twin too (`fallbacks`).
        gluon_here = gluon_runs_on(device)
        kernels = [k.fallback if k.dialect == "gluon" and not (gluon_here and _descriptors(k, shapes, True)[0])
                   else k for k in plan.kernels]
        # An input no kernel reads (an int argument carried as a length, n + 1 elements of
        # one: frontends/fx_graph.py; its symbol is the kernels' argument) is not copied.
        read = {a for k in kernels for a in k.args if a not in env}
        self.casts = [(b.name, TORCH_DTYPES[ir_dtype(b.dtype)] if b.name in read else None) for b in plan.inputs]
        self.outputs = [(b.name, [evaluate(d, env) for d in b.shape], TORCH_DTYPES[ir_dtype(b.dtype)])
                        for b in plan.outputs]
        # Intermediates share one workspace allocation (one allocator call, not one each),
        # each at an offset aligned like a fresh allocation.
        self.intermediates, self.workspace_bytes = [], 0
        for b in plan.intermediates:
            shape, dtype = [evaluate(d, env) for d in b.shape], TORCH_DTYPES[ir_dtype(b.dtype)]
            self.intermediates.append((b.name, self.workspace_bytes, shape, dtype))
            size = math.prod(shape) * dtype.itemsize
            self.workspace_bytes += -(-size // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
        sms = _sms(device)

        def launch_of(k):
            tiles = evaluate(k.grid[0], env)
            # A launch of fewer tiles than SMs (a decode step at batch 1) is too short to
            # repay building its descriptors: it takes the pointer path. TMA descriptors:
            # (ok at these shapes, [(arg position, buffer, shape, strides, block)], their
            # class), or None for a kernel without any.
            tma = _descriptors(k, shapes, tiles >= sms or k.dialect == "gluon") if k.descriptors else None
            return ((_kernel_fn(plan, k), (_programs(k, tiles, sms), 1, 1),
                     [(a, None) if a not in env else (None, env[a]) for a in k.args],
                     dict(num_warps=k.num_warps, num_stages=k.num_stages)), tma)

        launches = [launch_of(k) for k in kernels]
        self.kernels = [entry for entry, _ in launches]
        self.tma = [tma for _, tma in launches]
        self.fallbacks = [launch_of(k.fallback) if k.dialect == "gluon" else None for k in kernels]
        self.names = [k.name for k in kernels]
        # Kernels without programs here (an empty output or intermediate) are skipped:
        # Triton does not compile them at this shape.
        self.launches = [grid[0] > 0 for _, grid, _, _ in self.kernels]
        # Triton's compiled kernel per launch, once the JIT has picked it for these
        # shapes: calling it directly skips the JIT's per-call argument binding and
        # cache lookup (most of a small decode step's launch cost).
        self.direct: list = [None] * len(self.kernels)
        self.direct_on = None  # the device the direct kernels were loaded on
        self.descriptors: list[dict] = [{} for _ in self.kernels]  # per kernel: position -> (address, descriptor)
        # Each kernel's compiled form, shared by every shape of the plan (dynamic ints are
        # not specialised): its registers and shared memory give the occupancy.
        self.compiled: list = _cached(plan).setdefault("compiled", [None] * len(self.kernels))
        # the counter buffers' names, and the slots the largest needs (all share one buffer)
        self.arrivals = [k.arrivals[0] for k in kernels if k.arrivals]
        self.arrival_slots = max((evaluate(k.arrivals[1], env) for k in kernels if k.arrivals), default=0)
        ints = [value for _, _, args, _ in self.kernels for name, value in args if name is None]
        self.direct_ok = all(abs(v) < 2 ** 31 for v in ints)
        self.kept: dict[tuple, _Pool] = {}  # (lane, inference mode) -> this shape's kept outputs


def _programs(k, tiles: int, sms: int) -> int:
    """Programs to launch: one per tile, or for a persistent kernel at most as many as
    the GPU holds at once (each loops over tiles)."""
    return min(tiles, sms * k.programs_per_sm) if k.programs_per_sm else tiles


def _sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_SMS


def _descriptors(k, shapes: dict, worth_it: bool) -> tuple[bool, list, Callable]:
    """A kernel's TMA descriptors at these shapes (contiguous buffers), whether TMA
    takes them (worth building here, every dim non-empty and every stride but the last
    16-byte aligned; the base pointers are checked per call), and what builds one."""
    descs, ok = [], worth_it
    for arg, buffer, block in k.descriptors:
        shape, itemsize = shapes[buffer]
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        ok = ok and all(0 < d < 2 ** 31 for d in shape) and all(st * itemsize % 16 == 0 for st in strides[:-1]) \
            and math.prod(shape) * itemsize < 2 ** 40  # int32 coordinates, 40-bit strides
        descs.append((k.args.index(arg), buffer, shape, strides, block))
    return ok, descs, gluon_descriptor if k.dialect == "gluon" else TensorDescriptor


def _with_descriptors(tma, values: list, tensors: dict, bases_ok: bool, prepared, workspace,
                      kept: dict | None = None) -> list:
    """values with each descriptor argument filled in and the TMA switch appended: host
    TensorDescriptors when TMA takes this call's tensors, else None and the pointer path.
    `kept` (a compiled kernel's own, launched directly) maps an argument position to the
    descriptor built for an address: a call on the same buffers reuses it, where building
    and validating three took a third of a prefill's host time per call."""
    ok, descs, make = tma
    use = ok and bases_ok
    for pos, buffer, shape, strides, block in descs:
        if not use:
            values[pos] = None
            continue
        t = tensors[buffer]
        ptr = t if isinstance(t, int) else t.data_ptr()
        hit = kept.get(pos) if kept is not None else None
        if hit is not None and hit[0] == ptr:
            values[pos] = hit[1]
            continue
        if isinstance(t, int):  # an intermediate passed as an address: its typed view
            t = _view(prepared, workspace, buffer)
        desc = values[pos] = make(t, shape, strides, block)
        if kept is not None:
            desc.base = _Address(ptr, t.dtype)
            kept[pos] = (ptr, desc)
    return values + [use]


@functools.cache
def _gluon():
    """Triton's Gluon dialect for Hopper (its language and host descriptors), or None."""
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    except ImportError:
        return None
    return gl, GluonDescriptor


def gluon_runs_on(device: torch.device) -> bool:
    """Whether a Gluon kernel (scheduler/gluon.py: Hopper's wgmma, TMA and warp
    specialisation) runs on `device`: an sm_90 GPU, compiled, with Gluon in its Triton."""
    return device.type == "cuda" and not _INTERPRETED and torch.cuda.get_device_capability(device) == (9, 0) \
        and _gluon() is not None


def gluon_descriptor(t, shape, strides, block):
    """A Gluon kernel's TMA descriptor: the shared-memory layout its rings are made in
    (`desc.layout` in the kernel) is the default swizzle for the block."""
    gl, GluonDescriptor = _gluon()
    dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[t.dtype]
    return GluonDescriptor(t, shape, strides, block, gl.NVMMASharedLayout.get_default_for(block, dtype))


class _Address:
    """A kept descriptor's base: the launcher reads its address alone, and holding the
    caller's tensor would keep its memory past the caller's last use."""
    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype: torch.dtype):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


def _cached(plan: Plan) -> dict:
    """Per-plan memo kept on the plan itself: a registry keyed by id(plan) would hand a
    new plan the entries of a dead one that happened to have the same id."""
    memo = plan.__dict__.get("_launch_memo")
    if memo is None:
        memo = plan.__dict__["_launch_memo"] = {}
    return memo


SHAPES_KEPT = 4096  # per-shape memos are bounded: a long-running server meets many shapes


def remember(memo: dict, key, value):
    """memo[key] = value, after forgetting everything once SHAPES_KEPT entries are held
    (a forgotten shape is bound again: about a millisecond)."""
    if len(memo) >= SHAPES_KEPT:
        memo.clear()
    memo[key] = value
    return value


def prepare(plan: Plan, inputs: dict[str, torch.Tensor]) -> _Prepared:
    """The launch of `plan` at these input shapes, memoized on the plan."""
    key = tuple((name, tuple(t.shape)) for name, t in inputs.items())
    memo = _cached(plan)
    prepared = memo.get(key)
    if prepared is None:
        prepared = remember(memo, key, _Prepared(plan, inputs))
    return prepared


def run(prepared: _Prepared, inputs: dict[str, torch.Tensor], out: list | None = None, *,
        scratch: tuple | None = None, only: int | None = None) -> list[torch.Tensor]:
    """Launch a prepared plan on inputs of the shapes it was prepared for. The results
    are written into `out` where given, else into memory no tensor outside cleave can
    reach (`_outputs`): kept from an earlier call the caller let go of, or fresh.
    `scratch` (workspace, arrival counters) replaces the lane's, and `only` launches
    that one kernel: `one_kernel`'s timing."""
    tensors = {}
    # Fresh allocations are aligned (the caching allocator's blocks are): inputs and
    # caller-given outputs are checked.
    bases_ok = True
    device = out[0].device if out else None
    for name, want in prepared.casts:
        t = inputs[name]
        if want is not None:
            if t.is_neg():  # a lazy negation (`z.conj().imag`): its memory holds -t, which kernels would read
                t = t.resolve_neg()
            tensors[name] = t = (t if t.dtype == want else _cast_input(name, t, want)).contiguous()
            bases_ok = bases_ok and t.data_ptr() % 16 == 0
        device = t.device
    if device is None:
        raise BindingError("launch: the plan reads no tensor, so none names the device to run on: pass `out=` "
                           "tensors on it")
    lane = _lane(device)
    outs = _outputs(prepared, device, lane) if out is None else [out[i] for i in range(len(prepared.outputs))]
    for (name, shape, _), t in zip(prepared.outputs, outs):
        if out is not None:
            if list(t.shape) != shape or not t.is_contiguous():
                got = f"shape {list(t.shape)}" if list(t.shape) != shape else \
                    f"a tensor of that shape with strides {tuple(t.stride())}, not contiguous"
                raise BindingError(f"output {name!r}: expected a contiguous tensor of shape {shape}, got {got}")
            bases_ok = bases_ok and t.data_ptr() % 16 == 0
        tensors[name] = t
    aligned = prepared.direct_ok and bases_ok
    direct_now = aligned and prepared.direct_on in (None, device) and not _hooked()
    workspace = None
    if prepared.intermediates:
        workspace = scratch[0] if scratch else _workspace(prepared.workspace_bytes, device, lane)
        if direct_now and None not in prepared.direct:  # compiled kernels take plain addresses
            base = workspace.data_ptr()
            tensors.update((name, base + offset) for name, offset, _, _ in prepared.intermediates)
        else:  # the JIT reads each buffer's dtype off a tensor
            tensors.update(_views(prepared, workspace))
    if prepared.arrivals:
        counters = scratch[1] if scratch else _arrivals(prepared.arrival_slots, device, lane)
        tensors.update((name, counters) for name in prepared.arrivals)
    stream = None
    for i, (fn, grid, args, options) in enumerate(prepared.kernels):
        if not prepared.launches[i] or only not in (None, i):  # nothing to compute (a GPU rejects an empty grid)
            continue
        tma = prepared.tma[i]
        if prepared.fallbacks[i] is not None and not bases_ok:  # a Gluon kernel reads through TMA alone
            (fn, grid, args, options), tma = prepared.fallbacks[i]
        values = [tensors.get(name) if name is not None else value for name, value in args]
        direct = prepared.direct[i] if tma is prepared.tma[i] else None
        if tma is not None:
            kept = prepared.descriptors[i] if direct is not None and direct_now else None
            values = _with_descriptors(tma, values, tensors, bases_ok, prepared, workspace, kept)
        if direct is not None and direct_now:
            try:
                if stream is None:
                    stream = _current_stream()
                # What CompiledKernel[grid](*values) does, without its per-call closure and
                # launch metadata: no launch hook is registered to read them.
                direct.run(*grid, stream, direct.function, direct.packed_metadata, None, None, None, *values)
                continue
            except Exception:  # a Triton whose compiled-kernel call differs: the JIT path always works
                prepared.direct_ok = direct_now = False
                if prepared.intermediates:
                    tensors.update(_views(prepared, workspace))
                    values = [tensors.get(name) if name is not None else value for name, value in args]
                    if tma is not None:
                        values = _with_descriptors(tma, values, tensors, bases_ok, prepared, workspace)
        kernel = _jit_launch(fn, grid, values, options, prepared.names[i])
        if isinstance(kernel, CompiledKernel) and tma is prepared.tma[i]:
            prepared.compiled[i] = kernel
            if aligned:  # specialised like every later aligned call of this shape: same
                # dtypes, ints unspecialised or equal, pointers 16-byte aligned
                prepared.direct[i], prepared.direct_on = kernel, device
    return outs


# Triton's CPU interpreter keeps the launch's grid in module state: two threads
# launching at once read each other's grid ("x >= grid_dim[0]"). Interpreted launches
# take turns; compiled ones run concurrently, each on its thread's lane.
_INTERPRETED = knobs.runtime.interpret  # as Triton reads TRITON_INTERPRET (1, true, on, yes, y)
_INTERPRETER_LOCK = threading.Lock()


@contextlib.contextmanager
def _interpreted_launch():
    """One interpreted launch at a time, without numpy's warnings: lanes past an extent
    compute what the GPU computes silently and no store keeps (0/0 in a masked row of
    a softmax), which numpy reported to the user as "invalid value encountered"."""
    import numpy

    with _INTERPRETER_LOCK, numpy.errstate(all="ignore"):
        yield


class InputCastWarning(UserWarning):
    """An input is converted to the plan's dtype, and the conversion may change values."""


def _holds_every_value(of: torch.dtype, into: torch.dtype) -> bool:
    """Whether every value of dtype `of` converts to `into` unchanged: a wider float
    holds a narrower one, a float holds an integer within its significand (f32 holds
    int16, not int32), an integer holds one of a range inside its own."""
    if of == torch.bool:
        return True
    if into == torch.bool or into.is_complex or of.is_complex:
        return of == into
    if of.is_floating_point:
        if not into.is_floating_point:
            return False
        a, b = torch.finfo(of), torch.finfo(into)
        return b.eps <= a.eps and b.max >= a.max and b.smallest_normal <= a.smallest_normal
    source = torch.iinfo(of)
    if into.is_floating_point:
        magnitude_bits = source.bits - (source.min < 0)
        return magnitude_bits <= 1 - math.log2(torch.finfo(into).eps)
    target = torch.iinfo(into)
    return target.min <= source.min and target.max >= source.max


def _cast_input(name: str, t: torch.Tensor, want: torch.dtype) -> torch.Tensor:
    """t as the plan's dtype. A conversion that may change values (f32 to bf16, f16 to
    bf16, a float to an integer, int64 to int32, int32 to f32) is said, where it happened
    without a word: an f32 tensor given to a bf16 plan came back rounded, int64 indices
    past int32's range wrapped."""
    if not _holds_every_value(t.dtype, want):
        changes = ("rounds it" if want.is_floating_point else "truncates it" if t.is_floating_point()
                   else f"wraps values outside {want}'s range")
        warnings.warn(InputCastWarning(f"launch: input {name!r} is {t.dtype}, and the plan takes {want}: converted "
                                       f"before the kernels, which {changes} (pass it as the plan's dtype)"),
                      stacklevel=4)
    return t.to(want)


class SharedMemoryWarning(UserWarning):
    """A kernel runs with fewer pipeline stages than its plan asks for: the GPU's shared
    memory holds fewer (results are the same; it may run slower)."""


def _jit_launch(fn, grid, values, options: dict, name: str):
    """fn[grid](*values) with the plan's options. Where the compiled kernel needs more
    shared memory than the GPU has (the cost model's estimate is a lead: Triton's
    epilogue scratch varies), one stage fewer, down to one; `options` keeps the stages
    that fit, so later calls compile nothing more."""
    if not _INTERPRETED and any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in values):
        raise RuntimeError(f"kernel {name}: its tensors are on the CPU and Triton's interpreter is off: set "
                           f"TRITON_INTERPRET=1 (before triton is imported) to run it on the CPU, or pass CUDA tensors")
    asked, first = options.get("num_stages", 1), None
    while True:
        try:
            with _interpreted_launch() if _INTERPRETED else contextlib.nullcontext():
                kernel = fn[grid](*values, **options)
            break
        except OutOfResources as err:
            if options.get("num_stages", 1) <= 1 or "shared memory" not in str(err):
                raise
            first = first or err
            options["num_stages"] -= 1
    if first is not None:
        warnings.warn(f"kernel {name}: {asked} pipeline stages need {first.required} bytes of shared memory, the "
                      f"GPU has {first.limit}: running it with {options['num_stages']}", SharedMemoryWarning,
                      stacklevel=3)
    return kernel


def _lane(device: torch.device) -> tuple | None:
    """Where memory kept between calls may serve this call: (device, current stream,
    thread); the stream is None on the CPU, where the interpreter runs kernels in the
    calling thread. None while the current stream captures a CUDA graph: the graph's own
    pool serves the capture (its replays must not share memory with calls outside it)."""
    if device.type != "cuda":
        return device, None, threading.get_ident()
    if torch.cuda.is_current_stream_capturing():
        return None
    return device, torch._C._cuda_getCurrentRawStream(device.index), threading.get_ident()


def _workspace(nbytes: int, device: torch.device, lane: tuple | None) -> torch.Tensor:
    """Memory for a call's intermediates. A kept workspace is reused by the next call on
    its lane, which runs after this call's kernels: no two calls' intermediates meet,
    and no result lies in it."""
    if nbytes > WORKSPACE_KEPT_BYTES or lane is None:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    kept = _WORKSPACES.get(lane)
    if kept is None or kept.numel() < nbytes:
        if len(_WORKSPACES) >= LANES_KEPT:  # short-lived threads or streams: forget the old lanes
            _WORKSPACES.clear()
        kept = _WORKSPACES[lane] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return kept


def _arrivals(slots: int, device: torch.device, lane: tuple | None) -> torch.Tensor:
    """Zeroed int32 counters for kernels that count their programs' arrivals: kept per
    lane, since each such kernel leaves them zero. During a capture the graph's pool
    serves them, zeroed by the graph itself at each replay."""
    if lane is None:
        return torch.zeros(slots, dtype=torch.int32, device=device)
    kept = _ARRIVALS.get(lane)
    if kept is None or kept.numel() < slots:
        if len(_ARRIVALS) >= LANES_KEPT:
            _ARRIVALS.clear()
        kept = _ARRIVALS[lane] = torch.zeros(max(slots, 1), dtype=torch.int32, device=device)
    return kept


class _Kept:
    """An output's memory kept between calls: a tensor cleave never hands out, and its
    storage's Python object, which every tensor over that memory gives back from
    untyped_storage(). Callers get detached aliases of `tensor`: each its own tensor
    (autograd state, version counter, metadata), over this one storage."""

    __slots__ = ("tensor", "storage", "cdata", "ptr", "nbytes", "cuda", "refs")

    def __init__(self, shape, dtype, device: torch.device):
        self.tensor = torch.empty(shape, dtype=dtype, device=device)
        self.storage = self.tensor.untyped_storage()
        self.cdata, self.ptr, self.nbytes = self.storage._cdata, self.storage.data_ptr(), self.storage.nbytes()
        self.cuda = device.type == "cuda"
        self.refs = self._refs()  # nothing but cleave holds it yet

    def _refs(self) -> tuple[int, int]:
        """The StorageImpl's strong count (one per tensor over the memory, C++ holders
        included, and one for its Python object) and the Python object's refcount."""
        return torch._C._storage_Use_Count(self.cdata), sys.getrefcount(self.storage)

    def free(self) -> bool:
        """Whether nothing outside cleave can reach the memory: no tensor, view or
        storage object beyond cleave's own (both counts as when it was made), the
        storage still on the memory it was made with (resize_ and CPU share_memory_
        move it), and on the GPU still the caching allocator's (CUDA IPC hands it to
        another process)."""
        return self._refs() == self.refs and self.storage.data_ptr() == self.ptr \
            and (not self.cuda or torch._C._has_Standard_Deleter(self.cdata))


class _Pool:
    """One prepared shape's kept outputs on one lane: a list of _Kept per output. Its
    bytes leave the count when it goes, with its prepared shape."""

    __slots__ = ("copies", "__weakref__")

    def __init__(self, outputs: int):
        self.copies = [[] for _ in range(outputs)]
        with _OUTPUTS_LOCK:
            _POOLS.add(self)
        weakref.finalize(self, _uncount, self.copies)


def _uncount(copies: list) -> None:
    global _outputs_bytes
    with _OUTPUTS_LOCK:
        _outputs_bytes -= sum(k.nbytes for kept in copies for k in kept)


def _forget_outputs() -> None:
    """Forget every kept output (those callers hold stay theirs). A lane's hot path
    iterating a list emptied here finds no copy and allocates."""
    global _outputs_bytes
    with _OUTPUTS_LOCK:
        for pool in list(_POOLS):
            for kept in pool.copies:
                kept.clear()
        _outputs_bytes = 0


def _outputs(prepared: _Prepared, device: torch.device, lane: tuple | None) -> list[torch.Tensor]:
    """A call's output tensors: per output, a copy kept on this lane that is free again,
    else a new allocation, kept too (past OUTPUT_COPIES_KEPT in place of the oldest
    copy, which callers still hold). Outputs over OUTPUT_KEPT_BYTES, and every output
    during a capture, are allocated and not kept."""
    if lane is None:
        return [torch.empty(shape, dtype=dtype, device=device) for _, shape, dtype in prepared.outputs]
    # an inference tensor is only made in inference mode: a copy serves one mode
    key = (lane, torch.is_inference_mode_enabled())
    pool = prepared.kept.get(key)
    if pool is None:
        if len(prepared.kept) >= LANES_KEPT:  # short-lived threads or streams: forget the old lanes
            prepared.kept.clear()
        pool = prepared.kept[key] = _Pool(len(prepared.outputs))
    outs = []
    for kept, (_, shape, dtype) in zip(pool.copies, prepared.outputs):
        for k in kept:
            if k.free():
                outs.append(k.tensor.detach())
                break
        else:
            outs.append(_allocate(kept, shape, dtype, device))
    return outs


def _allocate(kept: list, shape, dtype, device: torch.device) -> torch.Tensor:
    """A new output, kept as one of `kept` (one output's copies) within the bounds."""
    global _outputs_bytes
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > OUTPUT_KEPT_BYTES:
        return torch.empty(shape, dtype=dtype, device=device)
    k = _Kept(shape, dtype, device)
    with _OUTPUTS_LOCK:
        if len(kept) >= OUTPUT_COPIES_KEPT:  # callers hold every copy: the oldest becomes theirs alone
            _outputs_bytes -= kept.pop(0).nbytes
        if _outputs_bytes + nbytes > OUTPUTS_KEPT_BYTES:  # shape churn
            _forget_outputs()
        kept.append(k)
        _outputs_bytes += nbytes
    return k.tensor.detach()


def _views(prepared: _Prepared, workspace: torch.Tensor):
    """The intermediates as typed tensors over the workspace."""
    for name, offset, shape, dtype in prepared.intermediates:
        yield name, _typed(workspace, offset, shape, dtype)


def _view(prepared: _Prepared, workspace: torch.Tensor, name: str) -> torch.Tensor:
    """One intermediate as a typed tensor over the workspace."""
    _, offset, shape, dtype = next(x for x in prepared.intermediates if x[0] == name)
    return _typed(workspace, offset, shape, dtype)


def _typed(workspace: torch.Tensor, offset: int, shape, dtype) -> torch.Tensor:
    return workspace[offset:offset + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)


def _hooked() -> bool:
    """Whether a launch hook is registered (a profiler such as proton): hooks read each
    launch's metadata, which only Triton's own launch path builds."""
    runtime = knobs.runtime
    return _registered(runtime.launch_enter_hook) or _registered(runtime.launch_exit_hook)


def _registered(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))  # a HookChain holds its hooks in .calls


def _current_stream() -> int:
    """The stream Triton launches on: the current device's current stream."""
    active = driver.active
    return active.get_current_stream(active.get_current_device())


def launch(plan: Plan, inputs: dict[str, torch.Tensor], out: list | None = None) -> list[torch.Tensor]:
    if not isinstance(plan, Plan):
        hint = " (cleave.schedule returns a list: pass one element)" if isinstance(plan, (list, tuple)) else \
            " (Plan.from_json reads a dict back)" if isinstance(plan, dict) else ""
        raise TypeError(f"launch: plan is a {type(plan).__name__}, not a cleave Plan{hint}")
    _check_arguments(inputs, out)
    prepared = prepare(plan, inputs)
    if out is not None:
        _check_out(prepared, inputs, out)
    return run(prepared, inputs, out)


def _check_arguments(inputs, out) -> None:
    """launch's arguments as it takes them: a dict of tensors by input name, and `out` a
    list of tensors (a numpy array or a list where a tensor goes was an AttributeError)."""
    if not isinstance(inputs, dict):
        raise BindingError(f"launch: inputs are a dict of tensors by input name, got a {type(inputs).__name__}")
    for name, t in inputs.items():
        if not isinstance(t, torch.Tensor):
            raise BindingError(f"launch: input {name!r} is a {type(t).__name__}, not a torch.Tensor")
        if t.is_meta:
            raise BindingError(f"launch: input {name!r} is on the meta device: it holds no data to compute on")
    if out is not None and not (isinstance(out, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in out)):
        raise BindingError("launch: out= is a list of tensors, one per output of the plan")


def _check_out(prepared: _Prepared, inputs: dict, out) -> None:
    """Each out= tensor as the plan writes it: one per output, of its dtype, on the inputs'
    device, and sharing no memory with an input or another output. Later programs read
    an input after earlier ones wrote an aliasing output (softmax(x @ w) into x: 0.9999
    off, said nothing); a narrower dtype truncated the result."""
    if len(out) != len(prepared.outputs):
        raise BindingError(f"launch: out= has {len(out)} tensor(s), the plan {len(prepared.outputs)} output(s) "
                           f"({', '.join(name for name, _, _ in prepared.outputs)})")
    devices = {t.device for t in inputs.values() if t.device.type != "cpu" or t.dim()}
    for (name, _, dtype), t in zip(prepared.outputs, out):
        if t.dtype != dtype:
            raise BindingError(f"output {name!r}: the plan writes {dtype}, out= gives {t.dtype}")
        if devices and t.device not in devices:
            raise BindingError(f"output {name!r}: out= is on {t.device}, the inputs on "
                               f"{', '.join(map(str, sorted(devices, key=str)))}")
    spans = [(f"input {n!r}", _span(t)) for n, t in inputs.items()] + \
        [(f"output {name!r}", _span(t)) for (name, _, _), t in zip(prepared.outputs, out)]
    for i, (what, (base, lo, hi)) in enumerate(spans[len(inputs):], len(inputs)):
        for other, (b, l2, h2) in spans[:i]:
            if base == b and lo < h2 and l2 < hi:
                raise BindingError(f"launch: out= {what} shares memory with {other}: the kernels would read what "
                                   f"they already wrote; pass a tensor of its own")


def _span(t: torch.Tensor) -> tuple:
    """The bytes a tensor may touch: (storage, first, past the last)."""
    if t.numel() == 0:
        return (None, 0, 0)
    first = t.storage_offset() + sum(min(0, (d - 1) * st) for d, st in zip(t.shape, t.stride()))
    last = t.storage_offset() + sum(max(0, (d - 1) * st) for d, st in zip(t.shape, t.stride()))
    return (t.untyped_storage().data_ptr(), first * t.element_size(), (last + 1) * t.element_size())


def one_kernel(plan: Plan, inputs: dict[str, torch.Tensor], slot: int) -> Callable[[], None]:
    """What launches kernel `slot` of `plan` alone, on outputs and intermediates of its
    own that one whole call of the plan has filled: the kernel reads what it reads in
    the plan (never unwritten memory, which can run faster than real data). For timing
    one kernel's options; kernels rewrite their outputs whole (a split's combine leaves
    its counters zero), so the launch can repeat."""
    prepared = prepare(plan, inputs)
    device = next(t.device for t in inputs.values() if isinstance(t, torch.Tensor))
    outs = [torch.empty(shape, dtype=dtype, device=device) for _, shape, dtype in prepared.outputs]
    scratch = (torch.empty(prepared.workspace_bytes, dtype=torch.uint8, device=device),
               torch.zeros(max(prepared.arrival_slots, 1), dtype=torch.int32, device=device))
    run(prepared, inputs, outs, scratch=scratch)
    return lambda: run(prepared, inputs, outs, scratch=scratch, only=slot)
