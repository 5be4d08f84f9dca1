"""A continuous-batching engine with a paged KV cache, writing FlashInfer-Trace workloads
for the nine paged and ragged definitions of FlashInfer-Bench (issue 14).

    python traces/simulate_paged.py --seed 0 --out traces/paged

Requests arrive and are sized as in simulate.py (log-normal prompts and outputs). The
engine keeps one page pool per page size (1 and 64 tokens) with a free list: a
finished request's pages go back to the front of the list and are handed out again,
and decoding requests take a new page each in turn, so a request's pages are not
contiguous. Prompts are prefilled in chunks under a per-step token budget (a prompt
longer than the budget spans steps: later chunks attend to the earlier ones' cached
kv). Each step emits what the kernels see, as the requests' lengths and page lists:

- decode steps feed the decode definitions (ps1, ps64 with each last page's fill, MLA);
- prefill steps feed the paged prefill definitions (ps1, GQA and MLA) and the ragged
  ones (the same chunks with kv packed).

A workload line holds its index tensors inline (`{"type": "inline", "value": [...]}`,
cleave's extension of the format's "random" and "scalar" inputs), its floats random and
sm_scale as a scalar. Deterministic for a seed.
"""
from __future__ import annotations

import argparse
import json
import random
import uuid
from pathlib import Path

from cleave.runtime.traces import lognormal, poisson
from cleave.workloads import flashinfer as F

PROMPT = (256, 1.0, 16, 4096)   # median, sigma, min, max (as simulate.py)
OUTPUT = (192, 0.8, 8, 1024)


class Pool:
    """Pages of one size; the free list hands out the most recently freed first."""

    def __init__(self, pages: int):
        self.size = pages
        self.free = list(range(pages - 1, -1, -1))  # pop() takes page 0 first

    def take(self) -> int:
        return self.free.pop()

    def give(self, pages) -> None:
        self.free.extend(reversed(pages))


class Request:
    def __init__(self, prompt: int, output: int):
        self.prompt, self.left, self.kv = prompt, output, 0
        self.pages: dict[int, list[int]] = {1: [], 64: []}

    def grow(self, tokens: int, pools: dict[int, Pool]) -> None:
        self.kv += tokens
        for size, pool in pools.items():
            while len(self.pages[size]) * size < self.kv:
                self.pages[size].append(pool.take())


def simulate(seed: int = 0, per_definition: int = 34, rate: float = 0.6, max_batch: int = 64,
             chunk_budget: int = 2048, pool_tokens: int = 1 << 18, prompt=PROMPT, output=OUTPUT,
             warmup: int = 600):
    """{definition: [(q lens, kv lens, pages per request, pool size)]}, `per_definition`
    steps each, spread evenly over the run. Nothing is recorded in the first `warmup`
    steps: a server that has run a while has a free list of scattered pages."""
    rng = random.Random(seed)
    pools = {1: Pool(pool_tokens), 64: Pool(pool_tokens // 64 + max_batch)}  # + a partial last page each
    waiting: list[Request] = []
    prefilling: list[Request] = []
    running: list[Request] = []
    decode_steps, prefill_steps = [], []
    step = 0
    while min(len(decode_steps), len(prefill_steps)) < 4 * per_definition:
        waiting += [Request(lognormal(rng, prompt), lognormal(rng, output)) for _ in range(poisson(rng, rate))]
        while waiting and len(running) + len(prefilling) < max_batch \
                and _room(pools[1], running + prefilling + waiting[:1]):
            prefilling.append(waiting.pop(0))
        step += 1
        if running:
            for r in running:
                r.grow(1, pools)
                r.left -= 1
            if step > warmup:
                decode_steps.append([(1, r.kv, {s: list(p) for s, p in r.pages.items()}) for r in running])
        budget, chunks = chunk_budget, []
        for r in prefilling:
            q = min(r.prompt - r.kv, budget)
            if q <= 0:
                break
            budget -= q
            r.grow(q, pools)
            chunks.append((q, r.kv, {s: list(p) for s, p in r.pages.items()}))
        if chunks and step > warmup:
            prefill_steps.append(chunks)
        done = [r for r in running if r.left <= 0]
        for r in done:
            for size, pool in pools.items():
                pool.give(r.pages[size])
        running = [r for r in running if r.left > 0] + [r for r in prefilling if r.kv == r.prompt]
        prefilling = [r for r in prefilling if r.kv < r.prompt]
    out = {}
    for name in F.FLASHINFER_BENCH:
        steps = prefill_steps if F.kind_of(name).prefill else decode_steps
        size = F.DEFINITIONS[name][1].get("page_size", 1)
        picked = steps[:: max(1, len(steps) // per_definition)][:per_definition]
        out[name] = [([q for q, _, _ in s], [kv for _, kv, _ in s], [p[size] for _, _, p in s], pools[size].size)
                     for s in picked]
    return out


def _room(pool: Pool, requests) -> bool:
    """Whether the pool holds every token these requests will still write (admission
    never runs out of pages later)."""
    return sum(r.prompt + r.left - r.kv for r in requests) <= len(pool.free)


def workload_line(name: str, step, seed: int, i: int) -> dict:
    """One FlashInfer-Trace workload line: the var axes and the step's index tensors."""
    q_lens, kv_lens, pages, pool = step
    kind = F.kind_of(name)
    ints = F.index_values(name, q_lens, pages, kv_lens)
    inputs = {inp: {"type": "scalar", "value": F.default_scale(F.DEFINITIONS[name][1])} if inp == "sm_scale" else
              {"type": "inline", "value": ints[inp]} if inp in ints else {"type": "random"} for inp in kind.inputs}
    axes = {a: n for a, n in F.sizes(name, q_lens, kv_lens, pages, pool).items() if a in kind.var}
    return {"definition": name, "workload": {"uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"cleave/{name}/{seed}/{i}")),
                                             "axes": axes, "inputs": inputs}}


def write(out_dir: Path, seed: int = 0, **kwargs) -> list[Path]:
    written = []
    for name, steps in simulate(seed, **kwargs).items():
        d_path = out_dir / "definitions" / f"{name}.json"
        w_path = out_dir / "workloads" / f"{name}.jsonl"
        d_path.parent.mkdir(parents=True, exist_ok=True)
        w_path.parent.mkdir(parents=True, exist_ok=True)
        d_path.write_text(json.dumps(F.definition(name), indent=2) + "\n")
        w_path.write_text("".join(json.dumps(workload_line(name, s, seed, i)) + "\n" for i, s in enumerate(steps)))
        written += [d_path, w_path]
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-definition", type=int, default=34, help="shapes per definition (34 x 9 = 306)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "paged")
    args = p.parse_args(argv)
    for path in write(args.out, args.seed, per_definition=args.per_definition):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
