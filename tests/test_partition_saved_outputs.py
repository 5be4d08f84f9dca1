"""A stack of transformer blocks under autograd. AOTAutograd's forward graph also returns
the activations its backward reads: the hidden states between the blocks, and values
inside each block (norm statistics, queries, attention's output) that reach into the
blocks below a hidden state without passing through it. The partitioner still cuts the
stack at its hidden states (`segment_cuts`) and stores each once; uncut, one kernel's
walk compounded through every block past MAX_INSTANCES and the whole forward ran
eagerly."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cleave
from cleave.scheduler import partition as part

from backend_case import close, grads_match_eager
from backend_case import ctx  # noqa: F401 (a fixture)

WIDTH, HEADS = 16, 2


class Attention(nn.Module):
    """Pre-LayerNorm causal attention with its residual; `forward` also returns what a
    backward would save from it (`Stack`)."""

    def __init__(self):
        super().__init__()
        self.norm, self.qkv, self.out = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        b, s, c = x.shape
        rows = self.norm(x)
        q, k, v = (t.view(b, s, HEADS, -1).transpose(1, 2) for t in self.qkv(rows).split(c, 2))
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        probs = (q @ k.transpose(-1, -2) * 0.35).masked_fill(causal, float("-inf")).softmax(-1)
        heads = (probs @ v).transpose(1, 2).reshape(b, s, c)
        return x + self.out(heads), (x.mean(-1), rows, q, k, probs, heads)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        rows = self.norm(x)
        hidden = F.gelu(self.up(rows))
        return x + self.down(hidden), (x.mean(-1), rows, hidden)


def blocks(count: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[sub for _ in range(count) for sub in (Attention(), Mlp())])


class Stack(nn.Module):
    """Blocks returning their output and, as `saved` names, what a training forward
    also returns: "hidden" the hidden state each sub-block after the first reads,
    "internals" the values inside each sub-block."""

    def __init__(self, count: int, saved: tuple[str, ...] = ()):
        super().__init__()
        self.blocks, self.saved = blocks(count), saved

    def forward(self, x):
        hidden, internals = [], []
        for i, sub in enumerate(self.blocks):
            if i:
                hidden.append(x)
            x, inside = sub(x)
            internals.extend(inside)
        return (x, *(hidden if "hidden" in self.saved else ()), *(internals if "internals" in self.saved else ()))


class Plain(nn.Module):
    """Blocks as a model runs them: the output alone."""

    def __init__(self, count: int):
        super().__init__()
        self.blocks = blocks(count)

    def forward(self, x):
        for sub in self.blocks:
            x = sub(x)[0]
        return x


def _described(graph, ids) -> list:
    """Nodes as the capture's order and ops say (ids differ between two captures)."""
    order = {n.id: k for k, n in enumerate(graph.live_nodes())}
    return sorted((order[i], graph.nodes[i].op) for i in ids)


@pytest.mark.parametrize("saved", [("hidden",), ("internals",), ("hidden", "internals")],
                         ids=["hidden_states", "block_internals", "both"])
def test_saved_activations_leave_the_cuts_at_the_hidden_states(saved):
    """The hidden states a training forward returns are cuts all the same (an output is
    stored anyway), and values saved from inside a block, which reach the block's
    reductions without passing through the hidden state below, leave it their boundary:
    the cuts are those of the stack returning its output alone (before: none)."""
    x = torch.randn(2, 5, WIDTH)
    plain = cleave.capture(Plain(2), x)
    saving = cleave.capture(Stack(2, saved), x)
    want = part.segment_cuts(plain)
    assert len(want) == 2, want  # the hidden state after the first block, and between the second's halves
    got = part.segment_cuts(saving)
    assert _described(saving, got) == _described(plain, want), (got, want)
    if "hidden" in saved:  # the hidden states the second block's halves read, both returned
        assert got == {n.id for n in saving.outputs[2:4]}, got


def test_a_returned_hidden_state_that_is_cut_is_stored_once():
    """Its producer kernel stores it into the output's buffer; the output kernels, which
    store the other outputs of its grid, do not compute it again."""
    graph = cleave.capture(Stack(2, ("hidden",)), torch.randn(2, 5, WIDTH))
    cuts = part.segment_cuts(graph)
    assert cuts and cuts <= {n.id for n in graph.outputs}
    stores = [st.buffer for spec, _ in part.partition(graph, {}) for st in spec.stores]
    assert sorted(stores) == sorted(set(stores)), stores
    assert set(graph.output_names) <= set(stores)


def test_a_block_stack_under_autograd_compiles_with_gradients_as_eager_gives(ctx):
    """Two blocks, grad enabled: the forward AOTAutograd partitions out (its ~30 outputs
    the activations the backward reads) compiles, cut at its returned hidden states,
    and the input and parameter gradients are eager's."""
    m = Plain(2)
    x = torch.randn(2, 5, WIDTH, requires_grad=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # no eager fallback
        y = torch.compile(m, backend="cleave")(x)
    assert y.grad_fn is not None
    close(y, m(x), 1e-5)
    st = ctx.stats()
    assert st["operators"] == 1 and st["failed"] == 0 and st["graph_breaks"] == 0 and ctx.eager_regions == 0, st
    (op,) = ctx.operators.values()
    assert len(op.graph.outputs) > 2  # the saved activations
    grads_match_eager(y, m, x)
