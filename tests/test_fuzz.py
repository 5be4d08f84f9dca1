"""Differential fuzz: random programs (tests/fuzz_programs.py) through cleave.compile
against eager PyTorch, in their own dtypes and in fp64, at two sizes of a dynamic
axis and back (n1, n2, n1), the third call without recompiling.

A wrong result, a crash (an exception eager does not raise, a segfault, a hang)
and a recompile on the third call fail the test; eager fallbacks (a warning that
an op runs eagerly or that an operator could not be compiled) are allowed and
counted. Every failure prints the program's source, sizes, seed and a script that
reproduces it.

CI runs a fixed budget, the same programs every run: CI_SEEDED programs from a
seeded generator (evenly spread over the ops) and CI_HYPOTHESIS distinct ones from
derandomized hypothesis (its first examples are the degenerate ones: repeated
expressions, size-1 dims, shortest programs). The slow test
(`pytest -m slow tests/test_fuzz.py`) runs CLEAVE_FUZZ_PROGRAMS (default 500)
hypothesis programs, others than the default ones with CLEAVE_FUZZ_SEED=<int>,
writes every verdict as JSON lines to CLEAVE_FUZZ_REPORT if set, and prints a
summary line and the fallbacks it met.
"""
from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal

import pytest
import torch
from fuzz_programs import (TIGHT, InputSpec, Program, Tolerance, Worker, compare, load, make_inputs, mismatch,
                           program_from_seed, programs, references, report)
from hypothesis import HealthCheck, Phase, given, seed, settings

CI_SEEDED = 20
CI_HYPOTHESIS = 10
SLOW_PROGRAMS = int(os.environ.get("CLEAVE_FUZZ_PROGRAMS", "500"))
FAILURES = ("wrong", "crash", "recompiled", "invalid")


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """One worker process for the module, with an operator cache of its own (every
    program is searched, not loaded), holding the rule verifier's verdicts already
    proven in the user's cache (proving the library cold takes ~20 s)."""
    from cleave.storage import cache_dir

    path = tmp_path_factory.mktemp("cleave-fuzz-cache")
    if (cache_dir() / "verify").is_dir():
        shutil.copytree(cache_dir() / "verify", path / "verify")
    w = Worker(path)
    yield w
    w.close()


def fallback_kind(message: str) -> str:
    """A fallback warning without what varies between programs (source line, output name)."""
    message = re.sub(r" \(at <fuzz program>:\d+\)", "", message)
    return re.sub(r"output '\w+'", "output", message)


class Tally:
    def __init__(self):
        self.status = collections.Counter()
        self.failures: list[str] = []
        self.fallbacks = collections.Counter()   # fallback_kind -> programs
        self.fallback_programs = 0
        self.second_size_recompiles = 0

    def add(self, program: Program, verdict: dict) -> None:
        self.status[verdict["status"]] += 1
        if verdict["status"] in FAILURES:
            self.failures.append(report(program, verdict))
        if verdict["fallbacks"]:
            self.fallback_programs += 1
            self.fallbacks.update({fallback_kind(m) for m in verdict["fallbacks"]})
        self.second_size_recompiles += verdict["second_call_recompiled"]

    @property
    def programs(self) -> int:
        return sum(self.status.values())

    def summary(self) -> str:
        return (f"cleave fuzz: {self.programs} programs, {self.status['wrong']} wrong results, "
                f"{self.status['crash']} crashes, {self.status['recompiled']} recompiles on the third call, "
                f"{self.status['invalid']} invalid programs, {self.fallback_programs} with eager fallbacks "
                f"({sum(self.fallbacks.values())} warnings), {self.second_size_recompiles} recompiled "
                f"for the second size")


def run(worker: Worker, program: Program, tally: Tally, log=None) -> None:
    verdict = worker.run(program)
    tally.add(program, verdict)
    if log is not None:
        log.write(json.dumps({"program": json.loads(program.to_json()), "verdict": verdict}) + "\n")
        log.flush()


def fuzz_with_hypothesis(worker: Worker, count: int, random_seed: int | None = None, log=None) -> Tally:
    """Run `count` distinct programs drawn by hypothesis; failures are collected, not
    raised, so that one does not hide the next (and hypothesis does not shrink: each
    step would compile again). Derandomized unless random_seed is given."""
    tally, seen = Tally(), set()

    @settings(max_examples=4 * count, derandomize=random_seed is None, deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(programs())
    def run_one(program):
        key = (program.source(), program.sizes)
        if tally.programs < count and key not in seen:   # hypothesis repeats its simplest programs
            seen.add(key)
            run(worker, program, tally, log)

    if random_seed is not None:
        run_one = seed(random_seed)(run_one)
    run_one()
    return tally


def check_tally(tally: Tally, expected: int) -> None:
    print(tally.summary())
    for text, count in tally.fallbacks.most_common():
        print(f"  {count:4d} programs: {text}")
    assert tally.programs == expected
    assert not tally.failures, tally.summary() + "\n\n" + "\n".join(tally.failures)


def test_seeded_programs_match_eager(worker):
    tally = Tally()
    for s in range(CI_SEEDED):
        run(worker, program_from_seed(s), tally)
    check_tally(tally, CI_SEEDED)


def test_hypothesis_programs_match_eager(worker):
    check_tally(fuzz_with_hypothesis(worker, CI_HYPOTHESIS), CI_HYPOTHESIS)


@pytest.mark.slow
def test_many_programs_match_eager(worker, capsys):
    path = os.environ.get("CLEAVE_FUZZ_REPORT")
    random_seed = os.environ.get("CLEAVE_FUZZ_SEED")
    with open(path, "w") if path else open(os.devnull, "w") as log:
        tally = fuzz_with_hypothesis(worker, SLOW_PROGRAMS, int(random_seed) if random_seed else None, log)
    with capsys.disabled():   # the summary is the point of this run: shown without -s too
        print()
        check_tally(tally, SLOW_PROGRAMS)


# --- the harness itself -----------------------------------------------------------

def assert_well_defined(program: Program) -> None:
    prog, prog64 = load(program.source()), load(program.source(fp64=True))
    for call, n in enumerate(program.sizes):
        _, _, problems = references(program, prog, prog64, make_inputs(program, n, program.seed + call))
        assert not problems, f"{problems}\n{program.source()}sizes {program.sizes}"


@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(programs())
def test_generated_programs_are_well_defined(program):
    """The generator's promise, checked in eager alone (fast): programs run at every
    size, give finite values, and their dtypes' rounding keeps them near fp64."""
    assert_well_defined(program)


def test_seeded_programs_are_well_defined():
    for s in range(300):
        assert_well_defined(program_from_seed(s))


def test_a_deleted_round_trip_is_a_wrong_result():
    """cleave skipping `.to(torch.bfloat16)` gives the fp64 value: close to eager in
    bf16 terms, but off on most elements, which a round-trip output may not be."""
    x = torch.linspace(-2, 2, 50)
    eager = x.to(torch.bfloat16).float() * 3
    program = Program([], [], ["v"], ["round-trip"], (1, 1, 1), 0)
    assert compare(program, (x * 3,), (eager,), (x.double() * 3,))
    one_flip = eager.clone()
    one_flip[7] += 2 ** -8 * 3   # one element rounded the other way: allowed
    assert not compare(program, (one_flip,), (eager,), (x.double() * 3,))
    assert mismatch(x * 3, eager, Tolerance(TIGHT), "f32 rule")


def test_a_segfault_is_one_programs_crash(worker):
    """The known size-0 interpreter segfaults must not end the run: the worker dies,
    the program is reported as a crash, and the next program runs in a new worker."""
    x = InputSpec("x", [{"dyn": 1}, 3], "f32", -2.0, 2.0)
    die = Program([x], [f"import os; os.kill(os.getpid(), {int(signal.SIGSEGV)})"], ["x"], ["f32"], (3, 5, 3), 0)
    verdict = worker.run(die)
    assert verdict["status"] == "crash" and f"exit status -{int(signal.SIGSEGV)}" in verdict["problems"][0], verdict
    fine = Program([x], ["v1 = torch.tanh(x)"], ["v1"], ["f32"], (3, 5, 3), 0)
    assert worker.run(fine)["status"] == "ok"
