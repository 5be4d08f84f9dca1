"""Two things the cost model learnt from the MLA paged decode's partial kernel on the
H200 (RESULTS.md, 2026-12-02 sessions 11 and 15):

- A tl.dot of at most 16 rows is one mma row block: each warp takes a slice of its
  columns and reads the whole row operand again; 8 warps ran every 16-row option 31-48%
  slower than 4. Such a kernel is offered, and tuned to, at most 4 warps, unless its
  tile fits only more.
- Triton pipelines innermost loops only: a loop that loads tiles around an inner loop
  (a contraction looped in 128-column steps inside the key loop) waits for its loads at
  every step, 0.22 ms against 0.13 with the contraction whole. The model costs that
  wait, so a contraction that fits whole is not looped."""
import functools

from cleave import search
from cleave.ir import Graph
from cleave.runtime.mix import launch_variants
from cleave.scheduler import api, schedule
from cleave.scheduler.kernel_stats import SMALL_DOT_ROWS, Stats
from cleave.scheduler.plan import Kernel
from cleave.workloads.attention import safe_softmax, scale


@functools.cache
def _candidate():
    g = Graph("rows_attention")
    q = g.input("q", ("h", "r", "d"), "bf16")
    k = g.input("k", ("h", "L", "d"), "bf16")
    v = g.input("v", ("h", "L", "d"), "bf16")
    g.output(safe_softmax((q @ k.T).cast("f32") * scale(g, "d")).cast("bf16") @ v, names=["o"])
    return search(g).candidates[0]


def _kernels(rows, d=128):
    plans = schedule(_candidate(), {"h": 8, "r": rows, "L": 4096, "d": d}, top_k=6)
    return [k for p in plans for k in p.kernels if "tl.dot(" in k.source]


def _nested(source: str) -> bool:
    """A `for` over tiles inside another."""
    return len({len(ln) - len(ln.lstrip()) for ln in source.splitlines() if ln.lstrip().startswith("for start")}) > 1


def test_a_few_rows_are_offered_and_tuned_at_four_warps_at_most():
    kernels = _kernels(SMALL_DOT_ROWS)
    capped = [k for k in kernels if k.max_warps]
    assert capped, "no 16-row attention kernel was capped"
    for k in capped:
        assert k.max_warps == 4 and k.num_warps <= 4, (k.num_warps, k.max_warps)
        assert all(w <= 4 for w, _ in launch_variants(k))


def test_wide_tiles_keep_eight_warps():
    kernels = _kernels(1024)
    assert not any(k.max_warps for k in kernels)
    assert any(k.num_warps == 8 for k in kernels)


def test_the_stats_rule_and_the_plan_file():
    assert Stats(dot_rows=16).max_warps == 4 and Stats(dot_rows=64).max_warps == 0 and Stats().max_warps == 0
    k = Kernel("k", "src", ["1"], [], 4, 2, loops=[{"label": "X0"}], max_warps=4)
    again = Kernel.from_json(k.to_json())
    assert again.max_warps == 4 and not again.launches(8, 2) and again.launches(4, 3)
    old = {key: v for key, v in k.to_json().items() if key != "max_warps"}
    assert Kernel.from_json(old).launches(8, 2)


def test_loads_around_an_inner_loop_are_costed_unpipelined(monkeypatch):
    found = []
    options = api._kernel_options

    def recorded(*args):
        out = options(*args)
        found.extend(out)
        return out

    monkeypatch.setattr(api, "_kernel_options", recorded)
    shapes = {"h": 8, "r": 16, "L": 4096, "d": 512}
    # split in 13, the model ranked first a plan whose 512-wide contraction loops inside
    # the key loop before it counted the outer loop's unpipelined steps
    plan = schedule(_candidate(), shapes, top_k=1, split={"s_L": 13})[0]
    assert not any(_nested(k.source) for k in plan.kernels)
    nested = [f for f in found if _nested(f[1].source)]
    assert nested, "no option looped the contraction inside the key loop"
    assert all(f[4].outer_steps > 0 for f in nested)
    assert all(f[4].outer_steps == 0 for f in found if not _nested(f[1].source))
