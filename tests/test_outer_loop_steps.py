"""Triton pipelines innermost loops only: a loop that loads tiles around an inner loop
waits for its loads at every step. On the H200 the MLA paged decode's partial kernel
with its 512-wide contraction looped in 128-column steps inside the key loop ran 0.22
ms, against 0.13 with the contraction whole (RESULTS.md, 2026-12-02 session 15). The
cost model counts that wait, latency and transfer (Stats.outer_steps,
Stats.outer_step_bytes), so a contraction that fits whole is not looped in its stead;
on the MLA paged decode's large step, 64-column steps ran 0.193 ms against 0.103 whole
(session 26)."""
import dataclasses

from cleave import search
from cleave.ir import Graph
from cleave.scheduler import H200, schedule
from cleave.scheduler.cost import kernel_time
from cleave.workloads.attention import safe_softmax, scale
from kernel_check import recorded_kernel_options


def _nested(source: str) -> bool:
    """A `for` over tiles inside another."""
    return len({len(ln) - len(ln.lstrip()) for ln in source.splitlines() if ln.lstrip().startswith("for start")}) > 1


def test_loads_around_an_inner_loop_are_costed_unpipelined(monkeypatch):
    g = Graph("rows_attention")
    q = g.input("q", ("h", "r", "d"), "bf16")
    k = g.input("k", ("h", "L", "d"), "bf16")
    v = g.input("v", ("h", "L", "d"), "bf16")
    g.output(safe_softmax((q @ k.T).cast("f32") * scale(g, "d")).cast("bf16") @ v, names=["o"])
    candidate = search(g).candidates[0]
    recorded = recorded_kernel_options(monkeypatch)
    # split in 13, the model ranked first a plan whose 512-wide contraction loops inside
    # the key loop before it counted the outer loop's unpipelined steps
    plan = schedule(candidate, {"h": 8, "r": 16, "L": 4096, "d": 512}, top_k=1, split={"s_L": 13})[0]
    assert not any(_nested(k.source) for k in plan.kernels)
    found = [f for options in recorded for f in options]
    nested = [f for f in found if _nested(f[1].source)]
    assert nested, "no option looped the contraction inside the key loop"
    assert all(f[4].outer_steps > 0 and f[4].outer_step_bytes > 0 for f in nested)
    assert all(f[4].outer_steps == 0 for f in found if not _nested(f[1].source))
    # each outer step also waits for its tiles' transfer, not for a latency alone
    _, kernel, _, _, stats = nested[0]
    latency_only = dataclasses.replace(stats, outer_step_bytes=0)
    programs = 8 * 13
    assert kernel_time(stats, programs, kernel.num_warps, kernel.num_stages, H200) > \
        kernel_time(latency_only, programs, kernel.num_warps, kernel.num_stages, H200)
