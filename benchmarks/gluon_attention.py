"""What Triton's Gluon dialect reaches on the attention mainloop (issue 13, build item 2):
hand-written Hopper kernels, timed beside cuDNN's SDPA. A diagnostic, never cleave's
output: cleave's kernels come from its rules and scheduler (`tl` only). It answers
whether a Gluon back end behind the scheduler would close the gap the `tl` path leaves
to cuDNN, and which of Hopper's techniques it would have to emit.

Written for the device's triton 3.6 Gluon API (and compiled for sm_90 here by the
CPU test under later Triton, which renamed its TMA copies). bf16, head dim 128, sequence length a multiple of 128; one
program per 128-row q tile, causal programs heaviest first. Variants:

- `plain`: 8 warps (two warpgroups of 64 rows), K and V in two-stage TMA rings issued
  by the compute warps; tile j+1's QK^T is issued (async wgmma) before tile j's softmax,
  and tile j's P.V is left in flight while the next scores are awaited.
- `ws2`, `ws3`: the same schedule with the loads in a worker warpgroup (24 registers)
  released through "empty" mbarriers; 2 or 3 stages.
- `pp2`, `pp3`: warp-specialised ping-pong, as FlashAttention-3 schedules Hopper: two
  consumer warpgroups of 64 rows each issue both MMAs of a step on their turn, hand the
  turn to the other, and run their softmax while the other's MMAs do.

On the GPU (run from /tmp beside the installed wheel, as benchmarks/h200.sh does):

    python3 -m benchmarks.gluon_attention                 # every variant, a table
    python3 -m benchmarks.gluon_attention --only pp2 ws2  # some of them

and here, without a GPU (Triton compiles for sm_90 with the ptxas its wheel ships):

    python -m benchmarks.gluon_attention --compile        # shared memory, registers, spills

Each variant runs in a process of its own with a time limit, so a kernel that hangs
(a barrier phase wrong) costs only its own row. Results: RESULTS.md, session 37.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from benchmarks.gluon_diagnostic import run_each, sm90_usage

# Triton after 3.6 renamed the TMA copies (async_load / async_store); the device has 3.6.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
LOADER_WARPS = gl.constexpr(4)
LOADER_REGS = gl.constexpr(24)
VARIANTS = {"plain": {}, "ws2": {"ws": True}, "ws3": {"ws": True, "stages": 3},
            "pp2": {"pingpong": True}, "pp3": {"pingpong": True, "stages": 3}}


@gluon.jit
def _program_tile(q_desc, k_desc, S, CAUSAL: gl.constexpr):
    """This program's q tile (the longest causal rows first): its row in the flattened
    [B·H·S, D] tensors, its head's first kv row, and how many kv tiles it reads."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    pid_m = S // BM - 1 - gl.program_id(0)
    bh = gl.program_id(1)
    if CAUSAL:
        n_kv = pid_m + 1
    else:
        n_kv = S // BN
    return bh * S + pid_m * BM, bh * S, n_kv


@gluon.jit
def _kv_rings(k_desc, v_desc, STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """K and V rings of STAGES tiles with their "ready" barriers (a TMA completes them)
    and "empty" ones (each of CONSUMERS warpgroups arrives once it is done with a tile)."""
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    return k_smem, v_smem, k_ready, v_ready, k_empty, v_empty


@gluon.jit
def _softmax_state(BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, layout: gl.constexpr):
    """A row tile's running max and sum, its output accumulator, and the zero scores
    each QK^T starts from."""
    row: gl.constexpr = gl.SliceLayout(1, layout)
    return (gl.full([BM], float("-inf"), gl.float32, layout=row), gl.full([BM], 0.0, gl.float32, layout=row),
            gl.zeros([BM, D], gl.float32, layout=layout), gl.zeros([BM, BN], gl.float32, layout=layout))


@gluon.jit
def _online_step(s2, m_i, l_i):
    """The online softmax's step over base-2 scores s2: (p, the rescale of what came
    before, the new running max, the new running sum)."""
    m_new = gl.maximum(m_i, gl.max(s2, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s2 - gl.expand_dims(m_new, 1))
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _scores_softmax(s, m_i, l_i, qk_scale, MASK: gl.constexpr, layout: gl.constexpr,
                    BM: gl.constexpr, BN: gl.constexpr):
    """One tile's online-softmax step in base 2; MASK keeps the diagonal tile's rows >= cols."""
    s2 = s * qk_scale
    if MASK:
        rows = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        keep = gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)
        s2 = gl.where(keep, s2, float("-inf"))
    return _online_step(s2, m_i, l_i)


@gluon.jit
def attn_fwd(q_desc, k_desc, v_desc, o_desc, qk_scale, S, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """`plain`: one partition of 8 warps issues the loads and both MMAs itself."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    dtype: gl.constexpr = q_desc.dtype
    gl.static_assert(BM == BN)
    gl.static_assert(BN == D)

    q_row, kv_row, n_kv = _program_tile(q_desc, k_desc, S, CAUSAL)

    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BN, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=layout, k_width=2)

    q_smem = gl.allocate_shared_memory(dtype, [BM, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [2, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, BN, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)
    fence_async_shared()

    kv_bytes: gl.constexpr = k_desc.block_type.nbytes
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    for i in gl.static_range(2):
        has = i < n_kv
        mbarrier.expect(k_bar.index(i), kv_bytes, pred=has)
        tma_load(k_desc, [kv_row + i * BN, 0], k_bar.index(i), k_smem.index(i), pred=has)
        mbarrier.expect(v_bar.index(i), kv_bytes, pred=has)
        tma_load(v_desc, [kv_row + i * BN, 0], v_bar.index(i), v_smem.index(i), pred=has)

    m_i, l_i, o, zero_s = _softmax_state(BM, BN, D, layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bar.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    has = 2 < n_kv  # K0 consumed: K2 into its stage
    mbarrier.expect(k_bar.index(0), kv_bytes, pred=has)
    tma_load(k_desc, [kv_row + 2 * BN, 0], k_bar.index(0), k_smem.index(0), pred=has)

    for j in range(0, n_kv - 1):
        stage = j % 2
        nxt = (j + 1) % 2
        mbarrier.wait(k_bar.index(nxt), ((j + 1) // 2) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(nxt).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        p, alpha, m_i, l_i = _scores_softmax(s, m_i, l_i, qk_scale, False, layout, BM, BN)
        o = warpgroup_mma_wait(1, deps=(o,))  # P.V of tile j-1 done: its V stage is free
        has = (j >= 1) & (j + 1 < n_kv)
        mbarrier.expect(v_bar.index(nxt), kv_bytes, pred=has)
        tma_load(v_desc, [kv_row + (j + 1) * BN, 0], v_bar.index(nxt), v_smem.index(nxt), pred=has)
        o = o * gl.expand_dims(alpha, 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(v_bar.index(stage), (j // 2) & 1)
        o_tok = warpgroup_mma(p_op, v_smem.index(stage), o, is_async=True)
        s, o = warpgroup_mma_wait(1, deps=(s_tok, o_tok))  # scores of tile j+1 ready; P.V in flight
        has = j + 3 < n_kv  # K of tile j+1 consumed: tile j+3 into its stage
        mbarrier.expect(k_bar.index(nxt), kv_bytes, pred=has)
        tma_load(k_desc, [kv_row + (j + 3) * BN, 0], k_bar.index(nxt), k_smem.index(nxt), pred=has)

    last = n_kv - 1
    p, alpha, m_i, l_i = _scores_softmax(s, m_i, l_i, qk_scale, CAUSAL, layout, BM, BN)
    o = warpgroup_mma_wait(0, deps=(o,))
    o = o * gl.expand_dims(alpha, 1)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    mbarrier.wait(v_bar.index(last % 2), (last // 2) & 1)
    o_tok = warpgroup_mma(p_op, v_smem.index(last % 2), o, is_async=True)
    o = warpgroup_mma_wait(0, deps=(o_tok,))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(2):
        mbarrier.invalidate(k_bar.index(i))
        mbarrier.invalidate(v_bar.index(i))
    o = o / gl.expand_dims(l_i, 1)
    q_smem.store(o.to(dtype))  # every QK^T is done: q's tile holds the output
    fence_async_shared()
    tma_store(o_desc, [q_row, 0], q_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _ws_loader(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv_row, n_kv):
    STAGES: gl.constexpr = k_smem.type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    nbytes: gl.constexpr = k_desc.block_type.nbytes
    for j in range(n_kv):
        st = j % STAGES
        ph = (j // STAGES) & 1
        mbarrier.wait(k_empty.index(st), ph ^ 1)  # a fresh barrier's previous phase counts as done
        mbarrier.expect(k_ready.index(st), nbytes)
        tma_load(k_desc, [kv_row + j * BN, 0], k_ready.index(st), k_smem.index(st))
        mbarrier.wait(v_empty.index(st), ph ^ 1)
        mbarrier.expect(v_ready.index(st), nbytes)
        tma_load(v_desc, [kv_row + j * BN, 0], v_ready.index(st), v_smem.index(st))


@gluon.jit
def _ws_compute(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, n_kv, qk_scale,
                CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                dtype: gl.constexpr, num_warps: gl.constexpr):
    STAGES: gl.constexpr = k_smem.type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BN, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=layout, k_width=2)
    m_i, l_i, o, zero_s = _softmax_state(BM, BN, D, layout)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    mbarrier.arrive(k_empty.index(0), count=1)
    for j in range(0, n_kv - 1):
        stage = j % STAGES
        nxt = (j + 1) % STAGES
        prev = (j + STAGES - 1) % STAGES
        mbarrier.wait(k_ready.index(nxt), ((j + 1) // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(nxt).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        p, alpha, m_i, l_i = _scores_softmax(s, m_i, l_i, qk_scale, False, layout, BM, BN)
        o = warpgroup_mma_wait(1, deps=(o,))
        mbarrier.arrive(v_empty.index(prev), count=1, pred=j >= 1)  # P.V of tile j-1 done
        o = o * gl.expand_dims(alpha, 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(v_ready.index(stage), (j // STAGES) & 1)
        o_tok = warpgroup_mma(p_op, v_smem.index(stage), o, is_async=True)
        s, o = warpgroup_mma_wait(1, deps=(s_tok, o_tok))
        mbarrier.arrive(k_empty.index(nxt), count=1)
    last = n_kv - 1
    p, alpha, m_i, l_i = _scores_softmax(s, m_i, l_i, qk_scale, CAUSAL, layout, BM, BN)
    o = warpgroup_mma_wait(0, deps=(o,))
    o = o * gl.expand_dims(alpha, 1)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    o_tok = warpgroup_mma(p_op, v_smem.index(last % STAGES), o, is_async=True)
    o = warpgroup_mma_wait(0, deps=(o_tok,))
    return (o / gl.expand_dims(l_i, 1),)


@gluon.jit
def attn_fwd_ws(q_desc, k_desc, v_desc, o_desc, qk_scale, S, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                num_warps: gl.constexpr):
    """`ws2`, `ws3`: the same schedule with the K/V loads in a worker warpgroup, released by the compute warps."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    dtype: gl.constexpr = q_desc.dtype
    q_row, kv_row, n_kv = _program_tile(q_desc, k_desc, S, CAUSAL)
    q_smem = gl.allocate_shared_memory(dtype, [BM, D], q_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = _kv_rings(k_desc, v_desc, STAGES, 1)
    fence_async_shared()
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    o, = gl.warp_specialize([
        (_ws_compute, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, n_kv, qk_scale,
                       CAUSAL, BM, BN, D, dtype, num_warps)),
        (_ws_loader, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv_row, n_kv)),
    ], [LOADER_WARPS], [LOADER_REGS])
    q_smem.store(o.to(dtype))
    fence_async_shared()
    tma_store(o_desc, [q_row, 0], q_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _pp_softmax(s, m_i, l_i, qk_scale, keep_all, ROW0: gl.constexpr, layout: gl.constexpr):
    """A tile's softmax step; rows >= cols is kept unless keep_all (a runtime flag)."""
    BM: gl.constexpr = s.type.shape[0]
    BN: gl.constexpr = s.type.shape[1]
    rows = ROW0 + gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
    keep = (gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)) | keep_all
    return _online_step(gl.where(keep, s * qk_scale, float("-inf")), m_i, l_i)


@gluon.jit
def _pp_body(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, my_turn, other_turn,
             o_desc, q_row, n_kv, last_masked, qk_scale, WG: gl.constexpr):
    """One consumer warpgroup: rows WG*64 .. WG*64+63 of the q tile. Its tensor-core work
    (QK of the next tile, P.V of this one) is issued on its turn, handed to the other
    warpgroup after issuing; its softmax runs while the other's MMAs do."""
    STAGES: gl.constexpr = k_smem.type.shape[0]
    BN: gl.constexpr = k_smem.type.shape[1]
    D: gl.constexpr = k_smem.type.shape[2]
    BM: gl.constexpr = 64
    dtype: gl.constexpr = k_smem.dtype
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=layout, k_width=2)
    q_half = q_smem.slice(WG * BM, BM, dim=0)
    m_i, l_i, o, zero_s = _softmax_state(BM, BN, D, layout)
    turn_phase = 1 - WG  # warpgroup 0 goes first: a fresh barrier's previous phase counts as done

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q_half, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    mbarrier.arrive(k_empty.index(0), count=1)
    p, alpha, m_i, l_i = _pp_softmax(s, m_i, l_i, qk_scale, n_kv > 1 or not last_masked, WG * BM, layout)
    for j in range(0, n_kv - 1):
        stage = j % STAGES
        nxt = (j + 1) % STAGES
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(k_ready.index(nxt), ((j + 1) // STAGES) & 1)
        mbarrier.wait(v_ready.index(stage), (j // STAGES) & 1)
        mbarrier.wait(my_turn, turn_phase)
        turn_phase ^= 1
        s_tok = warpgroup_mma(q_half, k_smem.index(nxt).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        o_tok = warpgroup_mma(p_op, v_smem.index(stage), o, is_async=True)
        mbarrier.arrive(other_turn, count=1)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(nxt), count=1)
        p, alpha, m_i, l_i = _pp_softmax(s, m_i, l_i, qk_scale, (j + 2 < n_kv) or not last_masked, WG * BM, layout)
        o = warpgroup_mma_wait(0, deps=(o_tok,))
        mbarrier.arrive(v_empty.index(stage), count=1)
        o = o * gl.expand_dims(alpha, 1)
    last = n_kv - 1
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    mbarrier.wait(my_turn, turn_phase)
    o_tok = warpgroup_mma(p_op, v_smem.index(last % STAGES), o, is_async=True)
    mbarrier.arrive(other_turn, count=1)
    o = warpgroup_mma_wait(0, deps=(o_tok,))
    o = o / gl.expand_dims(l_i, 1)
    q_half.store(o.to(dtype))  # this warpgroup's QKs are done: its half of q's tile holds its output
    fence_async_shared()
    tma_store(o_desc, [q_row + WG * BM, 0], q_half)
    tma.store_wait(pendings=0)


@gluon.jit
def _pp_wg0(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn0, turn1, o_desc, q_row, n_kv,
            last_masked, qk_scale):
    _pp_body(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn0, turn1, o_desc, q_row, n_kv,
             last_masked, qk_scale, 0)


@gluon.jit
def _pp_wg1(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn0, turn1, o_desc, q_row, n_kv,
            last_masked, qk_scale):
    _pp_body(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn1, turn0, o_desc, q_row, n_kv,
             last_masked, qk_scale, 1)


@gluon.jit
def attn_fwd_pp(q_desc, k_desc, v_desc, o_desc, qk_scale, S, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """Warp-specialised with ping-pong: two consumer warpgroups of 64 rows take turns on the
    tensor cores; a loader warpgroup streams K and V. Launch with num_warps=4."""
    q_row, kv_row, n_kv = _program_tile(q_desc, k_desc, S, CAUSAL)
    last_masked = gl.to_tensor(CAUSAL)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    turn0 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    turn1 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(turn0, count=1)
    mbarrier.init(turn1, count=1)
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = _kv_rings(k_desc, v_desc, STAGES, 2)
    fence_async_shared()
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    args = (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn0, turn1, o_desc, q_row, n_kv,
            last_masked, qk_scale)
    gl.warp_specialize([
        (_pp_wg0, args),
        (_pp_wg1, args),
        (_ws_loader, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv_row, n_kv)),
    ], [4, LOADER_WARPS], [240, LOADER_REGS])



def attention(q, k, v, causal: bool, o, ws: bool = False, stages: int = 2, pingpong: bool = False):
    """o = softmax(q k^T / sqrt(d)) v for q, k, v, o [B, H, S, 128] bf16, contiguous."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    B, H, S, D = q.shape
    if D != 128 or S % 128 or not all(t.is_contiguous() for t in (q, k, v, o)):
        raise ValueError(f"gluon_attention: head dim 128, S a multiple of 128, contiguous tensors; got {tuple(q.shape)}")
    layout = gl.NVMMASharedLayout.get_default_for([128, D], gl.bfloat16)
    rows = lambda t, block: TensorDescriptor.from_tensor(t.reshape(B * H * S, D), [block, D], layout)
    qd, kd, vd = rows(q, 128), rows(k, 128), rows(v, 128)
    scale = 1 / math.log(2.0) / math.sqrt(D)  # scores in base 2
    grid = (S // 128, B * H)
    if pingpong:  # each consumer warpgroup stores its own 64 rows
        attn_fwd_pp[grid](qd, kd, vd, rows(o, 64), scale, S, causal, stages, num_warps=4)
    elif ws:
        attn_fwd_ws[grid](qd, kd, vd, rows(o, 128), scale, S, causal, stages, num_warps=8)
    else:
        attn_fwd[grid](qd, kd, vd, rows(o, 128), scale, S, causal, num_warps=8)
    return o


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def measure(variant: str, B=4, H=32, S=4096, reps: int = 5) -> None:
    """Check one variant against fp64 SDPA at small shapes (its output poisoned with NaN
    first), then time it and cuDNN's SDPA interleaved, `reps` rounds; prints table rows."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn(q, k, v, causal):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    opts = VARIANTS[variant]
    torch.manual_seed(0)
    errors, yardstick = [], []
    for shape in [(1, 2, 128, 128), (2, 3, 384, 128), (1, 2, 1024, 128)]:
        for causal in (True, False):
            q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            o = attention(q, k, v, causal, torch.full_like(q, float("nan")), **opts)
            ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
            errors.append(_rel(o, ref))
            yardstick.append(_rel(cudnn(q, k, v, causal), ref))
    q, k, v = (torch.randn(B, H, S, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    for causal in (True, False):
        fns = {variant: lambda: attention(q, k, v, causal, o, **opts), "cuDNN": lambda: cudnn(q, k, v, causal)}
        against = _rel(attention(q, k, v, causal, o, **opts), cudnn(q, k, v, causal))
        times = {n: [] for n in fns}
        for _ in range(reps):
            for n, f in fns.items():
                times[n].append(triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median"))
        flops = 4 * B * H * S * S * 128 / (2 if causal else 1)
        ours, theirs = statistics.median(times[variant]), statistics.median(times["cuDNN"])
        print(f"| {variant} | {'causal' if causal else 'full'} | {ours:.4f} | {theirs:.4f} | {theirs / ours:.2f} | "
              f"{flops / ours / 1e12:.0f} | {min(times[variant]):.4f}–{max(times[variant]):.4f} | "
              f"{max(errors):.1e} (cuDNN {max(yardstick):.1e}); {against:.1e} from cuDNN |", flush=True)


def compile_sm90(variant: str, causal: bool) -> dict:
    """One variant compiled for sm_90 without a GPU (gluon_diagnostic.sm90_usage)."""
    opts = VARIANTS[variant]
    layout = gl.NVMMASharedLayout.get_default_for([128, 128], gl.bfloat16)
    desc = lambda rows: f"tensordesc<bf16[{rows}, 128],{layout!r}>"
    signature = {"q_desc": desc(128), "k_desc": desc(128), "v_desc": desc(128), "o_desc": desc(128),
                 "qk_scale": "fp32", "S": "i32", "CAUSAL": "constexpr"}
    constants = {"CAUSAL": causal}
    if opts.get("pingpong"):
        fn, warps = attn_fwd_pp, 4
        signature.update(o_desc=desc(64), STAGES="constexpr")
        constants["STAGES"] = opts.get("stages", 2)
    elif opts.get("ws"):
        fn, warps = attn_fwd_ws, 8
        signature.update(STAGES="constexpr", num_warps="constexpr")
        constants.update(STAGES=opts.get("stages", 2), num_warps=8)
    else:
        fn, warps = attn_fwd, 8
        signature["num_warps"], constants["num_warps"] = "constexpr", 8
    return sm90_usage(fn, signature, constants, warps)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--compile", action="store_true", help="compile for sm_90 here (no GPU) and report resources")
    parser.add_argument("--one", choices=list(VARIANTS), help=argparse.SUPPRESS)  # a child process
    parser.add_argument("--seconds", type=float, default=120, help="time limit of each variant's process")
    args = parser.parse_args(argv)
    if args.one:
        measure(args.one)
        return 0
    if args.compile:
        print(f"triton {triton.__version__}, sm_90\n| variant | mask | shared bytes | registers | local bytes | wgmma | "
              f"setmaxnreg |\n|---|---|---|---|---|---|---|")
        for variant in args.only:
            for causal in (True, False):
                r = compile_sm90(variant, causal)
                print(f"| {variant} | {'causal' if causal else 'full'} | {r['shared']} | {r['regs']} | {r['local']} | "
                      f"{r['wgmma']} | {r['setmaxnreg']} |", flush=True)
        return 0
    print("| variant | mask | ms | cuDNN ms | × cuDNN | TFLOP/s | spread (ms) | rel. L2 error against fp64, small "
          "shapes; at the timed shape |\n|---|---|---|---|---|---|---|---|", flush=True)
    run_each("benchmarks.gluon_attention", args.only, args.seconds, 8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
