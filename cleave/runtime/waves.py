"""In how many waves a plan's programs run on the GPU at one shape. The count changes
inside a shape bucket: a decode batch of 33 fills the 264 program slots of a kernel
that fits two programs per SM once, a batch of 36 needs a second, nearly empty wave,
and which plan is fastest changes with it. Occupancy comes from Triton's compiled
kernel (registers, shared memory, warps) and the device's per-SM limits."""
from __future__ import annotations

import torch

from ..scheduler.plan import Plan
from .launch import prepare

MAX_BLOCKS_PER_SM = 32
REG_ALLOC_UNIT = 256  # registers are allocated per warp in units of 256
SMEM_RESERVED_PER_BLOCK = 1024  # bytes the driver keeps per resident block


def blocks_per_sm(compiled, props) -> int | None:
    """Programs of a compiled kernel resident on one SM at once, or None when the
    kernel does not report its resources (Triton's CPU interpreter)."""
    regs, meta = getattr(compiled, "n_regs", None), getattr(compiled, "metadata", None)
    if regs is None or meta is None:
        return None
    warps = meta.num_warps
    per_warp = -(-regs * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    limits = [MAX_BLOCKS_PER_SM, getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)]
    if per_warp:
        limits.append(getattr(props, "regs_per_multiprocessor", 65536) // (per_warp * warps))
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 0)
    if smem_per_sm:
        limits.append(smem_per_sm // (meta.shared + SMEM_RESERVED_PER_BLOCK))
    return max(1, min(limits))


def waves(plan: Plan, inputs: dict[str, torch.Tensor]) -> int | None:
    """The most waves any kernel of the plan needs at these input shapes, or None
    before its kernels are compiled or off the GPU."""
    device = next(iter(inputs.values())).device
    if device.type != "cuda":
        return None
    prepared = prepare(plan, inputs)
    props = torch.cuda.get_device_properties(device)
    most = 0
    for (_, grid, _, _), compiled in zip(prepared.kernels, prepared.compiled):
        per_sm = blocks_per_sm(compiled, props) if compiled is not None else None
        if per_sm is None:
            return None
        most = max(most, -(-grid[0] // (per_sm * props.multi_processor_count)))
    return most
