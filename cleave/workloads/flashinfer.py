"""FlashInfer-Bench's nine paged and ragged attention definitions (and vLLM's block-table
decode), under FlashInfer-Bench's names and axes: each is a FlashInfer-Trace definition
(`definition(name)`) whose reference is `paged_reference`, and a workload of the suite
whose program is the plain-PyTorch one of `paged`.

The workloads' dynamic axes are the definitions' var axes, so one compiled operator
serves every batch of a definition. `layout_inputs` builds a call's inputs from the
requests' lengths and their page lists (a serving engine's per-step CSR layout).
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass

import torch

from . import paged, paged_reference
from .registry import Workload, register


@dataclass(frozen=True)
class Kind:
    """What a family of definitions computes: its program, reference, inputs and axes."""
    program: object
    reference: object
    inputs: dict[str, tuple[str, ...]]  # name -> shape in axis names (() for the scalar sm_scale)
    var: tuple[str, ...]
    prefill: bool
    description: str


_GQA_HEADS = ("num_qo_heads", "num_kv_heads", "head_dim")
_CACHE = ("num_pages", "page_size", "num_kv_heads", "head_dim")
_MLA = {"ckv_cache": ("num_pages", "page_size", "head_dim_ckv"), "kpe_cache": ("num_pages", "page_size", "head_dim_kpe")}

KINDS = {
    "gqa_paged_decode": Kind(
        paged.gqa_paged_decode, paged_reference.gqa_paged_decode,
        {"q": ("batch_size", "num_qo_heads", "head_dim"), "k_cache": _CACHE, "v_cache": _CACHE,
         "kv_indptr": ("len_indptr",), "kv_indices": ("num_kv_indices",), "sm_scale": ()},
        ("batch_size", "num_pages", "len_indptr", "num_kv_indices"), False,
        "Batched GQA decode over a paged KV cache addressed by CSR page lists"),
    "gqa_paged_decode_last_page": Kind(
        paged.gqa_paged_decode_last_page, paged_reference.gqa_paged_decode_last_page,
        {"q": ("batch_size", "num_qo_heads", "head_dim"), "k_cache": _CACHE, "v_cache": _CACHE,
         "kv_indptr": ("len_indptr",), "kv_indices": ("num_kv_indices",),
         "kv_last_page_len": ("batch_size",), "sm_scale": ()},
        ("batch_size", "num_pages", "len_indptr", "num_kv_indices"), False,
        "Batched GQA decode over multi-token pages, each request's last page partly filled"),
    "gqa_paged_prefill": Kind(
        paged.gqa_paged_prefill_causal, paged_reference.gqa_paged_prefill_causal,
        {"q": ("total_q", "num_qo_heads", "head_dim"), "k_cache": _CACHE, "v_cache": _CACHE,
         "qo_indptr": ("len_indptr",), "kv_indptr": ("len_indptr",), "kv_indices": ("num_kv_indices",),
         "sm_scale": ()},
        ("total_q", "num_pages", "len_indptr", "num_kv_indices"), True,
        "Batched causal GQA prefill over a paged KV cache (incremental prefill)"),
    "gqa_ragged_prefill": Kind(
        paged.gqa_ragged_prefill_causal, paged_reference.gqa_ragged_prefill_causal,
        {"q": ("total_q", "num_qo_heads", "head_dim"), "k": ("total_kv", "num_kv_heads", "head_dim"),
         "v": ("total_kv", "num_kv_heads", "head_dim"), "qo_indptr": ("len_indptr",),
         "kv_indptr": ("len_indptr",), "sm_scale": ()},
        ("len_indptr", "total_q", "total_kv"), True,
        "Batched causal GQA prefill over ragged (packed) q and kv"),
    "mla_paged_decode": Kind(
        paged.mla_paged_decode, paged_reference.mla_paged_decode,
        {"q_nope": ("batch_size", "num_qo_heads", "head_dim_ckv"), "q_pe": ("batch_size", "num_qo_heads", "head_dim_kpe"),
         **_MLA, "kv_indptr": ("len_indptr",), "kv_indices": ("num_kv_indices",), "sm_scale": ()},
        ("batch_size", "num_pages", "len_indptr", "num_kv_indices"), False,
        "Batched absorbed-MLA decode over a paged latent cache"),
    "mla_paged_prefill": Kind(
        paged.mla_paged_prefill_causal, paged_reference.mla_paged_prefill_causal,
        {"q_nope": ("total_q", "num_qo_heads", "head_dim_ckv"), "q_pe": ("total_q", "num_qo_heads", "head_dim_kpe"),
         **_MLA, "qo_indptr": ("len_indptr",), "kv_indptr": ("len_indptr",), "kv_indices": ("num_kv_indices",),
         "sm_scale": ()},
        ("total_q", "num_pages", "len_indptr", "num_kv_indices"), True,
        "Batched causal absorbed-MLA prefill over a paged latent cache"),
    "block_table_decode": Kind(
        paged.block_table_decode, paged_reference.block_table_decode,
        {"q": ("batch_size", "num_qo_heads", "head_dim"), "k_cache": _CACHE, "v_cache": _CACHE,
         "block_tables": ("batch_size", "max_blocks"), "seq_lens": ("batch_size",), "sm_scale": ()},
        ("batch_size", "num_pages", "max_blocks"), False,
        "vLLM-style paged GQA decode: a block table per request and its length"),
}

_GQA8 = {"num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128}
_GQA4 = {**_GQA8, "num_kv_heads": 4}
_MLA16 = {"num_qo_heads": 16, "head_dim_ckv": 512, "head_dim_kpe": 64, "page_size": 1}

# name -> (kind, const axes); the first nine are FlashInfer-Bench's.
DEFINITIONS = {
    "gqa_paged_decode_h32_kv8_d128_ps1": ("gqa_paged_decode", {**_GQA8, "page_size": 1}),
    "gqa_paged_decode_h32_kv4_d128_ps1": ("gqa_paged_decode", {**_GQA4, "page_size": 1}),
    "gqa_paged_decode_h32_kv8_d128_ps64": ("gqa_paged_decode_last_page", {**_GQA8, "page_size": 64}),
    "gqa_paged_prefill_causal_h32_kv8_d128_ps1": ("gqa_paged_prefill", {**_GQA8, "page_size": 1}),
    "gqa_paged_prefill_causal_h32_kv4_d128_ps1": ("gqa_paged_prefill", {**_GQA4, "page_size": 1}),
    "gqa_ragged_prefill_causal_h32_kv8_d128": ("gqa_ragged_prefill", _GQA8),
    "gqa_ragged_prefill_causal_h32_kv4_d128": ("gqa_ragged_prefill", _GQA4),
    "mla_paged_decode_h16_ckv512_kpe64_ps1": ("mla_paged_decode", _MLA16),
    "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1": ("mla_paged_prefill", _MLA16),
    "block_table_decode_h32_kv8_d128_ps16": ("block_table_decode", {**_GQA8, "page_size": 16}),
}
FLASHINFER_BENCH = tuple(DEFINITIONS)[:9]


def kind_of(name: str) -> Kind:
    return KINDS[DEFINITIONS[name][0]]


def dynamic_axes(kind: Kind) -> dict[str, dict[int, str]]:
    """The var axes of each input: cleave.compile's `dynamic`."""
    return {inp: {i: a for i, a in enumerate(shape) if a in kind.var} for inp, shape in kind.inputs.items()
            if any(a in kind.var for a in shape)}


def reference_source(kind: Kind) -> str:
    """The definition's `reference`: paged_reference's source and a `run` calling the kind's
    function with the definition's inputs in order."""
    params = ", ".join(kind.inputs)
    body = inspect.getsource(paged_reference)
    return f"{body}\n\n@torch.no_grad()\ndef run({params}):\n    return {kind.reference.__name__}({params})\n"


def definition(name: str) -> dict:
    """The FlashInfer-Trace definition of `name` (the JSON's content)."""
    kind_name, const = DEFINITIONS[name]
    kind = KINDS[kind_name]
    axes = {a: {"type": "const", "value": const[a]} if a in const else {"type": "var"}
            for shape in kind.inputs.values() for a in shape}
    constraints = ["len_indptr == batch_size + 1"] if "batch_size" in kind.var and "len_indptr" in kind.var else []
    constraints += [f"{a} == {p}[-1].item()" for a, p in (("num_kv_indices", "kv_indptr"), ("total_q", "qo_indptr"),
                                                          ("total_kv", "kv_indptr")) if a in kind.var and p in kind.inputs]
    inputs = {n: {"shape": list(s) if s else None, "dtype": _dtype(n)} for n, s in kind.inputs.items()}
    rows = "total_q" if kind.prefill else "batch_size"
    heads, dv = "num_qo_heads", ("head_dim_ckv" if kind_name.startswith("mla") else "head_dim")
    return {
        "name": name, "op_type": kind_name.split("_")[0] + ("_ragged" if "ragged" in kind_name else "_paged"),
        "description": kind.description,
        "tags": [f"stage:{'prefill' if kind.prefill else 'decode'}", f"cleave_workload:{name}"],
        "axes": axes, "constraints": constraints, "inputs": inputs,
        "outputs": {"output": {"shape": [rows, heads, dv], "dtype": "bfloat16"},
                    "lse": {"shape": [rows, heads], "dtype": "float32",
                            "description": "The 2-based log-sum-exp of attention logits."}},
        "reference": reference_source(kind),
    }


def _dtype(name: str) -> str:
    if name == "sm_scale":
        return "float32"
    return "int32" if name.endswith(("indptr", "indices", "len", "lens", "tables")) else "bfloat16"


def default_scale(const: dict[str, int]) -> float:
    """FlashInfer's default sm_scale: 1/sqrt(head_dim); MLA's uses the head dims before
    absorption (128 + 64), as FlashInfer-Bench's definitions do."""
    return 1 / math.sqrt(192 if "head_dim_ckv" in const else const["head_dim"])


def _layout(name: str, q_lens, kv_lens, seed: int = 0):
    """(q lens, kv lens, pages per request, pool size) of a batch: prefill queries as
    given, one per request in decode; pages from `random_layout`."""
    kind, page_size = kind_of(name), DEFINITIONS[name][1].get("page_size", 1)
    pages, pool = random_layout(kv_lens, page_size, torch.Generator().manual_seed(seed))
    return (list(q_lens) if kind.prefill else [1] * len(kv_lens)), list(kv_lens), pages, pool


def sizes(name: str, q_lens, kv_lens, pages, num_pages: int) -> dict[str, int]:
    """Every axis's value for this batch: the definition's consts and its var axes."""
    batch = len(kv_lens)
    return {**DEFINITIONS[name][1], "batch_size": batch, "num_pages": num_pages, "len_indptr": batch + 1,
            "num_kv_indices": sum(len(p) for p in pages), "total_q": sum(q_lens), "total_kv": sum(kv_lens),
            "max_blocks": max([len(p) for p in pages] + [1])}


def layout_inputs(name: str, q_lens, pages, kv_lens, num_pages: int, const: dict[str, int] | None = None,
                  seed: int = 0, device="cpu", dtype=torch.bfloat16) -> list[torch.Tensor]:
    """A call's inputs, in the definition's order: request r has q_lens[r] query tokens
    (one in decode), kv_lens[r] kv tokens held in the pages `pages[r]` (page ids into a
    pool of `num_pages`; the ragged kind packs kv instead). `const` overrides const axes
    (small heads for CPU runs). Floats are random."""
    kind_name = DEFINITIONS[name][0]
    kind = KINDS[kind_name]
    axes = {**sizes(name, q_lens, kv_lens, pages, num_pages), **(const or {})}
    ints = index_values(name, q_lens, pages, kv_lens, axes)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for inp, shape in kind.inputs.items():
        if inp == "sm_scale":
            out.append(torch.tensor(default_scale(axes), dtype=torch.float32, device=device))
        elif inp in ints:
            out.append(torch.tensor(ints[inp], dtype=torch.int32, device=device).reshape([axes[a] for a in shape]))
        else:
            out.append(torch.randn([axes[a] for a in shape], generator=gen).to(dtype).to(device))
    return out


def index_values(name: str, q_lens, pages, kv_lens, axes: dict[str, int] | None = None) -> dict[str, list]:
    """The integer inputs of a batch as lists: indptrs, page lists, last-page fills,
    lengths, block tables (those the definition has)."""
    kind_name = DEFINITIONS[name][0]
    axes = axes or sizes(name, q_lens, kv_lens, pages, 0)
    page_size = axes.get("page_size", 1)
    values = {
        "qo_indptr": _indptr(q_lens),
        "kv_indptr": _indptr(kv_lens if kind_name == "gqa_ragged_prefill" else [len(p) for p in pages]),
        "kv_indices": [i for p in pages for i in p],
        "kv_last_page_len": [(n - 1) % page_size + 1 if n else 0 for n in kv_lens],
        "seq_lens": list(kv_lens),
        "block_tables": [list(p) + [0] * (axes["max_blocks"] - len(p)) for p in pages],
    }
    return {k: v for k, v in values.items() if k in KINDS[kind_name].inputs}


def _indptr(lens) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def random_layout(kv_lens, page_size: int, gen: torch.Generator, spare: int = 3):
    """Each request's pages drawn from a shuffled pool (never contiguous by construction):
    (pages per request, pool size)."""
    used = [-(-n // page_size) for n in kv_lens]
    pool = sum(used) + spare
    order = torch.randperm(pool, generator=gen).tolist()
    pages, at = [], 0
    for n in used:
        pages.append(order[at:at + n])
        at += n
    return pages, pool


# The suite's bindings, as batches: (q lens, kv lens). Small odd ones for CPU tests, an
# empty request in each; a serving-sized one for the GPU, and for decode a large step
# (64 requests of 4096 tokens: 1.07 GB of K and V at 8 kv heads), where the copy
# ceiling is the measure.
_BATCHES = {
    "test0": ([1, 2, 1], [5, 0, 7]),
    "test1": ([2, 0, 3, 1], [4, 0, 9, 2]),
    "h200": ([256] * 8, [2048] * 8),
    "h200_large": ([1] * 64, [4096] * 64),
}


def _batch(name: str, which: str, seed: int = 0):
    return _layout(name, *_BATCHES[which], seed=seed)


def _binding(name: str, which: str) -> dict[str, int]:
    kind = kind_of(name)
    return {a: v for a, v in sizes(name, *_batch(name, which)).items() if a in kind.var}


def _named_inputs(name: str, which: str, seed: int = 0, device="cpu", dtype=None) -> dict[str, torch.Tensor]:
    q_lens, kv_lens, pages, pool = _batch(name, which, seed)
    args = layout_inputs(name, q_lens, pages, kv_lens, pool, seed=seed, device=device, dtype=dtype or torch.bfloat16)
    return dict(zip(kind_of(name).inputs, args))


@functools.lru_cache(maxsize=None)
def _graph(name: str):
    from ..frontends.capture import capture

    kind = kind_of(name)
    return capture(kind.program, *_named_inputs(name, "test0").values(), dynamic=dynamic_axes(kind), name=name)


def _make_inputs(name: str):
    """Workload.make_inputs: the batch of the suite whose binding is `env` (valid page lists
    need more than the axes' sizes)."""
    def make(graph, env, seed=0, device="cpu", dtype=None):
        wanted = {a: env[a] for a in kind_of(name).var}
        which = next((w for w in _BATCHES if _binding(name, w) == wanted), None)
        if which is None:
            raise ValueError(f"{name}: no batch of the suite has the binding {wanted}; the suite's: "
                             f"{[_binding(name, w) for w in _BATCHES]}")
        return _named_inputs(name, which, seed, device, dtype)
    return make


def _register(name: str) -> None:
    kind = kind_of(name)
    presets = ("h200",) if kind.prefill else ("h200", "h200_large")
    register(Workload(name, kind.description, functools.partial(_graph, name), kind.program,
                      {p: _binding(name, p) for p in presets}, (_binding(name, "test0"), _binding(name, "test1")),
                      dynamic_axes(kind), make_inputs=_make_inputs(name)))


for _name in DEFINITIONS:
    _register(_name)
