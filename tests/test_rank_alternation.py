"""The runtime's ranking replays the plans in alternation: a GPU clock that runs fast for
the first replays after a pause (an H100 after a compile) must not hand the lead to the
plan that happens to be timed first."""
import dataclasses

import torch

from cleave import workloads
from cleave.runtime import profile
from cleave.scheduler import schedule


class _OnCuda:
    device = torch.device("cuda")


def test_a_clock_fast_at_first_does_not_rank_the_plan_timed_first_first(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    (plan,) = schedule(workloads.get("matmul").graph, {"s": 33, "k": 40, "n": 48}, top_k=1)
    plans = [dataclasses.replace(plan, cost=c) for c in (1.0, 2.0, 3.0)]
    true_ms = {0: 1.00, 1: 0.97, 2: 1.20}
    replays, current = [], []
    monkeypatch.setattr(profile, "launch", lambda p, inputs: current.append(plans.index(p)))
    monkeypatch.setattr(profile, "once_ms", lambda fn: (fn(), 1.0)[1])

    def graph_timer(fn, calls=20, cold=False):
        fn()
        index = current[-1]

        def replay():
            replays.append(index)
            # the first three replays after the compiles run 10% fast, then the clock settles
            return true_ms[index] * (0.9 if len(replays) <= 3 else 1.0)
        return replay
    monkeypatch.setattr(profile, "graph_timer", graph_timer)
    assert profile.rank(plans, {"x": _OnCuda()}) == [1, 0, 2]
    assert replays == [0, 1, 2] * (profile.ROUNDS + 1)


def test_plans_whose_graphs_do_not_fit_together_are_timed_one_by_one(monkeypatch):
    captured = []

    def graph_timer(fn, cold=False):
        if captured:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        captured.append(fn)
        return lambda: 1.0
    monkeypatch.setattr(profile, "graph_timer", graph_timer)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(profile, "graph_ms", lambda fn, cold=False: {"a": 2.0, "b": 1.0}[fn()])
    assert profile.alternated([lambda: "a", lambda: "b"]) == [2.0, 1.0]
