"""A row whose max is +inf is NaN throughout, as torch computes it (inf - inf), also
where the row runs as a loop of tiles with a running max (scheduler/codegen.py): the
running max is read as 0 inside the loop only while it is the max's neutral -inf (an
empty or fully masked prefix). Read as 0 at +inf as well, the running sum was taken
relative to 0 and the division by it gave 0 for every finite entry."""
import math

import pytest
import torch

import cleave

INF, NAN = float("inf"), float("nan")


def _same(got, want):
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (got, want)
    ok = ~torch.isnan(want)
    torch.testing.assert_close(got[ok], want[ok], rtol=1e-5, atol=1e-6)


def _special_rows(x):
    n = x.shape[-1]
    x[0, 3] = INF  # +inf inside the first tile
    x[1, n - 1] = INF  # in the last (masked) tile
    x[2] = -INF  # every entry masked
    x[3, 0] = NAN
    x[4, 1] = -INF  # one masked entry: finite result
    return x


@pytest.mark.parametrize("n", [7, 300])
def test_softmax_of_rows_holding_inf_or_nan_matches_torch(n):
    c = cleave.compile(lambda x: x.softmax(-1), dynamic={"x": {1: "n"}})
    x = _special_rows(torch.randn(6, n))
    _same(c(x), torch.softmax(x, -1))


@pytest.mark.parametrize("n", [9, 200])
def test_attention_with_an_inf_bias_matches_torch(n):
    def attend(q, k, v, bias):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
        return s.softmax(-1) @ v

    c = cleave.compile(attend, dynamic={"q": {1: "n"}, "k": {1: "n"}, "v": {1: "n"}, "bias": {0: "n", 1: "n"}})
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, n, 16) for _ in range(3))
    bias = _special_rows(torch.zeros(n, n))
    _same(c(q, k, v, bias), attend(q, k, v, bias))
