"""`benchmarks.sm90` compiles a plan's kernels for sm_90 without a GPU. Here it checks,
with the Triton installed, the pipelining fact the cost model relies on for paged KV
(kernel_stats.Stats.gathered): a tile gathered through indices loaded in its loop gets
one shared-memory buffer at 2, 3 and 4 stages, and the code at 4 stages is the code at 3.
It compiles in a process of its own: this one runs Triton's interpreter."""
import json
import os
import subprocess
import sys

import pytest

from cleave import search, workloads
from cleave.scheduler import schedule

pytest.importorskip("triton.backends.nvidia")

MLA = "mla_paged_decode_h16_ckv512_kpe64_ps1"
FLASH_DECODING = ["split-max", "split-softmax-matmul", "split-softmax-sum"]  # the split form without scale-add


def _rows(plans_dir, *launch):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "benchmarks.sm90", "--plans", str(plans_dir), "--launch", *launch],
                         capture_output=True, text=True, env=env, check=True).stdout
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()[2:]]
    return {(r[2], int(r[4])): {"shared": int(r[5]), "regs": int(r[6]), "buffers": r[8].split(", ")} for r in rows}


def test_a_gathered_tile_gets_one_buffer_at_any_stage_count(tmp_path):
    w = workloads.get(MLA)
    cand = next(c for c in search(w.graph).candidates if c.derivation == FLASH_DECODING)
    (plan,) = schedule(cand, w.presets["h200"], dynamic=set(), top_k=1, split={"s_num_kv_indices": 4})
    data = plan.to_json()
    data["kernels"] = [k for k in data["kernels"] if "kv_indices" in k["source"]]
    (tmp_path / "mla.json").write_text(json.dumps({"workload": MLA, "plans": [data]}))
    rows = _rows(tmp_path, "4,2", "4,3", "4,4")
    (name,) = {k[0] for k in rows}
    assert rows[name, 3]["shared"] == rows[name, 4]["shared"]
    latent = [b for b in rows[name, 3]["buffers"] if b.endswith("x512")]
    assert latent and all(b.startswith("1x") or b.count("x") == 1 for b in latent), rows[name, 3]
    assert all(0 < r["regs"] <= 255 for r in rows.values())
