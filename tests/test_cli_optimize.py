"""`cleave optimize`: candidates, the scheduled plan in --json, kernels written by --emit."""
import json
import os
import subprocess
import sys

from cleave.cli.main import main


def test_optimize_json_has_candidates_and_a_plan(capsys):
    assert main(["optimize", "gqa_decode", "--json", "--quiet", "--top-k", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["candidates"] and out["candidates"][0]["derivation"]
    plan = out["plan"]
    assert plan["shapes"] == {"b": 8, "hkv": 8, "g": 4, "L": 8192, "d": 128}  # the first preset
    assert set(plan) >= {"kernels", "split", "tiles", "cost"}
    assert len(plan["kernels"]) == (2 if plan["split"].get("s_L", 1) > 1 else 1)
    for k in plan["kernels"]:
        assert k["name"] and k["grid"] and "@triton.jit" in k["source"]


def test_emit_writes_kernels_that_run(tmp_path, capsys):
    out = tmp_path / "kernels"
    args = ["optimize", "layernorm", "--quiet", "--shape", "t=7", "--shape", "n=37", "--emit", str(out)]
    assert main(args) == 0
    files = sorted(os.listdir(out))
    assert "plan.json" in files and "run.py" in files and any(f.startswith("layernorm_k") for f in files)
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, str(out / "run.py")], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    error = float(run.stdout.split("relative error")[1].split()[0])
    assert error < 1e-2


def test_a_graph_file_without_shapes_is_a_clear_error(tmp_path, capsys):
    from cleave import workloads

    path = tmp_path / "g.cir"
    path.write_text(workloads.get("layernorm").graph.text())
    assert main(["optimize", str(path), "--quiet"]) == 2
    assert "no value for n, t" in capsys.readouterr().err
