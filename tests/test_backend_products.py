"""A region after a graph break that takes a flattened (b * s, d) tensor (the experts of
a MoE after its routing, `h.view(-1, d)`) compiles under dynamic shapes: its input
binds b and s only through their product, so the ints dynamo passes the region carry
them. Both ran eagerly at every call ("cannot solve s27*s77 for its symbols")."""
from __future__ import annotations

import warnings

import torch

from cleave.runtime import backend


class Experts(torch.nn.Module):
    def __init__(self, view_back: bool):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.view_back = view_back

    def forward(self, x):
        b, s, d = x.shape
        h = torch.sort(x.reshape(-1, d), dim=-1).values  # unsupported: a graph break
        y = self.lin(h)
        return y.view(b, s, d) if self.view_back else y


def _compiled_once(view_back: bool):
    torch._dynamo.reset()
    module = Experts(view_back).eval()
    f = torch.compile(module, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in (5, 7, 9):
            x = torch.randn(2, s, 16)
            torch.testing.assert_close(f(x), module(x), rtol=1e-5, atol=1e-5)
    assert not [w for w in caught if "runs eagerly:" in str(w.message)], [str(w.message) for w in caught]
    ops = backend.context().operators.values()
    assert sum(op.stats["compiles"] + op.stats["from_cache"] for op in ops) == 1


def test_a_flattened_input_viewed_back_by_its_sizes():
    # the region takes b and s as ints too: they bind the symbols
    _compiled_once(view_back=True)


def test_a_flattened_input_read_only_through_the_product():
    # the output keeps the flattened shape: b and s still come as ints
    _compiled_once(view_back=False)
