"""torch.cdist (frontends/aten_reduce.py) as its definition: per pair of rows the p-norm
of their difference, reduced over the features in one kernel. It was a graph break.
Exact against eager for p = 0, 1, 2, 3, inf, batched, static and dynamic, past the 25
rows where torch's own p = 2 goes through a MatMul."""
from __future__ import annotations

import math

import pytest
import torch

from backend_case import close as _close
from backend_case import ctx  # noqa: F401 (a fixture)


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, math.inf, 3.0])
@pytest.mark.parametrize("dynamic", [False, True])
def test_cdist_compiles_exactly(ctx, p, dynamic):
    fn = lambda a, b: torch.cdist(a, b, p=p)  # noqa: E731
    f = torch.compile(fn, backend="cleave", dynamic=dynamic)
    gen = torch.Generator().manual_seed(int(p) if p < 9 else 9)
    for rows, cols in ((5, 7), (30, 41)):
        a, b = torch.randn(2, rows, 6, generator=gen), torch.randn(2, cols, 6, generator=gen)
        if p == 0:  # differing features are counted: rounded values tie
            a, b = a.round(), b.round()
        _close(f(a, b), fn(a, b), tol=1e-5)
    st = ctx.stats()
    assert st["failed"] == 0 and st["graph_breaks"] == 0 and st["unsupported"] == [], st
