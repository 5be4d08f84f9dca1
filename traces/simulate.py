"""A small continuous-batching simulator that writes FlashInfer-Trace workloads.

    python traces/simulate.py --seed 0 --out traces

Requests arrive as a Poisson process (mean `--rate` per engine step). Prompt and
output lengths are log-normal, the shape chat traffic shows (ShareGPT-style
conversations: most turns a few hundred tokens, a long right tail): prompts have
median 256 tokens (sigma 1.0, clipped to [16, 4096]), outputs median 192 (sigma
0.8, clipped to [8, 1024]). These are stated assumptions in the range published
ShareGPT statistics show, not fitted to a dataset.

The engine admits waiting requests while fewer than `max_batch` sequences run and
the step's prefill token budget lasts, then decodes one token for every running
sequence; finished sequences leave. Each step emits what the kernels see:

- `gqa` (prefill, causal): batch = prompts admitted this step, s = the longest of
  them; shorter prompts are padded at the end, which causal attention makes
  harmless for their real tokens.
- `gqa_decode`: batch = sequences decoding this step, L = the longest kv length
  among them. The batch is padded to that length: the dense operator an
  unpaged engine runs, an upper bound on the ragged batch's work. Both sides of a
  replay run the same dense computation, so the comparison is fair.

Deterministic for a seed: the same seed writes byte-identical files.
"""
from __future__ import annotations

import argparse
import json
import random
import uuid
from pathlib import Path

from cleave.runtime.traces import lognormal, poisson

PROMPT = (256, 1.0, 16, 4096)   # median, sigma, min, max
OUTPUT = (192, 0.8, 8, 1024)
MODEL = {"hkv": 8, "g": 4, "d": 128}  # Llama-3-8B-style GQA: 32 q heads over 8 kv heads


def simulate(seed: int = 0, min_shapes: int = 120, rate: float = 0.6, max_batch: int = 64,
             prefill_budget: int = 8192) -> dict[str, list[dict[str, int]]]:
    """Step-by-step shapes: {"gqa": [{"b", "s"}...], "gqa_decode": [{"b", "L"}...]}."""
    rng = random.Random(seed)
    waiting: list[tuple[int, int]] = []
    running: list[list[int]] = []  # [kv length, tokens left to generate]
    out: dict[str, list[dict[str, int]]] = {"gqa": [], "gqa_decode": []}
    while min(len(v) for v in out.values()) < min_shapes:
        waiting += [(lognormal(rng, PROMPT), lognormal(rng, OUTPUT)) for _ in range(poisson(rng, rate))]
        decoding = [seq for seq in running]
        admitted, budget = [], prefill_budget
        while waiting and len(running) + len(admitted) < max_batch and waiting[0][0] <= budget:
            prompt, gen = waiting.pop(0)
            budget -= prompt
            admitted.append([prompt, gen])
        if admitted:
            out["gqa"].append({"b": len(admitted), "s": max(p for p, _ in admitted)})
        if decoding:
            for seq in decoding:
                seq[0] += 1
                seq[1] -= 1
            out["gqa_decode"].append({"b": len(decoding), "L": max(seq[0] for seq in decoding)})
        running = [seq for seq in decoding if seq[1] > 0] + admitted
    return out


def definitions() -> dict[str, dict]:
    axes = {"h": {"type": "const", "value": MODEL["hkv"] * MODEL["g"], "description": "query heads"},
            "hkv": {"type": "const", "value": MODEL["hkv"], "description": "kv heads"},
            "d": {"type": "const", "value": MODEL["d"], "description": "head dim"}}
    bf16 = "bfloat16"
    return {
        "gqa_decode": {
            "name": "gqa_decode", "op_type": "gqa_decode",
            "description": "GQA decode over a batch padded to the step's longest kv length",
            "tags": ["cleave_workload:gqa_decode", "status:verified"],
            "axes": {"b": {"type": "var", "description": "sequences decoding this step"},
                     "one": {"type": "const", "value": 1, "description": "one query token"},
                     "L": {"type": "var", "description": "longest kv length in the step"}, **axes},
            "inputs": {"q": {"shape": ["b", "h", "one", "d"], "dtype": bf16},
                       "k": {"shape": ["b", "hkv", "L", "d"], "dtype": bf16},
                       "v": {"shape": ["b", "hkv", "L", "d"], "dtype": bf16}},
            "outputs": {"o": {"shape": ["b", "h", "one", "d"], "dtype": bf16}},
            "reference": "import torch\n\ndef run(q, k, v):\n"
                         "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)\n",
        },
        "gqa": {
            "name": "gqa", "op_type": "gqa_prefill",
            "description": "causal GQA prefill over the prompts admitted in one step, padded to the longest",
            "tags": ["cleave_workload:gqa_causal", "status:verified"],
            "axes": {"b": {"type": "var", "description": "prompts admitted this step"},
                     "s": {"type": "var", "description": "longest prompt admitted"}, **axes},
            "inputs": {"q": {"shape": ["b", "h", "s", "d"], "dtype": bf16},
                       "k": {"shape": ["b", "hkv", "s", "d"], "dtype": bf16},
                       "v": {"shape": ["b", "hkv", "s", "d"], "dtype": bf16}},
            "outputs": {"o": {"shape": ["b", "h", "s", "d"], "dtype": bf16}},
            "reference": "import torch\n\ndef run(q, k, v):\n"
                         "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,"
                         " enable_gqa=True)\n",
        },
    }


def workload_lines(name: str, shapes: list[dict[str, int]], seed: int) -> list[dict]:
    inputs = {k: {"type": "random"} for k in definitions()[name]["inputs"]}
    return [{"definition": name,
             "workload": {"uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"cleave/{name}/{seed}/{i}")),
                          "axes": dict(binding), "inputs": inputs}}
            for i, binding in enumerate(shapes)]


def write(out_dir: Path, seed: int = 0, min_shapes: int = 120) -> list[Path]:
    shapes = simulate(seed, min_shapes)
    written = []
    for name, definition in definitions().items():
        d_path = out_dir / "definitions" / f"{name}.json"
        w_path = out_dir / "workloads" / f"{name}.jsonl"
        d_path.parent.mkdir(parents=True, exist_ok=True)
        w_path.parent.mkdir(parents=True, exist_ok=True)
        d_path.write_text(json.dumps(definition, indent=2) + "\n")
        w_path.write_text("".join(json.dumps(line) + "\n" for line in workload_lines(name, shapes[name], seed)))
        written += [d_path, w_path]
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-shapes", type=int, default=120, help="at least this many shapes per operator")
    p.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = p.parse_args(argv)
    for path in write(args.out, args.seed, args.min_shapes):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
