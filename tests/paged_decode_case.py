"""A small FlashInfer-style paged decode (tests of its plans): requests of the given
lengths with their pages scattered over a pool, bf16 q and caches of 2 kv heads of 16,
captured with the serving axes dynamic and searched."""
import torch

import cleave
from cleave.frontends.capture import capture
from cleave.workloads.paged import gqa_paged_decode

DYNAMIC = {"q": {0: "b"}, "k_cache": {0: "pages"}, "v_cache": {0: "pages"}, "kv_indptr": {0: "b1"},
           "kv_indices": {0: "nnz"}}


def paged_decode_case(lens: list[int], pool: int, heads: int, seed: int):
    """(graph, inputs, binding, its dynamic symbols, the search's first candidate)."""
    gen = torch.Generator().manual_seed(seed)
    pages = torch.randperm(pool, generator=gen)[:sum(lens)].to(torch.int32)
    indptr = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(len(lens), heads, 16, generator=gen).to(torch.bfloat16)
    k_cache, v_cache = (torch.randn(pool, 1, 2, 16, generator=gen).to(torch.bfloat16) for _ in range(2))
    inputs = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "kv_indptr": indptr, "kv_indices": pages,
              "sm_scale": torch.tensor(0.25)}
    graph = capture(gqa_paged_decode, *inputs.values(), dynamic=DYNAMIC)
    env = graph.bind({k: tuple(v.shape) for k, v in inputs.items()})
    dynamic = {"b", "pages", "b1", "nnz"} & set(env)
    return graph, inputs, env, dynamic, cleave.search(graph).candidates[0]
