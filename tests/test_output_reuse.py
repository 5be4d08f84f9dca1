"""Output memory reused across calls (runtime/launch.py, `_outputs`), never observable
as aliasing: a result the caller still reaches, through the tensor, a view or its
storage, is never written again; once the caller lets go, the next call of that
shape writes into the same memory and allocates nothing. Under TRITON_INTERPRET=1 at
small odd shapes, against the fp64 interpreter, with fresh random inputs.

The Triton interpreter keeps each launch's argument storages in a reference cycle
(its argument-copying closures refer to themselves): until the garbage collector
frees it, the memory is still reachable, and is rightly not reused. The tests that
expect reuse collect first; on the GPU no cycle holds it."""
from __future__ import annotations

import gc
import os
import threading

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from cleave.interpreter import interpret
from cleave.ir import Graph
from cleave.runtime import backend
from cleave.runtime import launch as L
from cleave.scheduler import schedule
from kernel_check import check_outputs

SHAPE = (7, 13)


@pytest.fixture(scope="module")
def graph():
    """Two outputs of different shapes: tanh(x) (chainable: its result is an input of
    the same shape) and the row sums."""
    g = Graph("two_outputs")
    x = g.input("x", ("s", "n"), "f32")
    return g.output(x.tanh(), x.sum(-1), names=["y", "r"])


@pytest.fixture(scope="module")
def plan(graph):
    return schedule(graph, {"s": 37, "n": 45}, dynamic={"s", "n"}, top_k=1)[0]


@pytest.fixture(autouse=True)
def fresh_pools():
    L._forget_outputs()
    yield
    L._forget_outputs()


def _pool(plan, shape=SHAPE) -> list[list]:
    """The kept copies of each output of `plan` at `shape` on this thread's lane."""
    pool = L.prepare(plan, _inputs(0, shape)).kept.get((L._lane(torch.device("cpu")), False))
    return pool.copies if pool else [[], []]


def _inputs(seed: int, shape=SHAPE) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(*shape, generator=torch.Generator().manual_seed(seed))}


def _check(graph, got, inputs, what: str):
    check_outputs(got, interpret(graph, inputs, compute_dtype=torch.float64), what)


class Allocations:
    """Counts torch.empty calls (outputs and workspaces alike) while active."""

    def __init__(self, monkeypatch):
        self.count, real = 0, torch.empty

        def counting(*args, **kwargs):
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(torch, "empty", counting)


def test_a_result_the_caller_keeps_is_never_written_again(graph, plan):
    first_inputs = _inputs(1)
    y1, r1 = L.launch(plan, first_inputs)
    kept = (y1.clone(), r1.clone())
    for seed in (2, 3, 4):
        inputs = _inputs(seed)
        y, r = L.launch(plan, inputs)
        _check(graph, [y, r], inputs, f"seed {seed}")
        assert y.data_ptr() != y1.data_ptr() and r.data_ptr() != r1.data_ptr()
        assert torch.equal(y1, kept[0]) and torch.equal(r1, kept[1])
        del y, r
        gc.collect()
    _check(graph, [y1, r1], first_inputs, "the kept first result")


HOLDERS = {
    "slice": lambda y: y[2:],
    "view": lambda y: y.view(-1),
    "transpose": lambda y: y.t(),
    "detach": lambda y: y.detach(),
    "storage": lambda y: y.untyped_storage(),
    "typed storage": lambda y: y.storage(),
    "numpy": lambda y: y.numpy(),
    "a tensor set to its storage": lambda y: torch.empty(0).set_(y.untyped_storage()),
    "a storage slice": lambda y: y.untyped_storage()[16:],
    "dlpack": lambda y: torch.utils.dlpack.to_dlpack(y),
}


@pytest.mark.filterwarnings("ignore::UserWarning")  # TypedStorage is deprecated
@pytest.mark.parametrize("name", sorted(HOLDERS))
def test_anything_reaching_the_memory_keeps_it_from_reuse(graph, plan, name):
    """`y = out[0]; v = y[2:]; del y`: v still reads call 1's values after call 2."""
    y, _ = L.launch(plan, _inputs(1))
    address, values = y.data_ptr(), y.clone()
    held = HOLDERS[name](y)
    del y
    gc.collect()
    inputs = _inputs(2)
    y2, r2 = L.launch(plan, inputs)
    assert y2.data_ptr() != address
    _check(graph, [y2, r2], inputs, "call 2")
    assert torch.equal(_kept(address), values), f"{name}: call 1's values changed"
    del held


def _kept(address: int) -> torch.Tensor:
    """cleave's own tensor over the kept output memory at `address`."""
    for pool in L._POOLS:
        for kept in pool.copies:
            for k in kept:
                if k.ptr == address:
                    return k.tensor
    raise AssertionError(f"no kept output at {address:#x}")


def test_a_result_let_go_of_is_reused_and_the_results_stay_check(graph, plan):
    y, r = L.launch(plan, _inputs(1))
    addresses = (y.data_ptr(), r.data_ptr())
    del y, r
    gc.collect()
    for seed in (2, 3, 4):
        inputs = _inputs(seed)
        y, r = L.launch(plan, inputs)
        assert (y.data_ptr(), r.data_ptr()) == addresses
        _check(graph, [y, r], inputs, f"seed {seed}, reused memory")
        del y, r
        gc.collect()


def test_each_output_is_reused_on_its_own(graph, plan):
    """The caller keeps the row sums only: the next call reuses tanh's memory alone."""
    y, r1 = L.launch(plan, _inputs(1))
    address = y.data_ptr()
    del y
    gc.collect()
    inputs = _inputs(2)
    y, r = L.launch(plan, inputs)
    assert y.data_ptr() == address and r.data_ptr() != r1.data_ptr()
    _check(graph, [y, r], inputs, "tanh reused, the row sums fresh")


def test_the_hot_path_allocates_nothing_once_warm(graph, plan, monkeypatch):
    """Results dropped each call, and a chain whose input is the previous call's result
    (that one is live during the call: two copies alternate)."""
    L.launch(plan, _inputs(1))
    allocations = Allocations(monkeypatch)
    for seed in (2, 3, 4):
        gc.collect()
        inputs = _inputs(seed)
        _check(graph, L.launch(plan, inputs), inputs, f"seed {seed}")
    assert allocations.count == 0
    x = _inputs(5)["x"]
    for _ in range(5):
        gc.collect()
        y, r = L.launch(plan, {"x": x})
        torch.testing.assert_close(y, x.tanh())
        x = y
    assert allocations.count == 2  # the chain's second copy of tanh(x), and its row sums'
    held = [L.launch(plan, _inputs(seed)) for seed in range(6)]  # the counter counts
    assert allocations.count > 2 and len({y.data_ptr() for y, _ in held}) == len(held)


@pytest.mark.filterwarnings("ignore:cleave.*graph break")
def test_through_torch_compile(monkeypatch):
    """The backend's hot path (Launcher.hot). The diagonal is a view the backend makes on
    the host of a compiled output: the caller gets a view of a compiled output, which
    must keep that output's memory, as must a result the caller keeps or views itself.
    Dropped results are reused, with no allocation."""
    torch._dynamo.reset()
    ctx = backend.reset()

    def fn(x):
        y = torch.tanh(x)
        return y, y.diagonal(), x.sum(-1)

    def want(x):
        return x.tanh(), x.tanh().diagonal(), x.sum(-1)

    f = torch.compile(fn, backend="cleave")
    with torch.no_grad():
        for seed in (0, 1):  # compiles, then takes the hot path
            x = _inputs(seed)["x"]
            torch.testing.assert_close(f(x), want(x))
        x1, x2, x3 = (_inputs(seed)["x"] for seed in (2, 3, 4))
        y1, diagonal1, r1 = f(x1)
        diagonal1_values = diagonal1.clone()
        torch.testing.assert_close(diagonal1, want(x1)[1])
        del y1, r1
        gc.collect()
        y2, _, _ = f(x2)
        assert torch.equal(diagonal1, diagonal1_values)
        assert diagonal1._base is not None and y2.data_ptr() != diagonal1._base.data_ptr()
        rows, y2_address = y2[1:], y2.data_ptr()
        rows_values = rows.clone()
        del y2, _
        gc.collect()
        got = f(x3)
        assert torch.equal(rows, rows_values) and torch.equal(diagonal1, diagonal1_values)
        torch.testing.assert_close(got, want(x3))
        assert got[0].data_ptr() not in (y2_address, diagonal1.data_ptr())
        del got, rows, diagonal1
        allocations, addresses = Allocations(monkeypatch), set()
        for seed in (5, 6, 7):
            gc.collect()
            x = _inputs(seed)["x"]
            got = f(x)
            torch.testing.assert_close(got, want(x))
            addresses.add(tuple(t.data_ptr() for t in got))
            del got
    assert allocations.count == 0 and len(addresses) == 1
    stats = ctx.stats()
    assert stats["operators"] >= 1 and stats["graph_breaks"] == 0 and stats["failed"] == 0, stats


def test_memory_serves_only_its_lane(graph, plan):
    """Another thread allocates its own; an output made outside inference mode does not
    serve a call inside it (it would hand out a normal tensor there), and back."""
    y, _ = L.launch(plan, _inputs(1))
    address = y.data_ptr()
    del y, _
    gc.collect()
    seen = []
    other = threading.Thread(target=lambda: seen.append(L.launch(plan, _inputs(2))[0].data_ptr()))
    other.start()
    other.join()
    assert seen and seen[0] != address
    with torch.inference_mode():
        inputs = _inputs(3)
        y, r = L.launch(plan, inputs)
        assert y.is_inference() and y.data_ptr() != address
        _check(graph, [y, r], inputs, "inference mode")
    del y, r
    gc.collect()
    y, _ = L.launch(plan, _inputs(4))
    assert not y.is_inference() and y.data_ptr() == address


def test_caller_given_outputs_and_captures_keep_nothing(plan, monkeypatch):
    out = [torch.full(SHAPE, float("nan")), torch.full(SHAPE[:1], float("nan"))]
    got = L.launch(plan, _inputs(1), out=out)
    assert all(g is o for g, o in zip(got, out)) and not any(_pool(plan))
    lane = L._lane
    monkeypatch.setattr(L, "_lane", lambda device: None)  # what a CUDA graph capture gives
    L.launch(plan, _inputs(2))
    monkeypatch.setattr(L, "_lane", lane)
    assert not any(_pool(plan)) and not L._outputs_bytes


def test_kept_memory_is_bounded(plan, monkeypatch):
    """At most OUTPUT_COPIES_KEPT copies per output (the oldest is the callers' alone);
    past OUTPUTS_KEPT_BYTES everything is forgotten; an output over OUTPUT_KEPT_BYTES is
    not kept."""
    held = [L.launch(plan, _inputs(seed)) for seed in range(L.OUTPUT_COPIES_KEPT + 2)]
    copies = _pool(plan)
    assert [len(c) for c in copies] == [L.OUTPUT_COPIES_KEPT] * 2
    assert [k.ptr for k in copies[0]] == [y.data_ptr() for y, _ in held[-L.OUTPUT_COPIES_KEPT:]]
    per_call = (SHAPE[0] * SHAPE[1] + SHAPE[0]) * 4
    assert L._outputs_bytes == L.OUTPUT_COPIES_KEPT * per_call
    monkeypatch.setattr(L, "OUTPUTS_KEPT_BYTES", 3 * per_call)
    L._forget_outputs()
    held = [L.launch(plan, _inputs(seed)) for seed in range(4)]
    assert [len(c) for c in _pool(plan)] == [1, 1] and L._outputs_bytes == per_call  # forgotten at the fourth
    L.launch(plan, _inputs(1, (5, 9)))  # another shape: a pool of its own
    assert [len(c) for c in _pool(plan, (5, 9))] == [1, 1] and L._outputs_bytes == per_call + (5 * 9 + 5) * 4
    monkeypatch.setattr(L, "OUTPUT_KEPT_BYTES", SHAPE[0] * 4)  # the row sums fit, tanh's output does not
    L._forget_outputs()
    L.launch(plan, _inputs(1))
    assert [len(c) for c in _pool(plan)] == [0, 1] and L._outputs_bytes == SHAPE[0] * 4


def test_kept_memory_goes_with_its_plan(graph):
    """A plan's kept outputs live on its prepared shapes: dropping the plan frees them
    and takes their bytes out of the count."""
    before = L._outputs_bytes
    other = schedule(graph, {"s": 37, "n": 45}, dynamic={"s", "n"}, top_k=1)[0]
    y, r = L.launch(other, _inputs(1))
    storage = y.untyped_storage()._weak_ref()
    assert L._outputs_bytes == before + (SHAPE[0] * SHAPE[1] + SHAPE[0]) * 4
    del y, r, other
    gc.collect()
    assert L._outputs_bytes == before and torch.UntypedStorage._expired(storage)
    torch.UntypedStorage._free_weak_ref(storage)


@pytest.mark.parametrize("change", ["resize", "share_memory"])
def test_memory_moved_by_the_caller_is_not_reused(graph, plan, change):
    """A storage resized to nothing, or moved into shared memory (another process may
    map it), is the caller's: the next call does not write there (the memory it left
    went back to the allocator, and may serve again)."""
    y, _ = L.launch(plan, _inputs(1))
    if change == "resize":
        y.untyped_storage().resize_(0)
    else:
        y.share_memory_()
    moved, storage = y.data_ptr(), y.untyped_storage()._cdata
    del y, _
    gc.collect()
    inputs = _inputs(2)
    y, r = L.launch(plan, inputs)
    assert y.data_ptr() != moved and y.untyped_storage()._cdata != storage
    _check(graph, [y, r], inputs, change)
