"""Average pooling (frontends/aten_windows.py): each window a take from the flattened,
zero-padded input, summed and divided by its count; exact against eager at odd sizes,
with and without the padding in the count, a divisor override, 1-D pooling (which
decomposes to it) and dynamic sizes. It was a graph break: PyTorch has no
decomposition for avg_pool2d. ceil_mode stays eager, with a warning naming it."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from backend_case import close as _close
from backend_case import ctx  # noqa: F401 (a fixture)

POOLS = {
    "kernel 2": lambda x: F.avg_pool2d(x, 2),
    "3 x 3 by 2, padded": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "padding not counted": lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
    "2 x 3 by 1": lambda x: F.avg_pool2d(x, (2, 3), 1),
    "divisor override": lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    "1-D": lambda x: F.avg_pool1d(x.flatten(2), 4, 2, 1),
    "unbatched": lambda x: F.avg_pool2d(x[0], 2),
}


@pytest.mark.parametrize("name", POOLS)
@pytest.mark.parametrize("dynamic", [False, True])
def test_avg_pool_compiles_exactly(ctx, name, dynamic):
    fn = POOLS[name]
    f = torch.compile(fn, backend="cleave", dynamic=dynamic)
    gen = torch.Generator().manual_seed(len(name))
    for h in (7, 10):
        x = torch.randn(2, 3, h, h + 1, generator=gen)
        _close(f(x), fn(x))
    st = ctx.stats()
    assert st["failed"] == 0 and st["graph_breaks"] == 0 and st["unsupported"] == [], st


class Net(nn.Module):
    """A CNN's tail: pooled features into a Linear, in bf16."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        return self.fc(F.avg_pool2d(torch.relu(x), 2).flatten(1))


def test_a_pooled_head_in_bf16(ctx):
    m = Net().bfloat16().eval()
    f = torch.compile(m, backend="cleave")
    x = torch.randn(3, 4, 6, 7).bfloat16()
    with torch.no_grad():
        _close(f(x), m(x))
    assert ctx.stats()["graph_breaks"] == 0


def test_ceil_mode_runs_eagerly_with_a_warning(ctx):
    fn = lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True)  # noqa: E731
    f = torch.compile(fn, backend="cleave")
    x = torch.randn(1, 2, 8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(f(x), fn(x))
    assert any("avg_pool2d" in str(w.message) and "ceil_mode" in str(w.message) for w in caught)
