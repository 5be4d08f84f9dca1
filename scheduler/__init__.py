"""The scheduler and Triton codegen (installed as cleave.scheduler).

Pipeline, one pass per module: views (tile maps derived backwards from the
outputs) -> partition (kernel boundaries: a parallel Split's per-chunk results are
materialised) -> tiles (roles and block sizes) -> loops (the loop nest: horizontal
fusion, incremental cascades) -> codegen (renders the nest: hoisting, each loop's
tiles bounded by masks in bounds; Triton source) -> cost -> api.schedule ranks
plans. Running a plan (launch, profile) is the runtime's job.
"""
from .api import schedule
from .plan import Buffer, Kernel, Plan
from .target import H200, Target

__all__ = ["Buffer", "H200", "Kernel", "Plan", "Target", "schedule"]
