"""The trace generator (traces/simulate.py) and the FlashInfer-Trace format."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cleave.runtime.traces import TraceError, load_trace, validate_definition, validate_workload

TRACES = Path(__file__).parent.parent / "traces"
_spec = importlib.util.spec_from_file_location("simulate", TRACES / "simulate.py")
simulate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(simulate)


def test_simulator_is_deterministic_for_a_seed_and_differs_across_seeds():
    assert simulate.simulate(seed=3, min_shapes=100) == simulate.simulate(seed=3, min_shapes=100)
    assert simulate.simulate(seed=3, min_shapes=100) != simulate.simulate(seed=4, min_shapes=100)


def test_written_files_are_byte_identical_per_seed(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    simulate.write(a, seed=7, min_shapes=100)
    simulate.write(b, seed=7, min_shapes=100)
    for path in a.rglob("*"):
        if path.is_file():
            assert path.read_bytes() == (b / path.relative_to(a)).read_bytes()


def test_shapes_follow_the_engine_rules():
    shapes = simulate.simulate(seed=0, min_shapes=100)
    assert len(shapes["gqa"]) >= 100 and len(shapes["gqa_decode"]) >= 100
    assert all(1 <= s["b"] <= 64 for s in shapes["gqa_decode"])
    assert all(simulate.PROMPT[2] <= s["s"] <= simulate.PROMPT[3] for s in shapes["gqa"])
    assert all(s["L"] > 1 for s in shapes["gqa_decode"])
    assert len({(s["b"], s["L"]) for s in shapes["gqa_decode"]}) > 50  # the shapes really vary


@pytest.mark.parametrize("name", ["gqa_decode", "gqa"])
def test_repo_traces_validate_and_match_the_generator(name):
    definition, lines = load_trace(TRACES / "workloads" / f"{name}.jsonl")
    assert len(lines) >= 100
    expected = simulate.workload_lines(name, simulate.simulate(seed=0, min_shapes=120)[name], 0)
    assert lines == expected  # the committed trace is what `python traces/simulate.py --seed 0` writes
    assert definition == simulate.definitions()[name]


def test_validation_rejects_malformed_entries():
    good = simulate.definitions()["gqa_decode"]
    bad = json.loads(json.dumps(good))
    bad["inputs"]["q"]["shape"][0] = "batch"
    with pytest.raises(TraceError, match="undeclared axes"):
        validate_definition(bad)
    validate_definition(good)
    line = simulate.workload_lines("gqa_decode", [{"b": 2, "L": 9}], 0)[0]
    validate_workload(line, good)
    line["workload"]["axes"] = {"b": 2}
    with pytest.raises(TraceError, match="var axes"):
        validate_workload(line, good)
    line["workload"]["axes"] = {"b": 0, "L": 3}
    with pytest.raises(TraceError, match="positive"):
        validate_workload(line, good)
    line["workload"]["axes"] = {"b": True, "L": 3}  # JSON's true is no extent (it read as b = 1)
    with pytest.raises(TraceError, match=r"axes \['b'\] are not positive ints"):
        validate_workload(line, good)
    del line["workload"]["uuid"]
    with pytest.raises(TraceError, match="^a workload without a uuid: axes"):
        validate_workload(line, good)
    const = json.loads(json.dumps(good))
    const["axes"][next(a for a, s in const["axes"].items() if s["type"] == "const")]["value"] = True
    with pytest.raises(TraceError, match="needs a positive int value"):
        validate_definition(const)
