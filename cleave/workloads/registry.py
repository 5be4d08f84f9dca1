"""The workload registry: each entry has its graph, its plain-PyTorch reference
function and named shape presets."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..interpreter import TORCH_DTYPES
from ..ir import Graph
from ..ir import dims as D


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    build: Callable[[], Graph]
    reference: Callable[..., object]
    presets: dict[str, dict[str, int]]
    # Small odd bindings for CPU tests (never multiples of a tile).
    test_bindings: tuple[dict[str, int], ...]
    # Axes a serving engine varies: {input: {axis: symbol}}.
    dynamic: dict[str, dict[int, str]] = field(default_factory=dict)
    make_inputs: Callable[..., dict[str, torch.Tensor]] | None = None

    @property
    def graph(self) -> Graph:
        return self.build()

    def inputs(self, env: dict[str, int], seed: int = 0, device="cpu", dtype: torch.dtype | None = None):
        """Fresh random inputs for a binding; `dtype` overrides the float inputs' type."""
        if self.make_inputs is not None:
            return self.make_inputs(self.graph, env, seed=seed, device=device, dtype=dtype)
        return random_inputs(self.graph, env, seed=seed, device=device, dtype=dtype)

    def run_reference(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        out = self.reference(**inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]


def random_inputs(graph: Graph, env: dict[str, int], seed: int = 0, device="cpu",
                  dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = {}
    for name, node in graph.inputs.items():
        shape = [D.evaluate(d, env) for d in node.shape]
        if node.dtype.is_float:
            t = torch.randn(shape, generator=gen, dtype=torch.float32)
            out[name] = t.to(dtype or TORCH_DTYPES[node.dtype]).to(device)
        else:
            out[name] = torch.randint(0, 4, shape, generator=gen).to(TORCH_DTYPES[node.dtype]).to(device)
    return out


_REGISTRY: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    if workload.name in _REGISTRY:
        raise ValueError(f"workload {workload.name!r} is registered twice")
    _REGISTRY[workload.name] = workload
    return workload


def names() -> list[str]:
    return list(_REGISTRY)


def get(name: str) -> Workload:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(_REGISTRY)}") from None
