"""What Triton's Gluon dialect reaches on a layer's GEMMs (issues 12 and 13): a
hand-written warp-specialised, persistent Hopper GEMM with a bias epilogue, timed
beside cuBLAS. A diagnostic, never cleave's output: cleave's kernels come from its
rules and scheduler. It answers whether a Gluon back end for the scheduler's GEMM
nests would close the gap the `tl` path leaves to cuBLAS where K is short (GPT-2's
projections at K = 768 ran at 360-540 TFLOP/s against cuBLAS's ~660; RESULTS.md,
sessions 19 and 44): cuBLAS's Hopper kernels keep a producer warp loading the next
tile while its consumer warpgroups run this tile's epilogue, which Triton 3.6's `tl`
path does not emit.

The kernel: one program per SM walks output tiles in grouped order. A loader
warpgroup streams A's and W's K slices through a ring of shared-memory stages by TMA;
two consumer warpgroups each hold half the tile's rows in a wgmma accumulator, free
each stage once its MMA is done, and store through TMA (the store of one tile drains
while the next tile's MMAs run). The ring does not restart between tiles, so the next
tile's loads are in flight during this tile's epilogue. y = x @ w.T (+ bias), x [M, K],
w [N, K] (an nn.Linear's weight) and y [M, N], bf16; M any, N and K multiples of 8.

On the GPU (from /tmp beside the installed wheel, as benchmarks/h200.sh does):

    python3 -m benchmarks.gluon_gemm                  # every variant and shape, a table
    python3 -m benchmarks.gluon_gemm --only r64n256   # some of them

and here, without a GPU (Triton compiles for sm_90 with the ptxas its wheel ships):

    python -m benchmarks.gluon_gemm --compile         # shared memory, registers, spills

Each variant runs in a process of its own with a time limit, so a kernel that hangs
(a barrier phase wrong) costs only its own rows.
"""
from __future__ import annotations

import argparse
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
LOADER_WARPS, LOADER_REGS, CONSUMER_REGS = gl.constexpr(4), gl.constexpr(24), gl.constexpr(232)
GROUP_M = gl.constexpr(8)  # tile rows per group of the grouped order: W's column tiles are reread from L2

# rows per consumer warpgroup (the tile holds two), tile columns, K step, ring stages
VARIANTS = {
    "r64n256": dict(rows=64, bn=256, bk=64, stages=3),
    "r128n128": dict(rows=128, bn=128, bk=64, stages=3),
    "r64n128": dict(rows=64, bn=128, bk=64, stages=5),
}
# (name, M, N, K): GPT-2 small at b8 s1024, Llama-3-8B at b1 s2048, a square GEMM
SHAPES = [
    ("gpt2 q/k/v", 8192, 2304, 768), ("gpt2 out", 8192, 768, 768), ("gpt2 up", 8192, 3072, 768),
    ("gpt2 down", 8192, 768, 3072), ("llama q/k/v", 2048, 6144, 4096), ("llama gate/up", 2048, 28672, 4096),
    ("llama down", 2048, 4096, 14336), ("square", 4096, 4096, 4096),
]


@gluon.jit
def _tile_of(tile, num_m, num_n):
    """The output tile a persistent step computes: grouped order, GROUP_M row tiles
    sweep each column tile before the next."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    size_m = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % size_m, (tile % per_group) // size_m


@gluon.jit
def _loader(a_desc, w_desc, a_smem, w_smem, ready, empty, M, N, K):
    STAGES: gl.constexpr = a_smem.type.shape[0]
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    nbytes: gl.constexpr = a_desc.block_type.nbytes + w_desc.block_type.nbytes
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    i = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(tile, num_m, num_n)
        for kk in range(gl.cdiv(K, BK)):
            st = i % STAGES
            mbarrier.wait(empty.index(st), ((i // STAGES) & 1) ^ 1)  # a fresh barrier's previous phase counts as done
            mbarrier.expect(ready.index(st), nbytes)
            tma_load(a_desc, [pid_m * BM, kk * BK], ready.index(st), a_smem.index(st))
            tma_load(w_desc, [pid_n * BN, kk * BK], ready.index(st), w_smem.index(st))
            i += 1


@gluon.jit
def _consumer(a_smem, w_smem, c_smem, ready, empty, c_desc, bias_ptr, M, N, K, WG: gl.constexpr):
    """Rows WG*ROWS .. of each tile: its MMAs, then bias, cast and TMA store."""
    STAGES: gl.constexpr = a_smem.type.shape[0]
    BM: gl.constexpr = a_smem.type.shape[1]
    BK: gl.constexpr = a_smem.type.shape[2]
    BN: gl.constexpr = w_smem.type.shape[1]
    ROWS: gl.constexpr = BM // 2
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    out = c_smem.index(WG)
    i = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(tile, num_m, num_n)
        acc = gl.zeros([ROWS, BN], gl.float32, layout)
        for kk in range(gl.cdiv(K, BK)):
            st = i % STAGES
            mbarrier.wait(ready.index(st), (i // STAGES) & 1)
            acc = warpgroup_mma(a_smem.index(st).slice(WG * ROWS, ROWS, dim=0), w_smem.index(st).permute((1, 0)),
                                acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc,))
            mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=kk > 0)  # the step before is done
            i += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1)
        cols = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        acc = acc + gl.expand_dims(gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32), 0)
        tma.store_wait(pendings=0)  # the tile before has left `out`
        out.store(acc.to(c_smem.dtype))
        fence_async_shared()
        tma_store(c_desc, [pid_m * BM + WG * ROWS, pid_n * BN], out)
    tma.store_wait(pendings=0)


@gluon.jit
def _consumer0(a_smem, w_smem, c_smem, ready, empty, c_desc, bias_ptr, M, N, K):
    _consumer(a_smem, w_smem, c_smem, ready, empty, c_desc, bias_ptr, M, N, K, 0)


@gluon.jit
def _consumer1(a_smem, w_smem, c_smem, ready, empty, c_desc, bias_ptr, M, N, K):
    _consumer(a_smem, w_smem, c_smem, ready, empty, c_desc, bias_ptr, M, N, K, 1)


@gluon.jit
def gemm_ws(a_desc, w_desc, c_desc, bias_ptr, M, N, K, STAGES: gl.constexpr):
    """Launch with num_warps=4 (the first consumer) on at most one program per SM."""
    dtype: gl.constexpr = a_desc.dtype
    a_smem = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    w_smem = gl.allocate_shared_memory(dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, [2] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # each consumer releases a stage
    fence_async_shared()
    args = (a_smem, w_smem, c_smem, ready, empty, c_desc, bias_ptr, M, N, K)
    gl.warp_specialize([
        (_consumer0, args),
        (_consumer1, args),
        (_loader, (a_desc, w_desc, a_smem, w_smem, ready, empty, M, N, K)),
    ], [4, LOADER_WARPS], [CONSUMER_REGS, LOADER_REGS])


def linear(x, w, bias, out, rows: int, bn: int, bk: int, stages: int, sms: int):
    """out = x @ w.T (+ bias) through gemm_ws. Without a bias it adds zeros: triton 3.6
    fails an assertion lowering a partition that takes a pointer it never reads."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    (M, K), (N, _) = x.shape, w.shape
    if K % 8 or N % 8 or not all(t.is_contiguous() for t in (x, w, out)):
        raise ValueError(f"gluon_gemm: N and K multiples of 8, contiguous tensors; got {M}x{N}x{K}")
    desc = lambda t, shape: TensorDescriptor.from_tensor(t, shape, gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16))
    bm = 2 * rows
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    bias = bias if bias is not None else x.new_zeros(N)
    gemm_ws[(min(sms, tiles),)](desc(x, [bm, bk]), desc(w, [bn, bk]), desc(out, [rows, bn]), bias, M, N, K, stages,
                                num_warps=4)
    return out


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def measure(variant: str, reps: int = 5) -> None:
    """Check one variant against fp64 at odd shapes (its output poisoned with NaN first),
    then time it beside cuBLAS (`F.linear`, bias in its epilogue) shape by shape,
    interleaved, `reps` rounds; prints table rows."""
    import torch
    import torch.nn.functional as F

    cfg = VARIANTS[variant]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    run = lambda x, w, b, o: linear(x, w, b, o, cfg["rows"], cfg["bn"], cfg["bk"], cfg["stages"], sms)
    torch.manual_seed(0)
    errors = []
    for M, N, K in [(1000, 776, 328), (77, 264, 1032), (4099, 1032, 64)]:
        x, w = torch.randn(M, K, device="cuda", dtype=torch.bfloat16), torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        for bias in (b, None):
            got = run(x, w, bias, torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16))
            want = x.double() @ w.double().T + (bias.double() if bias is not None else 0)
            errors.append(_rel(got, want))
    for name, M, N, K in SHAPES:
        x, w = torch.randn(M, K, device="cuda", dtype=torch.bfloat16), torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        b, o = torch.randn(N, device="cuda", dtype=torch.bfloat16), torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        against = _rel(run(x, w, b, o), F.linear(x, w, b))
        fns = {"gluon": lambda: run(x, w, b, o), "cuBLAS": lambda: F.linear(x, w, b)}
        times = {n: [] for n in fns}
        for _ in range(reps):
            for n, f in fns.items():
                times[n].append(triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median"))
        ours, theirs = statistics.median(times["gluon"]), statistics.median(times["cuBLAS"])
        flops = 2 * M * N * K
        print(f"| {variant} | {name} | {M}x{N}x{K} | {ours:.4f} | {theirs:.4f} | {theirs / ours:.2f} | "
              f"{flops / ours / 1e9:.0f} | {flops / theirs / 1e9:.0f} | {max(errors):.1e}; {against:.1e} from cuBLAS |",
              flush=True)


def compile_sm90(variant: str) -> dict:
    """One variant compiled for sm_90 without a GPU (gluon_diagnostic.sm90_usage)."""
    cfg = VARIANTS[variant]
    bm, bn, bk = 2 * cfg["rows"], cfg["bn"], cfg["bk"]
    desc = lambda r, c: f"tensordesc<bf16[{r}, {c}],{gl.NVMMASharedLayout.get_default_for([r, c], gl.bfloat16)!r}>"
    signature = {"a_desc": desc(bm, bk), "w_desc": desc(bn, bk), "c_desc": desc(cfg["rows"], bn), "bias_ptr": "*bf16",
                 "M": "i32", "N": "i32", "K": "i32", "STAGES": "constexpr"}
    return sm90_usage(gemm_ws, signature, {"STAGES": cfg["stages"]}, 4)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--compile", action="store_true", help="compile for sm_90 here (no GPU) and report resources")
    parser.add_argument("--one", choices=list(VARIANTS), help=argparse.SUPPRESS)  # a child process
    parser.add_argument("--seconds", type=float, default=150, help="time limit of each variant's process")
    args = parser.parse_args(argv)
    if args.one:
        measure(args.one)
        return 0
    if args.compile:
        print(f"triton {triton.__version__}, sm_90\n| variant | shared bytes | registers | local bytes | wgmma | "
              f"setmaxnreg |\n|---|---|---|---|---|---|")
        for variant in args.only:
            r = compile_sm90(variant)
            print(f"| {variant} | {r['shared']} | {r['regs']} | {r['local']} | {r['wgmma']} | {r['setmaxnreg']} |",
                  flush=True)
        return 0
    print("| variant | GEMM | M×N×K | Gluon ms | cuBLAS ms | × cuBLAS | Gluon TFLOP/s | cuBLAS TFLOP/s "
          "| rel. L2 error against fp64, odd shapes; at the timed shape |\n|---|---|---|---|---|---|---|---|---|",
          flush=True)
    run_each("benchmarks.gluon_gemm", args.only, args.seconds, 9)
    return 0


if __name__ == "__main__":
    sys.exit(main())
