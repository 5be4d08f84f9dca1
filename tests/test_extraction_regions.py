"""Extraction split at dominating e-classes (cleave/search/regions.py): a stack of
layers is extracted region by region, a sum over layers instead of a product."""
import math
from dataclasses import dataclass

from cleave.ir.dominators import ROOT
from cleave.search import regions
from cleave.search.extract import enumerate_dags


@dataclass
class Node:  # the shape of extract.ENode that regions reads
    id: str
    args: list
    weight: float = 0.0


def _class(name, *options):
    """options: (weight, children) per e-node"""
    return name, [Node(f"{name}.{i}", [("class", c) for c in kids], w) for i, (w, kids) in enumerate(options)]


def _stack(layers: int, shared: bool = False):
    """h0 -> layer 1 -> h1 -> ... : each layer's value class h_i has two e-nodes over
    its two internal classes a_i, b_i, each with a cheap and a dear e-node over h_{i-1}.
    With `shared`, every layer also reads one class `w` of two e-nodes (a weight)."""
    classes = dict([_class("h0", (0, []))])
    if shared:
        classes.update([_class("w", (1, []), (2, []))])
    for i in range(1, layers + 1):
        prev, extra = f"h{i - 1}", ["w"] if shared else []
        classes.update([_class(f"a{i}", (1, [prev, *extra]), (3, [prev, *extra])),
                        _class(f"b{i}", (2, [prev]), (1, [prev])),
                        _class(f"h{i}", (0, [f"a{i}"]), (0, [f"a{i}", f"b{i}"])),
                        ])
    return classes, [f"h{layers}"]


def _cost(choice) -> float:
    return sum(n.weight for n in choice.values())


@dataclass
class _Best:
    choice: dict


def _best(limit):
    """The cheapest extraction of the region under cls (explore ranks, or beams, there)."""
    def best(classes, cls, owned):
        dags = enumerate_dags(classes, [cls], limit)
        return _Best(min(dags, key=_cost)) if dags else None
    return best


def _enumerable(limit):
    return lambda classes, tops: enumerate_dags(classes, tops, limit) is not None


def test_dominators_of_a_diamond_and_a_cycle():
    classes = dict([_class("top", (0, ["l", "r"])), _class("l", (0, ["bottom"])), _class("r", (0, ["bottom"])),
                    _class("bottom", (0, ["leaf"]), (0, ["loop"])), _class("loop", (0, ["bottom"])),
                    _class("leaf", (0, []))])
    succ = regions.successors(classes, ["top"])
    idom = regions.immediate_dominators(succ, ["top"])
    assert idom == {"top": ROOT, "l": "top", "r": "top", "bottom": "top", "loop": "bottom",
                    "leaf": "bottom"}
    assert regions.dominated(idom)["bottom"] == {"bottom", "loop", "leaf"}
    cycles = regions.cyclic_components(succ)
    assert set(cycles) == {"bottom", "loop"} and cycles["bottom"] == cycles["loop"]


def test_a_program_that_enumerates_is_not_split():
    classes, roots = _stack(3)
    settled = regions.settle(classes, roots, _enumerable(2000), _best(10 ** 5))
    assert settled is classes


def test_a_stack_of_layers_settles_each_lower_layer_at_its_optimum_and_keeps_the_top_open():
    layers, limit = 12, 64  # 8 extractions per layer: 8**12 whole
    classes, roots = _stack(layers)
    assert enumerate_dags(classes, roots, limit) is None
    enumerated = []  # the extractions each region's search enumerated: a few layers' worth, not 8**12

    def best(classes, cls, owned):
        dags = enumerate_dags(classes, [cls], 10 ** 5)
        enumerated.append(len(dags))
        return _Best(min(dags, key=_cost))

    settled = regions.settle(classes, roots, _enumerable(limit), best, limit)
    assert enumerated and max(enumerated) <= limit, enumerated
    dags = enumerate_dags(settled, roots, limit)
    assert dags is not None and len(dags) > 1  # the top is still a choice
    best = min(dags, key=_cost)
    # The optimum of this cost: per layer h_i = a_i alone with a_i's cheap e-node.
    for i in range(1, layers + 1):
        assert best[f"h{i}"].id == f"h{i}.0" and best[f"a{i}"].id == f"a{i}.0"
    assert _cost(best) == layers * 1
    # The lower layers were settled to one e-node each; the top layer's choices remain.
    assert all(len(settled[f"h{i}"]) == 1 for i in range(1, layers - 1))
    assert len(settled[f"h{layers}"]) == 2


def test_a_class_every_layer_reads_settles_first_and_the_optimum_holds():
    """A value every layer reads (a weight, the rope tables) lies below all of them:
    bottom-up, it settles before the layers, at its own optimum."""
    layers, limit = 8, 64
    classes, roots = _stack(layers, shared=True)
    settled = regions.settle(classes, roots, _enumerable(limit), _best(10 ** 5), limit)
    assert [n.id for n in settled["w"]] == ["w.0"]
    best = min(enumerate_dags(settled, roots, limit), key=_cost)
    assert _cost(best) == 1 + layers  # the cheap w, and each layer's cheap a
    assert math.isclose(regions.choices(settled, {"w"}), 0.0)


def test_three_tiny_llama_layers_search_layer_by_layer():
    """Three layers and an LM head (benchmarks/models.py) hold more extractions than the
    exhaustive ranking takes (22 per layer, 22**3 in all): each lower layer settles
    on its own, every layer keeps the online-softmax form, and the top stays a choice."""
    import sys
    from pathlib import Path

    import torch
    from torch._functorch.aot_autograd import aot_module_simplified

    import cleave
    from cleave.frontends.decompositions import table
    from cleave.frontends.fx_graph import translate_graph_module

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.models import TinyModel, config, rope

    torch.manual_seed(0)
    cfg = config("llama3-8b", tiny=True)
    model = TinyModel(cfg, layers=3).requires_grad_(False).eval()
    found = {}

    def capture(gm, example_inputs):
        def forward(fw, fw_inputs):
            found["graph"] = translate_graph_module(fw, "three_layers").graph
            return fw
        return aot_module_simplified(gm, example_inputs, fw_compiler=forward, decompositions=table())

    torch._dynamo.reset()
    torch.compile(model, backend=capture, dynamic=True)(torch.randint(0, 96, (2, 7)), *rope(7, cfg.head_dim))
    result = cleave.search(found["graph"], top_k=4, progress=False)
    assert len(result.candidates) > 1 and result.stats["visited"] < 100, result.stats
    best = result.best.graph
    # online softmax in every layer: P·V divided by the row sums after the MatMul
    normalized_after = [n for n in best.live_nodes() if n.op == "div" and n.inputs[0].op == "matmul"]
    assert len(normalized_after) == 3, best
