"""Hopper codegen: operand tiles read through TMA descriptors (with the pointer path
as the fallback a call's unaligned tensors take), run under TRITON_INTERPRET=1 at
small shapes against the fp64 interpreter, into NaN-poisoned outputs."""
import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from cleave import workloads as W
from cleave.interpreter import interpret
from cleave.ir import parse_graph
from cleave.runtime import launch as L
from cleave.scheduler import H200, schedule
from cleave.search import search
from kernel_check import LOOPS, check_outputs

# One SM: the tiny test grids fill it, so the scheduler's rule gives them descriptors.
ONE_SM = dataclasses.replace(LOOPS, sms=1, tma_min_tile=16)
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def matmul(dtype: str):
    text = W.get("matmul").graph.text().replace("bf16", dtype).replace("graph matmul", f"graph matmul_{dtype}")
    return parse_graph(text)


@pytest.fixture
def descriptors_made(monkeypatch):
    """The buffers the launcher built a TensorDescriptor over, in order. One SM, as the
    scheduler's target has: the launcher then builds descriptors for these tiny grids."""
    monkeypatch.setattr(L, "INTERPRETER_SMS", 1)
    made, real = [], L.TensorDescriptor

    def spy(base, shape, strides, block):
        made.append(tuple(shape))
        return real(base, shape, strides, block)

    monkeypatch.setattr(L, "TensorDescriptor", spy)
    return made


def check(graph, plan, env, inputs):
    outs = [torch.full(tuple(r.shape), float("nan"), dtype=r.dtype) for r in interpret(graph, inputs)]
    got = L.launch(plan, inputs, out=outs)
    ref = interpret(graph, inputs, compute_dtype=torch.float64)
    check_outputs(got, ref, f"{graph.name} at {env}")


def inputs_for(env, dtype, offset=0):
    """x and w, `offset` elements past a 16-byte aligned address (offset 1: unaligned)."""
    def make(shape):
        flat = torch.randn(shape[0] * shape[1] + offset).to(dtype)
        return flat[offset:].view(shape)

    return {"x": make((env["s"], env["k"])), "w": make((env["k"], env["n"]))}


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_matmul_reads_tiles_through_descriptors(dtype, descriptors_made):
    env = {"s": 37, "k": 56, "n": 40}  # odd rows; rows of 16-byte multiples: TMA takes them
    plan = schedule(matmul(dtype), env, top_k=1, target=ONE_SM)[0]
    (kernel,) = plan.kernels
    assert {d[1] for d in kernel.descriptors} == {"x", "w"}
    assert "x_desc0.load(" in kernel.source and "TMA: tl.constexpr" in kernel.source
    check(matmul(dtype), plan, env, inputs_for(env, DTYPES[dtype]))
    assert sorted(descriptors_made) == [(37, 56), (56, 40)]


def test_a_launch_with_fewer_tiles_than_sms_takes_the_pointer_path(monkeypatch, descriptors_made):
    """The plan has descriptors, but a call whose grid is under the SMs (a decode step
    at batch 1) would spend more building them than it saves."""
    env = {"s": 37, "k": 56, "n": 40}
    plan = schedule(matmul("bf16"), env, dynamic={"s"}, top_k=1, target=ONE_SM)[0]
    assert plan.kernels[0].descriptors
    monkeypatch.setattr(L, "INTERPRETER_SMS", 4)
    small = {"s": 5, "k": 56, "n": 40}  # too few tiles for four SMs
    check(matmul("bf16"), plan, small, inputs_for(small, torch.bfloat16))
    assert descriptors_made == []


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_unaligned_strides_take_the_pointer_path(dtype, descriptors_made):
    env = {"s": 37, "k": 53, "n": 45}  # a row of 53 or 45 elements is no multiple of 16 bytes
    plan = schedule(matmul(dtype), env, top_k=1, target=ONE_SM)[0]
    assert plan.kernels[0].descriptors
    check(matmul(dtype), plan, env, inputs_for(env, DTYPES[dtype]))
    assert descriptors_made == []


def test_unaligned_base_takes_the_pointer_path(descriptors_made):
    env = {"s": 37, "k": 56, "n": 40}
    graph = matmul("bf16")
    plan = schedule(graph, env, top_k=1, target=ONE_SM)[0]
    check(graph, plan, env, inputs_for(env, torch.bfloat16, offset=1))
    assert descriptors_made == []
    check(graph, plan, env, inputs_for(env, torch.bfloat16))  # the same shapes, aligned: TMA
    assert len(descriptors_made) == 2


def test_attention_reads_q_k_v_through_descriptors_and_uses_exp2(descriptors_made):
    w = W.get("mha")
    env = {"b": 1, "h": 2, "s": 37, "d": 16}
    plan = schedule(w.graph, env, top_k=1, target=ONE_SM)[0]
    assert {d[1] for k in plan.kernels for d in k.descriptors} >= {"q", "k", "v"}
    sources = "".join(k.source for k in plan.kernels)
    assert "tl.exp2(" in sources and "tl.exp(" not in sources  # softmax's exp as exp2
    check(w.graph, plan, env, w.inputs(env, seed=1))
    assert (1, 2, 37, 16) in descriptors_made


def test_dynamic_attention_casts_tile_offsets_to_int32(descriptors_made):
    """A dynamic extent makes tile indices int64; TMA coordinates are int32."""
    w = W.get("mha")
    env = {"b": 1, "h": 2, "s": 37, "d": 16}
    plan = schedule(w.graph, env, dynamic={"s"}, top_k=1, target=ONE_SM)[0]
    for s in (21, 37):
        check(w.graph, plan, {**env, "s": s}, w.inputs({**env, "s": s}, seed=s))
    assert (1, 2, 21, 16) in descriptors_made


def test_decode_sized_grids_keep_pointer_loads():
    """The rule: a grid smaller than the SMs (a decode step) builds no descriptors."""
    plan = schedule(matmul("bf16"), {"s": 37, "k": 56, "n": 40}, top_k=1, target=LOOPS)[0]
    assert plan.kernels[0].descriptors == [] and "TMA" not in plan.kernels[0].source
    assert H200.sms > 1
    # a decode step's 16 padded query rows: too small a tile, at any grid
    decode = W.get("gqa_decode")
    split_kv = search(decode.graph, progress=False).best  # split-KV: 1000+ programs at b8
    plans = schedule(split_kv, decode.presets["b8_L8192"], top_k=2)
    assert all(p.split for p in plans) and not any(k.descriptors for p in plans for k in p.kernels)
    # over a dynamic axis the grid may fill the SMs at another shape: the launcher decides
    dynamic = schedule(matmul("bf16"), {"s": 37, "k": 56, "n": 40}, dynamic={"s"}, top_k=1, target=LOOPS)[0]
    assert dynamic.kernels[0].descriptors


def test_a_gather_index_is_never_read_through_a_descriptor():
    """A paged prefill's kv_indices tile addresses its k/v gather: the H200's pipeliner
    cannot predicate a descriptor load whose value forms addresses (Triton 3.6: "Fatal
    pipeliner error", RESULTS.md 2026-12-01 session 5), so index tiles keep pointers, also
    loaded before the loop (MLA's prefill read its kv_indices tile so in a kernel that
    takes descriptors)."""
    paged = W.get("mla_paged_prefill_causal_h16_ckv512_kpe64_ps1")
    result = search(paged.graph, progress=False)
    # the first candidate: the next two schedule the same index loads (10 s each, checked)
    sources = [k.source for p in schedule(result.candidates[0], paged.presets["h200"], top_k=3) for k in p.kernels]
    assert any("tl.load(kv_indices_ptr" in src for src in sources)
    assert not any("kv_indices_desc" in src for src in sources)


def test_persistent_programs_loop_over_tiles(monkeypatch, descriptors_made):
    """One program runs all nine tiles (3 x 3 of 64) of a tiled MatMul in turn."""
    env = {"s": 150, "k": 56, "n": 136}
    graph = matmul("bf16")
    plan = schedule(graph, env, top_k=1, target=ONE_SM)[0]
    (kernel,) = plan.kernels
    assert kernel.programs_per_sm >= 1 and "tl.range(tl.program_id(0), " in kernel.source
    kernel.programs_per_sm = 1
    monkeypatch.setattr(L, "INTERPRETER_SMS", 1)
    inputs = inputs_for(env, torch.bfloat16)
    check(graph, plan, env, inputs)
    (_, grid, _, _), = L.prepare(plan, inputs).kernels
    assert grid == (1, 1, 1) and descriptors_made


def test_persistent_grid_past_the_tiles_and_empty_extents(monkeypatch, descriptors_made):
    """More programs than tiles (the extra ones run no tile), an empty output (nothing
    is launched) and an empty contraction (zeros; no TMA over an empty dim)."""
    monkeypatch.setattr(L, "_programs", lambda k, tiles, sms: tiles + 3 if tiles else 0)
    graph = matmul("f32")
    plan = schedule(graph, {"s": 37, "k": 56, "n": 40}, dynamic=("s", "k"), top_k=1, target=ONE_SM)[0]
    assert plan.kernels[0].programs_per_sm and plan.kernels[0].descriptors
    for s, k in ((37, 56), (0, 56), (37, 0)):
        env = {"s": s, "k": k, "n": 40}
        check(graph, plan, env, inputs_for(env, torch.float32))
        if s == 37 and k == 56:  # dynamic extents: int64 tile indices, int32 TMA coordinates
            assert len(descriptors_made) == 2
    assert len(descriptors_made) == 2  # none over an empty dim


def test_a_tile_read_beside_its_dot_keeps_the_pointer_path():
    """RMSNorm->MatMul squares the x tile its dot reads, in the same pipelined loop: on
    the H200 (triton 3.6) that descriptor tile came out wrong, so only w, which the dot
    alone reads, goes through a descriptor; the result still matches fp64."""
    graph = W.get("rmsnorm_matmul").graph
    env = {"s": 37, "k": 64, "n": 48}
    plans = schedule(graph, env, top_k=4, target=ONE_SM)
    looped = [p for p in plans if any("for start" in k.source and "tl.dot(" in k.source for k in p.kernels)]
    assert looped
    for plan in looped:
        buffers = {d[1] for k in plan.kernels for d in k.descriptors}
        assert "x" not in buffers and "w" in buffers, buffers
    gen = torch.Generator().manual_seed(5)
    inputs = {name: torch.randn(*[env.get(str(d), d) for d in node.shape], generator=gen).to(torch.bfloat16)
              for name, node in graph.inputs.items()}
    check(graph, looped[0], env, inputs)


def test_persistent_kernels_count_the_epilogue_beside_the_stages():
    """A persistent GEMM's next-tile loads are in flight during its epilogue. On the H200
    a 128x256 tile at 4 stages fit with full tiles stored as they are, but asked for 256
    KiB (of 227) with a masked store (dynamic rows): the model counts the stored tile."""
    import re

    def grid_blocks(k):
        return sorted(int(b) for b in re.findall(r"# X\d+: extent \w+, grid, block (\d+)", k.source) if int(b) > 1)

    env = {"s": 4096, "k": 4096, "n": 4096}
    for plan in schedule(matmul("bf16"), env, dynamic={"s"}, top_k=4):
        for k in plan.kernels:
            if k.programs_per_sm and grid_blocks(k) == [128, 256]:
                assert k.num_stages <= 3, k.num_stages
    # SwiGLU's pair of accumulators, a residual read in the epilogue: not persistent
    swiglu = W.get("swiglu")
    residual = parse_graph("""graph residual {
  %0 = input(name="x", shape=[s,k], dtype=bf16) : bf16[s,k]
  %1 = input(name="w", shape=[k,n], dtype=bf16) : bf16[k,n]
  %2 = input(name="r", shape=[s,n], dtype=bf16) : bf16[s,n]
  %3 = matmul(%0, %1) : bf16[s,n]
  %4 = add(%2, %3) : bf16[s,n]
  return y=%4
}""")
    for graph, at in ((swiglu.graph, swiglu.presets["s4096"]), (residual, env)):
        assert not any(k.programs_per_sm for p in schedule(graph, at, top_k=4) for k in p.kernels)


def test_a_kernel_over_the_gpus_shared_memory_runs_with_fewer_stages():
    """Where the model's estimate is short, the launcher drops a stage at a time (with a
    warning) and keeps the stages that fit for later calls."""
    from triton.runtime.errors import OutOfResources

    tried = []

    class Fn:
        def __getitem__(self, grid):
            def launch(*values, num_stages, num_warps):
                tried.append(num_stages)
                if num_stages > 2:
                    raise OutOfResources(num_stages * 100_000, 232_448, "shared memory")
                return "compiled"
            return launch

    options = {"num_warps": 8, "num_stages": 4}
    with pytest.warns(L.SharedMemoryWarning, match="running it with 2"):
        assert L._jit_launch(Fn(), (1, 1, 1), [], options, "k0") == "compiled"
    assert tried == [4, 3, 2] and options["num_stages"] == 2


def test_an_intermediate_passed_as_an_address_gets_its_typed_view(descriptors_made):
    """On the GPU's direct launch path intermediates are workspace addresses; a
    descriptor over one is built on that intermediate's typed view alone."""
    from types import SimpleNamespace

    workspace = torch.zeros(1024, dtype=torch.uint8)
    prepared = SimpleNamespace(intermediates=[("t1", 0, [4, 8], torch.float32), ("t2", 256, [16, 16], torch.bfloat16)])
    tma = (True, [(0, "t2", [16, 16], [16, 1], [16, 16])], L.TensorDescriptor)
    values = L._with_descriptors(tma, [None], {"t2": workspace.data_ptr() + 256}, True, prepared, workspace)
    desc, use = values
    assert use and descriptors_made == [(16, 16)]
    assert desc.base.dtype == torch.bfloat16 and desc.base.data_ptr() == workspace.data_ptr() + 256


def test_a_direct_launch_reuses_its_descriptors_per_address_and_holds_no_tensor(descriptors_made):
    """A compiled kernel launched directly keeps the descriptors it built: the next call on
    the same buffers builds none (three per attention call were a third of its host
    time), one on another buffer builds that one, and no kept descriptor keeps the
    caller's tensor alive."""
    import weakref
    from types import SimpleNamespace

    prepared = SimpleNamespace(intermediates=[])
    tma = (True, [(0, "q", [8, 32], [32, 1], [8, 32]), (1, "k", [8, 32], [32, 1], [8, 32])], L.TensorDescriptor)
    q, k = torch.randn(8, 32), torch.randn(8, 32)
    kept = {}
    first = L._with_descriptors(tma, [None, None], {"q": q, "k": k}, True, prepared, None, kept)
    again = L._with_descriptors(tma, [None, None], {"q": q, "k": k}, True, prepared, None, kept)
    assert descriptors_made == [(8, 32), (8, 32)] and again[0] is first[0] and again[1] is first[1]
    assert [d.base.data_ptr() for d in first[:2]] == [q.data_ptr(), k.data_ptr()]
    assert first[0].base.dtype == torch.float32 and first[2] is True

    other = torch.randn(8, 32)
    moved = L._with_descriptors(tma, [None, None], {"q": q, "k": other}, True, prepared, None, kept)
    assert len(descriptors_made) == 3 and moved[0] is first[0] and moved[1].base.data_ptr() == other.data_ptr()
    gone = weakref.ref(other)
    del other, moved
    assert gone() is None  # the kept descriptor holds an address, not the tensor

    unaligned = L._with_descriptors(tma, [None, None], {"q": q, "k": k}, False, prepared, None, kept)
    assert unaligned == [None, None, False]
