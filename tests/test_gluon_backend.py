"""The Gluon back end (scheduler/gluon.py): an attention-class kernel's warp-specialised
ping-pong form, scheduled beside its `tl` options, compiled for sm_90, and served only
where Gluon runs and only after its output matched the `tl` kernels'.

Here, without a GPU: which kernels get the form and why the others do not; that the
twin plan shares plan 0's partition (the tuning may take either kernel for its slot);
that everywhere Gluon does not run its `tl` twin runs, exactly; that its source
compiles for sm_90 with the installed Triton within the H200's limits; and the
runtime's check of its output. Its output on the GPU is checked in benchmarks (RESULTS.md)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from cleave import search
from cleave import workloads as W
from cleave.runtime import operator
from cleave.runtime.launch import gluon_runs_on, launch
from cleave.runtime.mix import launch_variants, partition_key
from cleave.scheduler import Plan, schedule
from cleave.scheduler import gluon as G
from kernel_check import ATTENTION_BINDINGS

H200_SHARED = 232448  # bytes a program may opt into on sm_90

# The attention workloads at a head dim the Gluon form takes (64) and a length past a
# tile that the keys' loop takes (300: partial last tiles of 64 and 128 rows). RoPE's
# keys are rotated in the loop at this length (at the prefill's, by a kernel before it:
# test_twins_compile_for_sm90...).
BINDINGS = {name: {**env, "d": 64, "s": 300} for name, env in ATTENTION_BINDINGS.items()
            if name != "rope_attention_causal"}


def _plans(name, env=None, **kw):
    w = W.get(name)
    return schedule(search(w.graph).candidates[0], env or BINDINGS[name], top_k=2, **kw)


def _gluon_plan(plans):
    found = [p for p in plans if any(k.dialect == "gluon" for k in p.kernels)]
    return found[0] if found else None


def test_at_a_full_grid_the_twin_shares_plan_zeros_partition():
    """Where the `tl` kernel reads K and V through descriptors (its grid fills the GPU),
    the twin takes its arguments: the runtime's tuning may take either kernel."""
    plans = _plans("mha_causal", W.get("mha_causal").presets["prefill"])
    assert partition_key(_gluon_plan(plans)) == partition_key(plans[0])


@pytest.mark.parametrize("name", sorted(BINDINGS))
def test_attention_kernels_get_a_twin(name):
    plans = _plans(name)
    twin = _gluon_plan(plans)
    assert twin is plans[-1] and twin is not plans[0], G.last_refusal
    for k, first in zip(twin.kernels, plans[0].kernels):
        if k.dialect == "gluon":
            assert k.fallback.source == first.source
            # the `tl` kernel's arguments, and descriptors of K and V where it has none
            assert k.args[:len(first.args)] == first.args or \
                [a for a in k.args if not a.endswith("_gdesc")] == first.args
            assert "warp_specialize" in k.source and "warpgroup_mma" in k.source
            assert launch_variants(k) == []  # one launch configuration: the one checked
        else:
            assert k is first
    assert Plan.from_json(json.loads(json.dumps(twin.to_json()))).to_json() == twin.to_json()


@pytest.mark.parametrize("name, env, why", [
    ("gqa_decode", {"b": 2, "hkv": 2, "g": 4, "L": 300, "d": 64}, "row tiles of 64"),  # 4 query rows a program
    ("mha_causal", {"b": 1, "h": 2, "s": 300, "d": 32}, "width 32"),
])
def test_other_kernels_get_none_and_say_why(name, env, why):
    plans = _plans(name, env)
    assert _gluon_plan(plans) is None
    assert G.last_refusal and why in G.last_refusal


def test_no_twin_when_the_target_turns_it_off():
    import dataclasses

    from cleave.scheduler import H200

    plans = _plans("mha_causal", target=dataclasses.replace(H200, gluon=False))
    assert _gluon_plan(plans) is None


@pytest.mark.parametrize("name", ["mha_causal", "mha_window", "gqa_causal"])
def test_off_hopper_the_twin_runs_its_tl_kernels_exactly(name):
    plans = _plans(name)
    twin = _gluon_plan(plans)
    assert not gluon_runs_on(torch.device("cpu"))
    inputs = W.get(name).inputs(BINDINGS[name], seed=3)
    want = launch(plans[0], inputs)
    got = launch(twin, inputs, out=[torch.full_like(w, float("nan")) for w in want])
    for w, g in zip(want, got):
        assert torch.equal(w, g)


def test_a_call_with_unaligned_tensors_runs_the_tl_twin(monkeypatch):
    """Where Gluon runs, a call whose tensors do not start 16-byte aligned (a view at an
    odd offset) cannot take TMA descriptors: its Gluon kernel's `tl` twin runs instead."""
    from cleave.runtime import launch as L

    monkeypatch.setattr(L, "gluon_runs_on", lambda device: True)  # the interpreter stands in for the GPU
    plans = _plans("mha_causal")
    twin = _gluon_plan(plans)
    inputs = W.get("mha_causal").inputs(BINDINGS["mha_causal"], seed=7)
    shifted = {k: torch.cat([v.new_zeros(1), v.flatten()])[1:].view(v.shape) for k, v in inputs.items()}
    assert all(t.data_ptr() % 16 for t in shifted.values())
    prepared = L.prepare(twin, shifted)
    assert prepared.fallbacks[0] is not None  # the Gluon kernel was chosen at these shapes
    want = launch(plans[0], inputs)
    got = L.run(prepared, shifted)
    for w, g in zip(want, got):
        assert torch.equal(w, g)


def test_the_runtime_check_compares_against_the_tl_kernels(monkeypatch):
    twin = _gluon_plan(_plans("mha_causal"))
    assert operator._gluon_mismatch(twin, torch.device("cpu")) is None
    # on the call's own inputs (the operator's first call, where the plan serves them)
    inputs = W.get("mha_causal").inputs(BINDINGS["mha_causal"], seed=5)
    assert operator._gluon_mismatch(twin, torch.device("cpu"), inputs) is None
    calls = []

    def skewed(plan, inputs, out=None):  # the second launch is the Gluon plan's
        result = launch(plan, inputs, out)
        calls.append(plan)
        if len(calls) == 2:
            result[0][0, 0, 0, 0] = float("nan")
        return result

    monkeypatch.setattr(operator, "launch", skewed)
    assert "NaN" in operator._gluon_mismatch(twin, torch.device("cpu"))
    calls.clear()

    def scaled(plan, inputs, out=None):
        result = launch(plan, inputs, out)
        calls.append(plan)
        return [r * 1.1 for r in result] if len(calls) == 2 else result

    monkeypatch.setattr(operator, "launch", scaled)
    assert "differs" in operator._gluon_mismatch(twin, torch.device("cpu"))


def test_twins_compile_for_sm90_within_the_h200s_limits(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    for name in ("mha_causal", "mha_softcap", "rope_attention_causal", "gqa_causal"):
        env = {**W.get(name).presets["prefill"], "d": 128}
        spec = {"workload": name, "plans": [_gluon_plan(_plans(name, env)).to_json()]}
        (tmp_path / f"{name}.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "benchmarks.sm90", "--plans", str(tmp_path)],
                         capture_output=True, text=True, env=env, check=True).stdout
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()[2:] if line.startswith("| ")]
    gluon = [r for r in rows if r[9].startswith("gluon")]
    assert len(gluon) == 4, out
    for r in gluon:
        assert 0 < int(r[5]) <= H200_SHARED and r[7] == "0" and r[9] == "gluon (setmaxnreg)", r
