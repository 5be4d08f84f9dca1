"""The analytical cost model, per kernel: tensor-core time (flops weighted by the
tile shape's efficiency, quantised in waves over the SMs; contractions off the tensor
cores at the vector rate), memory time (bytes a
buffer is re-read beyond its size come from L2; the bandwidth reached is bounded by
the bytes in flight, Little's law) and a latency per wave of programs. Plans over
the shared-memory or register budget are rejected. A persistent kernel (a tiled
MatMul's tile loop) does the same tiles' work as one program per tile: it is costed
as that, with `programs` the number of tiles. TMA loads are not modelled apart:
the same bytes move (the scheduler's rule, not the cost, decides where they are used)."""
from __future__ import annotations

from .kernel_stats import Stats

LATENCY = 1e-6  # s: the floor of one program's run
LOADED_LATENCY = 3e-6  # s: DRAM latency under load; a program streams its bytes in flight per latency
# s: one step of a loop Triton does not pipeline (no tl.dot), its loads then their use
# (a split's combine on the H200, one program per SM: 1.5-1.8 us a step)
UNPIPELINED_STEP = 1.5e-6
WARPS_PER_SM = 64
# Resident warps an SM needs to stream at its share of DRAM bandwidth (H200 diagnostic,
# GQA decode at b=64: two programs of 2 warps per SM read 17% slower than two of 4;
# RESULTS.md, session 3 diagnostics).
WARPS_TO_STREAM = 6
# A loop step whose largest tile leaves each thread fewer elements than this spends its
# time in cross-warp reductions (same diagnostic: a 32-row K tile over 8 warps read 23%
# slower than over 4).
MIN_TILE_PER_THREAD = 32
THIN_TILE_PENALTY = 1.25
REGS_PER_SM = 64 * 1024
MAX_REGISTERS = 255  # a thread's


def resident_programs(stats: Stats, num_warps: int, num_stages: int, target) -> int:
    """Programs one SM holds at once (shared memory, warps, registers): a persistent
    kernel launches this many per SM."""
    threads = 32 * num_warps
    regs = 32 + (stats.acc_elems + 1.5 * stats.tile_elems) / threads
    return max(1, min(target.smem_per_block // max(stats.smem(num_stages), 1), WARPS_PER_SM // num_warps,
                      REGS_PER_SM // int(regs * threads)))


def registers(stats: Stats, num_warps: int) -> float:
    """Registers per thread: fp32 accumulators and the loop's largest tile (with its
    low-precision copy), plus addressing; outside the loops, the largest tile alone (the
    epilogue takes the accumulators' registers: MLA's 64 x 512 one fits 8 warps, counted
    once)."""
    return 32 + max(stats.acc_elems + 1.5 * stats.loop_elems, 1.5 * stats.tile_elems) / (32 * num_warps)


def misfit(stats: Stats, num_warps: int, num_stages: int, target) -> str | None:
    """Why the tiles do not fit the target at this launch, or None where they do."""
    smem = stats.smem(num_stages)
    if smem > target.smem_per_block:
        return (f"{smem} bytes of shared memory at {num_stages} stage(s), over the {target.name}'s "
                f"{target.smem_per_block} a block")
    regs = registers(stats, num_warps)
    if regs > MAX_REGISTERS:
        return (f"{regs:.0f} registers a thread at {num_warps} warps (its largest tile {stats.tile_elems} "
                f"elements, accumulators {stats.acc_elems}), over {MAX_REGISTERS}")
    return None


def kernel_time(stats: Stats, programs: int, num_warps: int, num_stages: int, target) -> float | None:
    """Seconds, or None when the tile does not fit the target (misfit)."""
    if misfit(stats, num_warps, num_stages, target):
        return None
    threads = 32 * num_warps
    if programs == 0:  # an empty output or intermediate: launch skips the kernel
        return 0.0
    if stats.active < 1:  # only these programs work; the others exit at their empty bounds
        programs, stats = max(1, round(programs * stats.active)), stats.of_active()
    per_sm = resident_programs(stats, num_warps, num_stages, target)
    slots = target.sms * per_sm
    waves = -(-programs // slots)
    # Tensor cores: each SM's programs share its peak; the last wave may leave SMs idle.
    busy = programs / (waves * slots)
    t_mma = stats.mma_flops * programs / (target.matmul_flops * busy)
    # A contraction off the tensor cores (operands too small or 3-d: a broadcast product
    # summed over K) runs on the vector units, ~13x slower.
    t_mma += stats.vector_flops * programs / (target.vector_flops * busy)
    # Memory: a buffer's first read comes from DRAM, re-reads (other programs' tiles) from L2.
    # One program streams at about an SM's fair share of DRAM bandwidth (measured: 8
    # programs reached 6% of the copy rate), two co-resident ones at twice that; the
    # busiest SM runs ceil(programs / SMs) of them.
    total = stats.bytes * programs
    dram = sum(min(b * programs, stats.footprint[n]) for n, b in stats.per_buffer.items())
    on_busiest = -(-programs // target.sms)
    fair = target.bandwidth / target.sms
    # Tiles in flight (Stats.in_flight) per latency. A loop Triton does not pipeline (no
    # tl.dot) moves one step's tile per UNPIPELINED_STEP.
    pipelined = stats.pipelined or not stats.stage_smem
    per_program = (stats.in_flight(num_stages) or stats.bytes) / LOADED_LATENCY \
        if pipelined else sum(stats.stage_smem.values()) / UNPIPELINED_STEP
    resident = min(on_busiest, per_sm)
    rate = min(2 * fair, resident * min(fair, per_program),
               resident * num_warps * fair / WARPS_TO_STREAM)
    t_busiest = on_busiest * dram / programs / rate
    # A loop around an inner loop is not pipelined: each of its steps waits for its loads
    # (their latency and their transfer at the SM's share of bandwidth), and programs
    # sharing an SM wait in turn (MLA paged decode, 64-key steps, 4 chunks a request:
    # 0.193 ms with its 512-wide contraction in 64-column steps, each key step then
    # loading its 64 x 512 value tile unpipelined, against 0.103 with the contraction
    # whole; RESULTS.md session 26).
    if stats.pipelined:
        t_busiest += on_busiest / resident * stats.outer_steps * (UNPIPELINED_STEP + stats.outer_step_bytes / fair)
    # Every tile also crosses L2 into shared memory: small tiles re-read more.
    t_mem = max(dram / target.bandwidth, t_busiest, total / target.l2_bandwidth)
    # Deeper software pipelines hide more of each loop step's load latency.
    pipeline = 1 + 0.2 / num_stages if stats.stage_smem else 1.0
    if stats.stage_smem and stats.tile_elems < MIN_TILE_PER_THREAD * threads:
        pipeline *= THIN_TILE_PENALTY
    # A single-stage loop waits for each step's loads before computing on them: unless
    # another program on its SM fills that wait, its memory and compute time add up
    # (MLA decode on the H200: 128-key steps in one stage took 0.33 ms, 64-key steps in
    # two 0.26, where the overlapped estimate ranked them the other way).
    serial = stats.pipelined and num_stages == 1 and resident == 1 and stats.stage_smem
    busy_time = t_mma + t_mem if serial else max(t_mma, t_mem)
    return busy_time * pipeline + waves * LATENCY + target.launch_overhead
