"""The GPU a plan is scheduled for: the few numbers the cost model and the tile
enumeration read."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    sms: int
    smem_per_block: int  # bytes
    bandwidth: float  # bytes / s, measured copy bandwidth
    matmul_flops: float  # bf16 tensor-core flop / s, measured
    launch_overhead: float  # s per kernel launch
    l2_bandwidth: float = 10e12  # bytes / s, L2 to shared memory (a lead, not measured)
    vector_flops: float = 60e12  # f32 non-tensor-core op / s (the datasheet's 67 TFLOP/s, less issue slots)
    # Reduced dims up to this size are held whole in one block instead of a loop:
    # a MatMul's contraction (the head dim) and a plain reduction (a row).
    full_matmul: int = 256
    # A MatMul dim up to this may also be held whole where tiling it repeats work (MLA's
    # latent of 512: the scores' contraction inside the key loop, and the output's width,
    # so each program computes its scores once). The cost model keeps the tilings that
    # fit; a kernel that none fits is cut as for a longer dim.
    hold_matmul: int = 512
    full_reduce: int = 16384
    # TMA descriptors only for accumulator tiles this large on both sides (scheduler/tma.py)
    tma_min_tile: int = 64
    # How much recomputing a MatMul's computed operand counts against materialising it
    # (scheduler/recompute.py): 1 is the model's estimate; 0 always fuses and inf always
    # cuts, to measure either side of the model's crossover (benchmarks/crossover.py).
    recompute_weight: float = 1.0
    # How f32 MatMul operands may be rounded, after torch.get_float32_matmul_precision():
    # "highest" keeps them exact (an `ieee` dot off the tensor cores, or two bf16 terms
    # where the other operand holds bf16 values); "medium" rounds them to bf16 once (torch:
    # "float32 matrix multiplications use the bfloat16 datatype for internal
    # computations"). torch's "high" (TF32) runs as "highest" (runtime/operator.py).
    f32_matmul: str = "highest"
    # Load a loop's index tiles (a paged cache's page indices) one step ahead, carried into
    # the next step: Triton then gives the tile gathered through them two buffers at three
    # stages, where it gives one at any count (RESULTS.md, session 37). Off: on an H100 the
    # runtime's tuning of the MLA paged decode's prefetched plans faulted (illegal memory
    # access) with asynchronous launches, never with CUDA_LAUNCH_BLOCKING=1, and each of their
    # kernel options ran clean alone (session 39); cause not found, never timed against the
    # default. `benchmarks.build --index-prefetch` builds them.
    index_prefetch: bool = False
    # Offer each attention-class kernel's Gluon form (scheduler/gluon.py) beside its `tl`
    # options: warp-specialised, for sm_90; the runtime serves it only there, checked.
    gluon: bool = True

    def __post_init__(self):
        if self.f32_matmul not in F32_MATMUL_PRECISIONS:
            raise ValueError(f"Target.f32_matmul must be one of {', '.join(F32_MATMUL_PRECISIONS)}, "
                             f"not {self.f32_matmul!r}")


F32_MATMUL_PRECISIONS = ("highest", "medium")


H200 = Target("H200", sms=132, smem_per_block=227 * 1024, bandwidth=4.3e12, matmul_flops=790e12,
              launch_overhead=3e-6)
