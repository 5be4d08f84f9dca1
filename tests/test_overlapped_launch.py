"""Programmatic dependent launch: every kernel the scheduler emits ends its parameters
with a `PDL` switch. On sm_90 the launcher sets it and launches the kernel so that it
may start while the kernel before it finishes; the kernel then waits for that one's
writes before it touches memory. Here: the wait comes first in the code compiled for
sm_90 (a process of its own, this one runs Triton's interpreter), the interpreter and
older GPUs run with the switch off, and plans saved before the switch still launch."""
import json
import os
import re
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from cleave import workloads as W
from cleave.runtime import launch as L
from cleave.scheduler import H200, schedule
from cleave.scheduler.plan import Plan
from fixtures_candidates import CANDIDATES
from kernel_check import LOOPS, run_and_check

_PTX_SCRIPT = r'''
import json, re, sys
from benchmarks.sm90 import compile_sm90

MEMORY = re.compile(r"^\s*(@%p\d+\s+)?(ld\.global|st\.global|atom\.|red\.|cp\.async|cp\.reduce)", re.M)
plans = json.loads(sys.stdin.read())
for plan in plans:
    for kernel in plan["kernels"]:
        for pdl in (True, False):
            ptx = compile_sm90(plan, kernel, kernel["num_warps"], kernel["num_stages"], pdl=pdl)["ptx"]
            wait, first = ptx.find("griddepcontrol.wait"), MEMORY.search(ptx)
            print(json.dumps({"kernel": kernel["name"], "pdl": pdl, "wait": wait,
                              "launch": ptx.find("griddepcontrol.launch_dependents"),
                              "memory": first.start() if first else -1}))
'''


def _plans() -> list[Plan]:
    """A TMA GEMM, causal attention, and a split decode with its combine as a kernel of
    its own and in its partial kernel (atomics)."""
    decode, env = CANDIDATES["gqa_decode"](), W.get("gqa_decode").presets["b8_L8192"]
    plans = [schedule(W.get(name).graph, W.get(name).presets[preset], top_k=1)[0]
             for name, preset in (("matmul", "s4096"), ("mha_causal", "prefill"))]
    plans.append(schedule(decode, env, top_k=1, split={"sp": 17})[0])
    small = {"b": 3, "hkv": 2, "g": 3, "L": 77, "d": 16}  # as test_combine_in_kernel.py fuses it
    return plans + [schedule(decode, small, dynamic={"b", "L"}, target=LOOPS, top_k=1, split={"sp": 4})[0]]


def test_every_kernel_waits_for_the_one_before_it_before_touching_memory_on_sm90():
    pytest.importorskip("triton.backends.nvidia")
    plans = _plans()
    assert [len(p.kernels) for p in plans[2:]] == [2, 1] and plans[3].kernels[0].arrivals
    assert all(k.overlapped and "PDL: tl.constexpr" in k.source for p in plans for k in p.kernels)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _PTX_SCRIPT], input=json.dumps([p.to_json() for p in plans]),
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 2 * sum(len(p.kernels) for p in plans)
    for r in rows:
        assert r["memory"] >= 0, r
        if r["pdl"]:
            assert 0 <= r["wait"] < r["memory"] and r["wait"] < r["launch"], r
        else:
            assert r["wait"] == -1 and r["launch"] == -1, r


def test_the_launcher_overlaps_compiled_kernels_on_sm90_only(monkeypatch):
    cuda = torch.device("cuda", 0)
    assert not L._overlaps(None) and not L._overlaps(torch.device("cpu"))
    assert not L._overlaps(cuda)  # interpreted here
    monkeypatch.setattr(L, "_INTERPRETED", False)
    for capability, overlaps in (((9, 0), True), ((10, 0), True), ((8, 9), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        assert L._overlaps(cuda) is overlaps
    monkeypatch.setattr(L, "OVERLAP_LAUNCHES", False)  # CLEAVE_OVERLAP_LAUNCHES=0
    assert not L._overlaps(cuda)


def test_a_launch_passes_the_switch_off_in_the_interpreter():
    env = {"s": 37, "k": 56, "n": 40}
    graph = W.get("matmul").graph
    plan = schedule(graph, env, top_k=1, target=LOOPS)[0]
    prepared = L.prepare(plan, W.get("matmul").inputs(env, seed=0))
    assert prepared.switches == [[False]] and "launch_pdl" not in prepared.kernels[0][3]
    run_and_check(graph, plan, env, seed=3)


def test_a_plan_saved_before_the_switch_still_launches():
    """Plans in artifacts and caches written before the switch existed: no `PDL`
    parameter, no `overlapped` field."""
    env = {"b": 1, "h": 2, "s": 45, "d": 16}
    graph = W.get("mha").graph
    plan = schedule(graph, env, top_k=1, target=H200)[0]
    data = plan.to_json()
    for k in data["kernels"]:
        del k["overlapped"]
        k["source"] = re.sub(r", PDL: tl\.constexpr\)", ")", k["source"])
        k["source"] = re.sub(r"\n    if PDL:.*\n.*gdc_wait\(\)\n.*gdc_launch_dependents\(\)", "", k["source"])
        assert "PDL" not in k["source"]
    old = Plan.from_json(data)
    assert not any(k.overlapped for k in old.kernels)
    run_and_check(graph, old, env, seed=4)
