"""A split's combine over more chunks than one tile holds beside a whole head row
(300 chunks of a 64-wide head) takes narrower column tiles, so that each program
reduces every chunk in one tile: a loop over the chunks runs step by step, since
Triton software-pipelines no loop without a tl.dot (on the H200 the combine's loop
ran the same at one stage and at three; RESULTS.md, session 14). A kernel without a
tl.dot is offered one stage only."""
from fixtures_candidates import CANDIDATES
from kernel_check import run_and_check

from cleave.scheduler import schedule

ENV = {"b": 1, "hkv": 1, "g": 4, "L": 300 * 64, "d": 64}


def test_a_combine_over_many_chunks_holds_them_in_one_tile_and_is_exact():
    cand = CANDIDATES["mqa_decode"]()
    plan = schedule(cand, ENV, top_k=1, split={"sp": 300})[0]
    partial, combine = plan.kernels
    assert "tl.dot(" in partial.source and "tl.dot(" not in combine.source
    assert combine.loops == [], combine.source
    assert "cdiv(d, 32)" in combine.grid[0] or "cdiv(d, 16)" in combine.grid[0], combine.grid
    assert combine.num_stages == 1
    run_and_check(cand.graph, plan, ENV, seed=3)


def test_kernels_without_a_dot_are_offered_one_stage():
    cand = CANDIDATES["mqa_decode"]()
    plans = schedule(cand, ENV, top_k=8, split={"sp": 300})
    for plan in plans:
        for k in plan.kernels:
            if "tl.dot(" not in k.source:
                assert k.num_stages == 1, (k.name, k.num_stages)


def test_the_runtime_tunes_no_stage_count_for_a_kernel_without_a_dot():
    """The runtime's launch tuning (mix.launch_variants) keeps to one stage as the
    scheduler does: another stage count would be a Triton compile that runs the same."""
    from cleave.runtime.mix import launch_variants
    from cleave.scheduler.plan import Kernel

    plans = schedule(CANDIDATES["mqa_decode"](), ENV, top_k=8, split={"sp": 300})
    looped = [k for p in plans for k in p.kernels if k.loops and "tl.dot(" not in k.source]
    assert looped, "a combine that loops over its chunks among the top plans"
    for combine in looped:
        assert not combine.pipelined
        assert all(s == 1 for _, s in launch_variants(combine))
    assert all(k.pipelined for p in plans for k in p.kernels if "tl.dot(" in k.source)
    assert Kernel.from_json(looped[0].to_json()).pipelined is False
    assert Kernel.from_json({k: v for k, v in looped[0].to_json().items() if k != "pipelined"}).pipelined  # older files
