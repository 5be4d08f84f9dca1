"""Rules that move a factor out of a sum or a MatMul (`sum-pull-factor`,
`rowscale-after-matmul`) hold for a finite factor: one the graph computes as log(0)
gave `(x * log(y)).sum(-1)` -inf where eager's sum of -inf and inf is NaN. They need
`finite(c)`, which a norm's scale rsqrt(mean(x^2) + eps) has: its divisor is at least
eps (cleave/search/finite.py), so RMSNorm's scale still moves after the MatMul."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave
from cleave import search
from cleave import workloads as W
from cleave.search.finite import finite_nodes

X = torch.tensor([[1.0, -2.0, 3.0], [1.0, 2.0, 3.0]])
Y = torch.tensor([[0.0], [2.0]])


@pytest.mark.parametrize("fn, args", [
    (lambda x, y: (x * torch.log(y)).sum(-1), (X, Y)),
    (lambda x, y, w: (x * torch.log(y)) @ w, (X, Y, torch.tensor([[1.0, 0.0], [1.0, 1.0], [2.0, -1.0]]))),
])
def test_a_factor_the_graph_makes_infinite_gives_eagers_nan(fn, args):
    got = cleave.compile(fn)(*args)
    torch.testing.assert_close(got, fn(*args), equal_nan=True)


def test_a_norms_scale_is_finite_and_a_log_is_not():
    def f(x, y):
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6), x * torch.log(y), x / (y + 1.0)

    g = cleave.capture(f, torch.randn(3, 5), torch.rand(3, 1))
    facts = finite_nodes(g)
    by_op = {n.op: n.id in facts for n in g.live_nodes() if n.op in ("rsqrt", "log", "div")}
    assert by_op == {"rsqrt": True, "log": False, "div": False}  # y + 1 may be 0: y is any finite value


def test_rmsnorm_scale_still_moves_after_the_matmul():
    assert "rowscale-after-matmul" in search(W.get("rmsnorm_matmul").graph, progress=False).best.derivation
