"""Programs through torch.compile(backend="cleave") whose results were silently wrong:
each now matches eager exactly, or runs eagerly with a warning that names the op."""
from __future__ import annotations

import torch

from backend_case import ctx  # noqa: F401 (a fixture)


def test_adding_bools_is_a_logical_or(ctx):
    """torch's add on bools is `or`; computed on 1-bit integers True + True wrapped to
    False, and a count of true entries came out short."""
    def votes(a, b):
        either = (a > 0) + (b > 0)
        return either, either.sum(), (a > 0) + True

    f = torch.compile(votes, backend="cleave")
    a, b = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0]), torch.tensor([1.0, -1.0, 1.0, -1.0, -3.0])
    for got, want in zip(f(a, b), votes(a, b)):
        assert got.dtype == want.dtype and torch.equal(got, want)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st
