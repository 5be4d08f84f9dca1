"""On a CUDA device (`pytest -m gpu`): the second launch of a shape calls Triton's
compiled kernel directly, skipping the JIT's per-call binding; it must compute what
the JIT launch computes, and fall back to the JIT for an unaligned input. Output
memory a caller let go of is reused on its own stream only, never in a capture, and
never once shared with another process."""
import pytest
import torch

from cleave import workloads as W
from cleave.interpreter import interpret
from cleave.runtime.launch import launch, prepare
from cleave.scheduler import schedule
from fixtures_candidates import CANDIDATES

pytestmark = pytest.mark.gpu


def test_direct_launch_matches_the_jit_launch():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    env = {"b": 3, "hkv": 2, "g": 3, "L": 77, "d": 16}
    plan = schedule(CANDIDATES["gqa_decode"](), env, dynamic={"b", "L"}, top_k=1, split={"sp": 4})[0]
    inputs = {k: v.cuda() for k, v in W.get("gqa_decode").inputs(env, seed=1).items()}
    ref = interpret(W.get("gqa_decode").graph, {k: v.cpu() for k, v in inputs.items()}, compute_dtype=torch.float64)[0]
    first = launch(plan, inputs)[0]  # through the JIT
    assert all(k is not None for k in prepare(plan, inputs).direct)
    poisoned = [torch.full_like(first, float("nan"))]
    second = launch(plan, inputs, out=poisoned)[0]  # direct
    assert torch.equal(first, second)
    assert ((second.double().cpu() - ref).norm() / ref.norm()).item() < 1e-2
    wide = torch.empty(inputs["q"].numel() + 1, dtype=inputs["q"].dtype, device="cuda")
    shifted = wide[1:].view(inputs["q"].shape)  # 2-byte offset: not 16-byte aligned
    shifted.copy_(inputs["q"])
    assert torch.equal(launch(plan, {**inputs, "q": shifted})[0], first)


def test_a_registered_launch_hook_sees_every_launch():
    """The direct launch skips the launch metadata only while no hook reads it: a
    profiler's hook (proton registers one) must see the launches of a warm shape."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from triton import knobs

    env = {"b": 2, "hkv": 1, "g": 3, "L": 45, "d": 16}
    plan = schedule(CANDIDATES["gqa_decode"](), env, dynamic={"b", "L"}, top_k=1)[0]
    inputs = {k: v.cuda() for k, v in W.get("gqa_decode").inputs(env, seed=2).items()}
    first = launch(plan, inputs)[0]
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        again = launch(plan, inputs)[0]
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert torch.equal(first, again)
    assert [m.get()["name"] for m in seen] == [k.name for k in plan.kernels]


def _decode(seed: int):
    env = {"b": 2, "hkv": 1, "g": 3, "L": 45, "d": 16}
    plan = schedule(CANDIDATES["gqa_decode"](), env, dynamic={"b", "L"}, top_k=1)[0]
    return plan, {k: v.cuda() for k, v in W.get("gqa_decode").inputs(env, seed=seed).items()}


def test_outputs_are_reused_on_their_stream_and_never_in_a_capture():
    """A dropped result's memory serves the next call on its stream; a call on another
    stream gets its own, and a CUDA graph capture on that stream uses none of it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    plan, inputs = _decode(3)
    first = launch(plan, inputs)[0]
    address, want = first.data_ptr(), first.clone()
    del first
    again = launch(plan, inputs)[0]
    assert again.data_ptr() == address and torch.equal(again, want)
    del again
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        other = launch(plan, inputs)[0]
        side_address = other.data_ptr()
        del other
        assert side_address != address
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            captured = launch(plan, inputs)[0]
        assert captured.data_ptr() not in (address, side_address)
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, want)
    assert launch(plan, inputs)[0].data_ptr() == address


def test_an_output_shared_through_cuda_ipc_is_not_reused():
    """Another process may map it: the storage's deleter is no longer the allocator's."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    plan, inputs = _decode(4)
    out = launch(plan, inputs)[0]
    address = out.data_ptr()
    out.untyped_storage()._share_cuda_()
    del out
    assert launch(plan, inputs)[0].data_ptr() != address


def test_a_combine_run_by_its_partial_kernel_is_exact_in_any_arrival_order(monkeypatch):
    """On the GPU the programs of a group arrive in any order: every call, eager, on a
    second stream and replayed from a CUDA graph, matches the fp64 reference, and the
    arrival counters are zero after each (the fusion forced: the model decides it)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from cleave.runtime import launch as L
    from cleave.scheduler import combine

    monkeypatch.setattr(combine, "serial_tail", lambda *args, **kwargs: 0.0)

    env = {"b": 5, "hkv": 2, "g": 4, "L": 3001, "d": 64}
    plan = schedule(CANDIDATES["gqa_decode"](), env, dynamic={"b", "L"}, top_k=1, split={"sp": 24})[0]
    assert [bool(k.arrivals) for k in plan.kernels] == [True]
    graph_of = W.get("gqa_decode").graph
    for b, length in ((5, 3001), (64, 4099), (1, 777)):
        inputs = W.get("gqa_decode").inputs({**env, "b": b, "L": length}, seed=b)
        ref = interpret(graph_of, inputs, compute_dtype=torch.float64)[0]
        inputs = {k: v.cuda() for k, v in inputs.items()}
        first = launch(plan, inputs)[0].clone()
        assert ((first.double().cpu() - ref).norm() / ref.norm()).item() < 1e-2
        for _ in range(20):  # many launches: arrival orders differ, results must not
            assert torch.equal(launch(plan, inputs)[0], first)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = launch(plan, inputs)[0]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                captured = launch(plan, inputs)[0]
            for _ in range(3):
                graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(on_side, first) and torch.equal(captured, first)
        assert all(int(t.abs().sum()) == 0 for t in L._ARRIVALS.values())


def test_plans_are_ranked_with_the_l2_flushed_before_each_call():
    """profile.rank times each plan cold (a memset of twice the L2 before each captured
    call, its own time subtracted), as do_bench does: the call still computes its result
    inside the graph, and the flush buffer is sized from the device's L2."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from cleave.runtime import profile
    x = torch.randn(1 << 20, device="cuda")
    out = torch.empty_like(x)
    ms = profile.graph_ms(lambda: torch.mul(x, 2, out=out), cold=True)
    assert 0 < ms < 1e3
    assert torch.equal(out, x * 2)
    device = torch.cuda.current_device()
    assert profile._FLUSH[device].numel() * 4 == 2 * torch.cuda.get_device_properties(device).L2_cache_size
