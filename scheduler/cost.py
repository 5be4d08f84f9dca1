"""The analytical cost model: global bytes and tensor-core flops per program, over
the programs of the grid, with wave quantisation over the SMs; plans over the
shared-memory budget are rejected, register-heavy tiles penalised."""
from __future__ import annotations

from .codegen import Stats


def kernel_time(stats: Stats, programs: int, num_warps: int, num_stages: int, target) -> float | None:
    """Seconds, or None when the tile does not fit the target."""
    smem = stats.smem * num_stages
    if smem > target.smem_per_block:
        return None
    threads = 32 * num_warps
    regs = stats.acc_elems / threads  # fp32 registers per thread held by accumulators
    if regs > 256:
        return None
    per_sm = max(1, min(4, target.smem_per_block // max(smem, 1), int(128 // max(regs, 16))))
    slots = target.sms * per_sm
    waves = -(-programs // slots)
    efficiency = programs / (waves * slots)
    # A program that streams little data runs at a fraction of the SM's bandwidth.
    occupancy = min(1.0, programs / target.sms)
    t_mem = stats.bytes * programs / (target.bandwidth * max(occupancy, 1e-3))
    t_flop = stats.flops * programs / (target.matmul_flops * max(efficiency, 1e-3))
    warp_fit = 1.0 if (num_warps == 8) == (stats.acc_elems >= 8192) else 1.15
    return (max(t_mem, t_flop) + target.launch_overhead) * warp_fit
