"""The scheduler and Triton codegen (installed as cleave.scheduler).

Pipeline, one pass per module: views (tile maps derived backwards from the
outputs) -> partition (kernel boundaries: a parallel Split's per-chunk results are
materialised) -> tiles (roles and block sizes) -> codegen (loop nest: hoisting,
horizontal fusion, incremental cascades; Triton source) -> cost -> api.schedule
ranks plans -> launch runs one -> profile picks among them on a GPU.
"""
# Bound eagerly: a lazy wrapper named like its submodule (launch, profile) would be
# replaced by the submodule object the first time that submodule is imported.
from .api import schedule
from .launch import launch
from .plan import Buffer, Kernel, Plan
from .profile import profile, rank
from .target import H200, Target

__all__ = ["Buffer", "H200", "Kernel", "Plan", "Target", "launch", "profile", "rank", "schedule"]
