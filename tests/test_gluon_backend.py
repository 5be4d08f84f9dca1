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
import re
import subprocess
import sys
import types

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


def _program_bounds(source: str, fn: str, pid: int, env: dict) -> dict:
    """The integers a consumer's program computes before its loop (its tile ids, the
    loop's bounds and the whole-tile run's), evaluated in Python from the source."""
    body = source.split(f"def {fn}(")[1].split("q_smem.store(")[0].splitlines()[1:]
    scope = {"tl": types.SimpleNamespace(minimum=min, maximum=max), "pid": pid, **env}
    for line in body:
        name, _, expr = line.strip().partition(" = ")
        if not expr or "program_id" in expr or re.search(r"gl\.|tl\.load|idx|\bv\d", expr):
            continue
        scope[name] = eval(expr.replace(".to(tl.int32)", ""), scope)  # the generated integer code
    return scope


@pytest.mark.parametrize("name, env, visible", [
    ("mha_causal", {"b": 1, "h": 2, "s": 300, "d": 64}, lambda i, j: j <= i),
    ("gqa_causal", {"b": 1, "hkv": 1, "g": 2, "s": 449, "d": 128}, lambda i, j: j <= i),
    ("mha_alibi", {"b": 1, "h": 2, "s": 300, "d": 64}, lambda i, j: j <= i),
    ("window 300", {"b": 1, "h": 2, "s": 700, "d": 64}, lambda i, j: i - 300 < j <= i),
])
def test_steps_without_masks_run_only_on_tiles_where_every_mask_holds(name, env, visible):
    """The twin's steps on whole tiles are rendered without the masks (causal: 3% of the
    kernel's time on the H100, the window 10%; RESULTS.md, session 42). Evaluated from
    the source for every program and both row halves: each such tile lies inside the
    keys and every mask holds on all of it; the loop covers every visible key."""
    from cleave.workloads.attention_variants import window_graph

    graph = window_graph(300) if name == "window 300" else W.get(name).graph
    k = next(k for k in _gluon_plan(schedule(search(graph).candidates[0], env, top_k=2)).kernels
             if k.dialect == "gluon")
    row = re.search(rf"idx(\d+) = tid\1 \* {2 * G.ROWS} \+ gl.arange\(0, {G.ROWS}", k.source).group(1)
    x, bx = re.search(r"\bn(\d+) = .*// (\d+)\)", k.source).groups()
    s, bx = env["s"], int(bx)  # the keys' step: the output's width
    programs = -(-s // (2 * G.ROWS)) * env["b"] * env.get("h", env.get("hkv", 1) * env.get("g", 1))
    whole_steps = 0
    for pid in range(programs):
        for wg in range(G.CONSUMERS):
            at = _program_bounds(k.source, f"{k.name}_wg{wg}", pid, env)
            first = at[f"tid{row}"] * 2 * G.ROWS + wg * G.ROWS
            mine = range(first, min(first + G.ROWS, s))
            lo, n = at[f"lo{x}"], at[f"n{x}"]
            for j in range(at[f"whole_lo{x}"], at[f"whole_hi{x}"]):
                keys = range(lo + j * bx, lo + (j + 1) * bx)
                assert keys[-1] < s and all(visible(i, key) for i in mine for key in keys), (pid, wg, j)
                whole_steps += 1
            assert all(lo <= key < lo + n * bx for i in mine for key in range(s) if visible(i, key)), (pid, wg)
    assert whole_steps > 0  # the form is exercised


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
    for name in ("mha_causal", "mha_softcap", "rope_attention_causal", "gqa_causal", "mha_window"):
        env = {**W.get(name).presets["prefill"], "d": 128}
        # the window's batch and length dynamic, as a layer's (int64 tile ids, int32 ring steps)
        dynamic = {"b", "s"} if name == "mha_window" else set()
        spec = {"workload": name, "plans": [_gluon_plan(_plans(name, env, dynamic=dynamic)).to_json()]}
        (tmp_path / f"{name}.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "benchmarks.sm90", "--plans", str(tmp_path)],
                         capture_output=True, text=True, env=env, check=True).stdout
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()[2:] if line.startswith("| ")]
    gluon = [r for r in rows if r[9].startswith("gluon")]
    assert len(gluon) == 5, out
    for r in gluon:
        assert 0 < int(r[5]) <= H200_SHARED and r[7] == "0" and r[9] == "gluon (setmaxnreg)", r
