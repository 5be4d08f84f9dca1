"""The scheduler and Triton codegen (installed as cleave.scheduler).

Pipeline, one pass per module: views (tile maps derived backwards from the
outputs) -> partition (kernel boundaries: a parallel Split's per-chunk results are
materialised) -> tiles (roles and block sizes) -> codegen (loop nest: hoisting,
horizontal fusion, incremental cascades; Triton source) -> cost -> api.schedule
ranks plans -> launch runs one -> profile picks among them on a GPU.
"""
from .plan import Buffer, Kernel, Plan
from .target import H200, Target

__all__ = ["Buffer", "H200", "Kernel", "Plan", "Target", "launch", "profile", "schedule"]


def schedule(candidate, shapes, dynamic=(), top_k=4, target=H200, split=None):
    from .api import schedule as _schedule

    return _schedule(candidate, shapes, dynamic=dynamic, top_k=top_k, target=target, split=split)


def launch(plan, inputs, out=None):
    from .launch import launch as _launch

    return _launch(plan, inputs, out=out)


def profile(plans, inputs):
    from .profile import profile as _profile

    return _profile(plans, inputs)
