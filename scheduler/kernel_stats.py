"""What a generated kernel costs, per program, as codegen counts it: the inputs of
the cost model (bytes, tensor-core work, shared memory, registers)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class Stats:
    """What the cost model reads, per program."""
    bytes: float = 0.0  # global bytes moved, over all loop trips
    flops: float = 0.0  # tensor-core flops
    mma_flops: float = 0.0  # flops weighted by 1 / the tile shape's tensor-core efficiency
    vector_flops: float = 0.0  # a contraction off the tensor cores (broadcast product and sum)
    stage_smem: dict = field(default_factory=dict)  # load in a loop -> bytes of one tile (pipelined)
    # loads of stage_smem whose rows are gathered through indices loaded in the same loop
    # (a paged KV cache's pages): Triton 3.6's pipeliner puts such a tile a stage behind
    # its index tile, so it gets (stages - 1) // 2 buffers, one at least (the MLA paged
    # decode's fused kernel compiled for sm_90: one buffer at 2-4 stages, two at 5 and 6,
    # three at 7; at 3 and 4 only the index tile is copied ahead, the same code at both)
    gathered: set = field(default_factory=set)
    # the index tiles of the loop are loaded a step ahead (Target.index_prefetch): a
    # gathered tile then gets stages - 1 buffers (two at 3 stages, compiled for sm_90)
    index_prefetch: bool = False
    fixed_smem: dict = field(default_factory=dict)  # dot operands held across the loop (the q tile)
    acc_elems: int = 0
    deferred: bool = False  # a loop accumulates a tile lane by lane (codegen.deferred_tile)
    tile_elems: int = 0  # the largest value computed in a loop (the score tile): registers
    loop_elems: int = 0  # the same, inside loops only: what is live beside the accumulators
    footprint: dict = field(default_factory=dict)  # buffer -> its size in bytes (L2 reuse bound)
    per_buffer: dict = field(default_factory=dict)  # buffer -> bytes this program moves
    loops: list = field(default_factory=list)  # each loop over tiles: bounds.loop_record
    epilogue_smem: int = 0  # scratch the epilogue needs beside the loop's stages (persistent kernels)
    masked_store_bytes: int = 0  # the largest tile stored under a mask
    tma_in_loop: bool = False  # a loop loads tiles through TMA descriptors
    # a loop beside its tl.dot reduces a value no dot computed (RMSNorm's sum of squares of
    # the x tile its MatMul reads): triton 3.6 miscompiles that pipelined at 8 warps
    side_reduction: bool = False
    # share of the grid's programs that run their loop (the rest find their bounds empty:
    # a split chunk beside their requests' pages); the counts above average over all
    active: float = 1.0
    # steps per program of loops that load around an inner loop (codegen.outer_load_steps):
    # not software-pipelined, each waits for its loads
    outer_steps: float = 0.0
    outer_step_bytes: int = 0  # what one such step loads, around its inner loop

    @property
    def pipelined(self) -> bool:
        """Triton software-pipelines a loop's loads only where they feed a tl.dot (a
        split's combine looping over its chunks ran the same at one stage and at three
        on the H200, RESULTS.md session 14): without one, every loop runs step by step."""
        return self.mma_flops > 0

    def of_active(self) -> "Stats":
        """The work of one program that runs its loop."""
        k = 1 / self.active
        return replace(self, bytes=self.bytes * k, flops=self.flops * k, mma_flops=self.mma_flops * k,
                       outer_steps=self.outer_steps * k,
                       vector_flops=self.vector_flops * k,
                       per_buffer={n: b * k for n, b in self.per_buffer.items()}, active=1.0)

    def buffers(self, key, stages: int) -> int:
        """Copies of a loop's tile Triton keeps in shared memory at `stages`: one per
        stage, a gathered tile (stages - 1) // 2 and one at least (stages - 1 where its
        indices are loaded a step ahead)."""
        if key not in self.gathered:
            return stages
        return max(1, stages - 1 if self.index_prefetch else (stages - 1) // 2)

    def in_flight(self, stages: int) -> float:
        """Bytes a program has in flight while it computes on a step: the tiles of the
        stages ahead of the one in use. With one stage a program loads and computes in
        turn (nothing is prefetched), so it counts as half a tile, not as much as two
        stages. A gathered tile counts one tile from 2 stages: with one buffer its next
        copy is issued only after the step's dots have read it, and another program on
        the SM loads meanwhile (alone on its SM such a program loads and computes in
        turn, which the model does not count: RESULTS.md session 26)."""
        def ahead(key) -> float:
            if key in self.gathered and stages > 1:
                return max(self.buffers(key, stages) - 1, 1)
            return stages - 1 if stages > 1 else 0.5
        return sum(b * ahead(k) for k, b in self.stage_smem.items())

    @property
    def stage_choices(self) -> tuple:
        """The stage counts worth launching (empty: any). A loop that gathers compiles to
        the same code at 4 stages as at 3 (only its index tile is copied ahead at both);
        at 5 it gets a second buffer, which ran 17% faster than one at 8 warps, one
        program an SM, but 2-2.5x slower at 4 warps, where the model sees no difference,
        so it is not offered (MLA paged decode on the H200, RESULTS.md session 26)."""
        return (1, 2, 3) if self.gathered else ()

    def smem(self, stages: int) -> int:
        """Triton keeps `stages` copies of each tile loaded in a loop in shared memory
        (`buffers`). Copies
        through descriptors add their mbarriers, and the swizzled tiles after them start on
        a 1 KiB boundary: 1 KiB more (the searched ragged prefill's attention kernel,
        compiled for sm_90 by triton 3.9: 230400 bytes at two stages, 229376 without)."""
        return sum(self.buffers(k, stages) * b for k, b in self.stage_smem.items()) + \
            sum(self.fixed_smem.values()) + self.epilogue_smem + (1024 if self.tma_in_loop else 0)

    def traffic(self, name: str, nbytes: float, total: int):
        self.bytes += nbytes
        self.per_buffer[name] = self.per_buffer.get(name, 0.0) + nbytes
        self.footprint[name] = total


def mma_efficiency(m: int, n: int) -> float:
    """Share of the tensor-core peak a tl.dot tile reaches: small tiles are issue- and
    latency-bound (wgmma wants 64-row warpgroup tiles and a wide N)."""
    return m * n / (m * n + 64 * 64)
