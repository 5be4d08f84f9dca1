"""Values near f32's range come out as eager's: an op built in another order than
torch's overflows where torch's result is finite."""
import torch
import torch.nn.functional as F

import cleave


def test_tanh_gelu_at_the_edge_of_f32_is_finite_as_eagers():
    """0.5 x (1 + tanh(...)) was built as (x (1 + tanh(...))) 0.5: 3e38 times 2 is inf."""
    def fn(x):
        return F.gelu(x, approximate="tanh")

    x = torch.tensor([[3e38, 1.0, -2.5, 0.3, -3e38]])
    got, want = cleave.compile(fn, verbose=False)(x), fn(x)
    assert torch.isfinite(want[0, 0]) and torch.equal(got.isinf(), want.isinf()), (got, want)
    torch.testing.assert_close(got, want)


def _variances(x):  # var_mean's mean is left out: eager's of a row holding inf is NaN (its f64 Welford)
    return (x.var(-1), x.std(-1), x.var(-1, correction=0, keepdim=True), x.std(-1, unbiased=False),
            torch.var_mean(x, -1)[0], torch.std_mean(x, (0, 1))[0], x.std())


def test_variance_at_the_ends_of_f32_is_eagers():
    """Σ(x - mean)² overflowed f32 past 1.8e19 (eager's CPU kernel accumulates in f64):
    a std of 3e19 and a var of 1e38 came out inf, a bf16 var past f32's range NaN
    (inf - inf) where eager's is inf, and a std of 1e-30 0; the deviations are now
    squared in units of the row's largest |x|. Rows of zeros, of subnormals, holding
    inf or NaN, and of ordinary values keep eager's results."""
    torch.manual_seed(0)
    rows = torch.randn(8, 37)
    rows[0] *= 3e19
    rows[1] *= 1e19  # a var of 1e38: its Σd² overflows, eager's var does not
    rows[2] *= 1e-30
    rows[3] = 0.0
    rows[4] *= 1e-40  # subnormal
    rows[5, 3] = float("inf")
    rows[6, 5] = float("nan")
    rows[7] += 1e6  # a large mean against a spread of 1
    x = rows.reshape(2, 4, 37)
    compiled = (cleave.compile(_variances, verbose=False), torch.compile(_variances, backend="cleave"))
    for xs, rtol in ((x, 1.3e-6), ((x * 1e18).bfloat16(), 1.6e-2), (x.half(), 1e-3)):
        want = _variances(xs)
        for fn in compiled:
            for got, w in zip(fn(xs), want):  # relative to the std of 1e-30 too: no atol of 1e-5
                torch.testing.assert_close(got, w, equal_nan=True, rtol=rtol, atol=1e-43)
