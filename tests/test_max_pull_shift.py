"""`max-pull-shift`, max_a(x - c) = max_a(x) - c for c constant along a, needs c finite
(`finite(c)`, cleave/search/finite.py): a shift computed as log(0) = -inf took eager's
-inf - -inf = NaN at a masked score to max(x) + inf = inf."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

import cleave


def test_a_max_shifted_by_an_infinity_keeps_eagers_nan():
    def f(scores, keep, w):
        return (scores.masked_fill(~keep, float("-inf")) - w.log()).amax(-1)

    g = torch.Generator().manual_seed(0)
    scores, w = torch.randn(4, 7, generator=g), torch.rand(4, 1, generator=g) + 0.5
    keep = torch.ones(4, 7, dtype=torch.bool)
    keep[0, 3] = False
    w[0] = 0.0
    got, want = cleave.compile(f)(scores, keep, w), f(scores, keep, w)
    torch.testing.assert_close(got, want, equal_nan=True)
