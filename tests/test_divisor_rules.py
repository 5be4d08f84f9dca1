"""Rules that move or cancel a divisor (`sum-pull-div`, `normalize-after-matmul`,
`div-div-cancel`) hold where the divisor is not 0; an input may hold 0, and eager's
(x / 0) is inf or NaN element by element: sum([0/0, 1/0]) is NaN where sum(x) / 0 is
inf. They need `nonzero(c)` (cleave/search/finite.py): a non-zero constant, a size, a
softmax's denominator, as the fused softmax has it."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave
from cleave import search
from cleave import workloads as W
from cleave.search.finite import nonzero_nodes

INF = float("inf")


@pytest.mark.parametrize("fn, args", [
    (lambda x, c: (x / c).sum(-1), (torch.tensor([[0.0, 1.0], [2.0, 3.0]]), torch.tensor([[0.0], [2.0]]))),
    (lambda x, c, w: (x / c) @ w, (torch.tensor([[1.0, -2.0, 3.0]]), torch.tensor([[0.0]]), torch.tensor([[1.0], [1.0], [2.0]]))),
    (lambda x, y, c: (x / c) / (y / c), (torch.tensor([1.0, 3.0]), torch.tensor([2.0, 5.0]), torch.tensor([0.0, INF]))),
])
def test_a_divisor_holding_zero_or_inf_gives_eagers_nan(fn, args):
    got = torch.compile(fn, backend="cleave")(*args)
    torch.testing.assert_close(got, fn(*args), equal_nan=True)


def test_nonzero_facts_cover_constants_sizes_and_softmax_denominators():
    def f(x, y):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True), x / 3.0, y / y.sum(-1, keepdim=True), x / 0.0

    g = cleave.capture(f, torch.randn(3, 5), torch.randn(3, 5))
    facts = nonzero_nodes(g)
    ops = {(n.op, n.attrs.get("op")) for n in g.live_nodes() if n.id in facts}
    assert ("reduce", "sum") in ops  # the softmax's denominator, not y's plain sum
    sums = [n for n in g.live_nodes() if n.op == "reduce" and n.attrs["op"] == "sum"]
    assert len(sums) == 2 and sum(n.id in facts for n in sums) == 1
    consts = {float(n.attrs["value"]): n.id in facts for n in g.live_nodes() if n.op == "const"}
    assert consts.get(3.0) is True and consts.get(0.0) is not True
    assert not any(n.id in facts for n in g.live_nodes() if n.op == "input")


def test_softmax_division_still_moves_after_pv():
    best = search(W.get("mha").graph, progress=False).best
    assert "normalize-after-matmul" in best.derivation
