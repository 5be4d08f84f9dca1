"""Kernel-wise tuning across plans of one partition (cleave.runtime.mix): each kernel
takes its fastest option, the composed plan computes what the graph computes, and the
operator saves the picks with a bucket's ranking and composes them again from disk."""
import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from cleave import workloads
from cleave.ir import parse_graph
from cleave.runtime import artifact as A
from cleave.runtime import launch as launch_module
from cleave.runtime import mix
from cleave.runtime.launch import launch, one_kernel
from cleave.runtime.mix import compose, fastest_kernels, launch_variants, partition_key
from cleave.scheduler import schedule

# Two outputs with different grids: two kernels, each with its own ranked options.
TWO_KERNELS = parse_graph('''graph two_kernels {
  %0 = input(name="x", shape=[s,k], dtype=f32) : f32[s,k]
  %1 = input(name="w", shape=[k,n], dtype=f32) : f32[k,n]
  %2 = matmul(%0, %1) : f32[s,n]
  %3 = exp(%2) : f32[s,n]
  %4 = reduce(%3, op="sum", axis=0, keepdim=0) : f32[n]
  %5 = reduce(%0, op="max", axis=1, keepdim=0) : f32[s]
  return a=%4, b=%5
}''')
ENV = {"s": 37, "k": 24, "n": 300}


@pytest.fixture(autouse=True)
def no_warmup_wait(monkeypatch):
    """The fake timers replay instantly: the warm-up is its two pairs of replays."""
    monkeypatch.setattr(mix, "WARMUP_S", 0.0)


def two_kernel_plans():
    plans = schedule(TWO_KERNELS, ENV, top_k=3)
    assert len(plans) == 3 and all(len(p.kernels) == 2 for p in plans)
    assert len({partition_key(p) for p in plans}) == 1
    return plans


def fake_time(costs: dict[tuple[int, int], float], plans, timed: list, launch_cost=None, clock=None):
    """A timer summing a cost per (kernel slot, plan option), an option's other launch
    configurations costing what the first option with its source costs, times
    `launch_cost(slot, kernel)` (default 1), over the timed kernel slot alone or the
    whole plan; records each plan prepared for timing. Each replay reads the cost times
    `clock()` (default 1: a clock that does not drift)."""
    config = lambda k: (k.source, k.num_warps, k.num_stages)  # noqa: E731
    options, sources = {}, {}
    for (slot, i), cost in costs.items():
        k = plans[i].kernels[slot]
        options.setdefault((slot, config(k)), cost)
        sources.setdefault((slot, k.source), cost)
    factor = launch_cost or (lambda slot, kernel: 1.0)

    def time(plan, only=None):
        timed.append(plan)
        cost = sum(options.get((slot, config(k)), sources[(slot, k.source)]) * factor(slot, k)
                   for slot, k in enumerate(plan.kernels) if only in (None, slot))
        return lambda: cost * (clock() if clock else 1.0)
    return time


def test_one_kernel_launches_that_kernel_alone_on_what_a_whole_call_wrote(monkeypatch):
    """The tuning times a kernel's options alone: the whole plan runs once first, so the
    kernel reads the intermediate it reads in the plan (never unwritten memory); each
    call then launches that kernel only, and gives the plan's result again."""
    norm_mm = workloads.get("rmsnorm_matmul")
    wide = {"s": 2048, "k": 4096, "n": 14336}  # partitioned where it cuts, run at a small odd binding
    (plan,) = schedule(norm_mm.graph, wide, dynamic=set(wide), top_k=1)
    assert len(plan.kernels) == 2 and plan.intermediates  # the normed rows, then the MatMul reading them
    inputs = norm_mm.inputs({"s": 37, "k": 45, "n": 70}, seed=5)
    (want,) = launch(plan, inputs)
    launched, real = [], launch_module._jit_launch
    monkeypatch.setattr(launch_module, "_jit_launch",
                        lambda fn, grid, values, options, name: launched.append(name) or real(fn, grid, values,
                                                                                             options, name))
    call = one_kernel(plan, inputs, 1)
    assert launched == [k.name for k in plan.kernels]
    launched.clear()
    for _ in range(2):
        (got,) = call()
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert launched == [plan.kernels[1].name] * 2


def test_a_kernel_is_tuned_on_its_own_time_not_the_plan_s():
    """A swap 3% faster on a kernel that is a tenth of the plan gains 0.3% of the plan:
    under the noise floor of whole-plan replays, plain in the kernel's own."""
    plans = two_kernel_plans()
    costs = {(slot, i): 1.0 if slot == 0 else 9.0 for slot in range(2) for i in range(3)}
    costs[(0, 2)] = 0.97
    assert fastest_kernels(plans, [0, 1, 2], {}, time=fake_time(costs, plans, [])) == [2, 0]


def test_each_kernel_takes_its_fastest_option_and_the_mix_is_exact():
    plans = two_kernel_plans()
    # kernel 0 is fastest as plan 2 has it, kernel 1 as plan 1 has it
    costs = {(0, 0): 5.0, (0, 1): 6.0, (0, 2): 3.0, (1, 0): 4.0, (1, 1): 1.0, (1, 2): 4.0}
    timed = []
    picks = fastest_kernels(plans, [0, 1, 2], {}, time=fake_time(costs, plans, timed))
    assert picks == [2, 1]
    # the first plan, then one swap per other distinct option of each kernel, then the
    # picked option's other launch configurations; each swap timed beside the plan as it
    # stood, twice each where the first pair did not rule it out
    config = lambda k: (k.source, k.num_warps, k.num_stages)  # noqa: E731
    options = [{config(p.kernels[slot]) for p in plans} for slot in range(2)]
    variants = [{(plans[i].kernels[slot].source, w, s) for w, s in launch_variants(plans[i].kernels[slot])}
                - options[slot] for slot, i in enumerate(picks)]
    assert any(variants)
    swaps = sum(len(o) - 1 for o in options) + sum(len(v) for v in variants)
    assert len({tuple(config(k) for k in p.kernels) for p in timed}) == 1 + swaps
    # each challenger captured once, replayed beside the kernel it would replace, which
    # is captured once per kernel slot; then the tuned plan whole, beside the first plan
    assert len(timed) == swaps + len(picks) + 2
    mixed = compose(plans, picks)
    assert [k.source for k in mixed.kernels] == [plans[2].kernels[0].source, plans[1].kernels[1].source]
    assert all(name.startswith(mixed.kernels[0].name) or name.startswith(mixed.kernels[1].name)
               for name in mixed.tiles)
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(ENV["s"], ENV["k"], generator=g), torch.randn(ENV["k"], ENV["n"], generator=g) * 0.1
    a, b = launch(mixed, {"x": x, "w": w})
    x64, w64 = x.double(), w.double()
    torch.testing.assert_close(a.double(), torch.exp(x64 @ w64).sum(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b.double(), x64.max(1).values, rtol=0, atol=0)


def test_the_tuning_reports_each_kernel_it_tuned(capsys):
    plans = two_kernel_plans()
    costs = {(0, 0): 5.0, (0, 1): 6.0, (0, 2): 3.0, (1, 0): 4.0, (1, 1): 1.0, (1, 2): 4.0}
    fastest_kernels(plans, [0, 1, 2], {}, time=fake_time(costs, plans, []))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[cleave tune] kernel")]
    assert [ln.split(":")[0] for ln in lines] == [f"[cleave tune] kernel {i}/2 ({k.name})"
                                                  for i, k in enumerate(plans[0].kernels, 1)]
    assert lines[0].endswith("picked 2") and lines[1].endswith("picked 1")


def test_a_faster_launch_configuration_is_picked_and_runs_exactly():
    """One plan alone is tuned too: kernel 0 runs faster with the other warp count."""
    plans = two_kernel_plans()
    flat = {(slot, i): 1.0 for slot in range(2) for i in range(3)}
    own = plans[0].kernels[0].num_warps
    faster = lambda slot, k: 0.8 if slot == 0 and k.num_warps != own else 1.0  # noqa: E731
    picks = fastest_kernels(plans, [0], {}, time=fake_time(flat, plans, [], faster))
    (warps,) = [w for w in (4, 8) if w != own]
    assert picks == [[0, warps, plans[0].kernels[0].num_stages], 0]
    mixed = compose(plans, picks)
    assert mixed.kernels[0].num_warps == warps and mixed.kernels[0].source == plans[0].kernels[0].source
    assert mixed.kernels[1] == plans[0].kernels[1]
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(ENV["s"], ENV["k"], generator=g), torch.randn(ENV["k"], ENV["n"], generator=g) * 0.1
    a, b = launch(mixed, {"x": x, "w": w})
    torch.testing.assert_close(a.double(), torch.exp(x.double() @ w.double()).sum(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b.double(), x.double().max(1).values, rtol=0, atol=0)


def test_a_second_partition_tuned_may_overtake_the_fastest_plan():
    """The fastest plan of the next partition in the ranking is tuned too: here it runs
    slower as ranked but faster at the other warp count, and the picks come from it."""
    plans = two_kernel_plans()
    other = schedule(TWO_KERNELS, {**ENV, "k": 40}, top_k=1)[0]  # a partition of its own
    plans = plans + [other]
    costs = {(slot, i): (3.0 if i == 3 else 2.0) for slot in range(2) for i in range(4)}
    own = other.kernels[0].num_warps
    faster = lambda slot, k: 0.5 if k.source == other.kernels[slot].source and k.num_warps != own else 1.0  # noqa: E731
    picks = fastest_kernels(plans, [0, 3, 1, 2], {}, time=fake_time(costs, plans, [], faster))
    assert picks and all((p if isinstance(p, int) else p[0]) == 3 for p in picks)
    assert partition_key(compose(plans, picks)) == partition_key(other)


def test_a_drifting_clock_neither_hides_a_faster_option_nor_invents_one():
    """The GPU slows by 3% with every replay (a clock throttling over a tuning): a swap
    5% faster is still found, being replayed in alternation with the plan it would
    replace, and on flat costs, with a clock speeding up as much, nothing is swapped
    although every later replay reads faster than every earlier one."""
    plans = two_kernel_plans()
    costs = {(slot, i): 1.0 for slot in range(2) for i in range(3)}
    costs[(0, 1)] = 0.95
    replays = []

    def clock(step):
        return lambda: 1 + step * len(replays.append(0) or replays)

    assert fastest_kernels(plans, [0, 1, 2], {}, time=fake_time(costs, plans, [], clock=clock(0.03))) == [1, 0]
    flat = {key: 1.0 for key in costs}
    replays.clear()
    assert fastest_kernels(plans, [0, 1, 2], {}, time=fake_time(flat, plans, [], clock=clock(-0.01))) is None


def test_a_clock_that_settles_after_its_first_replays_does_not_favour_the_swap():
    """After a compile's pause the GPU runs its first replays faster, then settles (the
    H200: ~10% over the first ~0.1 s). A swap 2% slower, replayed while the clock is
    fast and the plan it would replace after, would read faster: both are replayed
    before the timed blocks."""
    plans = two_kernel_plans()
    costs = {(slot, i): 1.0 for slot in range(2) for i in range(3)}
    costs[(0, 1)] = 1.02
    replays = []

    def settling():  # each comparison starts after a pause: three fast replays, then steady
        replays.append(0)
        return 0.9 if len(replays) <= 3 else 1.0

    def time(plan, slot=None):
        replays.clear()
        return fake_time(costs, plans, [], clock=settling)(plan, slot)

    assert fastest_kernels(plans, [0, 1, 2], {}, time=time) is None


def test_one_replay_the_clock_dips_in_does_not_decide_a_swap():
    """The H200's clock dips for a replay now and then (+10% and more). A dip in the
    last replay of the plan as it stands weighs on one block only: a swap 0.2% slower
    is not taken, where a total over both blocks took it. A swap 2% faster still is."""
    plans = two_kernel_plans()
    costs = {(slot, i): 1.0 for slot in range(2) for i in range(3)}
    costs[(0, 1)] = 1.002
    replays = []

    def dipping():  # warm-up (two pairs), then a b b a a b b a: the last replay dips
        replays.append(0)
        return 1.13 if len(replays) == 12 else 1.0

    def time(plan, slot=None):
        replays.clear()
        return fake_time(costs, plans, [], clock=dipping)(plan, slot)

    assert fastest_kernels(plans, [0, 1, 2], {}, time=time) is None
    costs[(0, 1)] = 0.98
    assert fastest_kernels(plans, [0, 1, 2], {}, time=time) == [1, 0]


@pytest.mark.parametrize("whole", [0.5, 0.1], ids=["slower", "even"])
def test_a_mix_no_faster_as_a_whole_than_its_first_plan_is_not_served(whole):
    """Each kernel's swap wins timed alone, but the composed plan replays slower than
    the plan the tuning started from (a kernel faster with the L2 flushed than behind
    the one before it), or no faster (the replays cannot tell them apart): the plan is
    the default, served unless the mix shows its gain as a whole."""
    plans = two_kernel_plans()
    costs = {(slot, i): 1.0 for slot in range(2) for i in range(3)}
    costs[(0, 2)] = 0.9
    alone = fake_time(costs, plans, [])

    def time(plan, slot=None):
        replay = alone(plan, slot)
        mixed = slot is None and plan.kernels[0].source == plans[2].kernels[0].source
        return (lambda: replay() + whole) if mixed else replay  # the mix whole: 2.4 or 2.0, plan 0 2.0

    assert fastest_kernels(plans, [0, 1, 2], {}, time=alone) == [2, 0]
    assert fastest_kernels(plans, [0, 1, 2], {}, time=time) is None


def test_no_mix_when_no_swap_pays_or_nothing_shares_the_partition():
    plans = two_kernel_plans()
    flat = {(slot, i): 1.0 for slot in range(2) for i in range(3)}
    assert fastest_kernels(plans, [0, 1, 2], {}, time=fake_time(flat, plans, [])) is None
    assert fastest_kernels(plans, [1], {}, time=fake_time(flat, plans, [])) is None
    other = schedule(TWO_KERNELS, {**ENV, "k": 40}, top_k=1)[0]  # another binding: other buffers
    assert partition_key(other) != partition_key(plans[0])
    with pytest.raises(ValueError, match="do not share one partition"):
        compose(plans + [other], [0, 3])


def test_operator_saves_the_picks_and_composes_them_again_without_timing(monkeypatch, tmp_path):
    """The CUDA branch of the plan choice with a recording launch (as in
    test_dynamic_split): the bucket's tuning saves the per-kernel picks next to its
    ranking, the shape runs the composed plan, and a new operator on the same cache
    composes the same plan from disk without timing anything."""
    import cleave.runtime.operator as operator

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    scratch = operator._scratch
    monkeypatch.setattr(operator, "_scratch", lambda plan, device: scratch(plan, "meta"))
    monkeypatch.setattr(operator, "launch", lambda plan, inputs, out=None: [None])
    calls = []

    def picks_of(plans, ranking, inputs):
        calls.append(ranking)
        return [[ranking[-1], 4, 2], ranking[0]]
    monkeypatch.setattr(operator, "fastest_kernels", picks_of)
    inputs = {"x": torch.randn(37, 24), "w": torch.randn(24, 300)}

    def chosen():
        op = operator.CompiledOperator(TWO_KERNELS, {"s"}, top_k=3)
        op.device = torch.device("cuda")
        plan, spec = op.select(inputs)
        return op, plan, spec

    op, plan, spec = chosen()
    (ranking,) = calls
    assert len(ranking) >= 2
    want = [dataclasses.replace(spec.plans[ranking[-1]].kernels[0], num_warps=4, num_stages=2),
            spec.plans[ranking[0]].kernels[1]]
    assert plan.kernels == want
    saved = A.load_tuning(op.entry, spec.static)
    assert saved[f"{next(iter(k for k in saved if not k.endswith(';kernels')))};kernels"] == \
        [[ranking[-1], 4, 2], ranking[0]]
    monkeypatch.setattr(operator, "fastest_kernels", lambda *a: pytest.fail("timed again"))
    _, again, _ = chosen()
    assert again.kernels == want


def test_a_bucket_timed_again_without_a_mix_forgets_its_old_picks(monkeypatch, tmp_path):
    """Picks saved for a bucket whose ranking is gone (another build's file) are
    replaced when the bucket is timed again and no swap pays: the plan runs unmixed."""
    import cleave.runtime.operator as operator

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    scratch = operator._scratch
    monkeypatch.setattr(operator, "_scratch", lambda plan, device: scratch(plan, "meta"))
    monkeypatch.setattr(operator, "launch", lambda plan, inputs, out=None: [None])
    monkeypatch.setattr(operator, "fastest_kernels", lambda plans, ranking, inputs: None)
    inputs = {"x": torch.randn(37, 24), "w": torch.randn(24, 300)}
    op = operator.CompiledOperator(TWO_KERNELS, {"s"}, top_k=3)
    op.device = torch.device("cuda")
    op.prepare({k: tuple(v.shape) for k, v in inputs.items()})
    (spec,) = op.specs.values()
    key = operator.bucket({**ENV}, op.dynamic)
    spec.tuning[f"{key};kernels"] = [2, 1]
    plan, _ = op.select(inputs)
    assert plan is spec.plans[spec.tuning[key][0]]
    assert A.load_tuning(op.entry, spec.static)[f"{key};kernels"] == []
