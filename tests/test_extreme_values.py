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
