"""Ops that draw from torch's generator, seeded before each call, draw what eager
draws: cleave runs them as torch's own kernels (every op torch tags
nondeterministic_seeded is kept out of the decomposition table), and compiles what is
around them. Decomposed, `exponential_` drew through `rand_like` and a transform of
its own, so `F.gumbel_softmax` and `Tensor.exponential_` under a seed gave other
values than eager's."""
import pytest
import torch
import torch.nn.functional as F

import cleave


def gumbel(x):
    return F.gumbel_softmax(x, tau=0.5, hard=False)


def exponential(x):
    return torch.empty_like(x).exponential_() * x


def geometric(x):
    return torch.empty_like(x).geometric_(0.3) + x


def cauchy(x):
    return torch.empty_like(x).cauchy_() + x


def log_normal(x):
    return torch.empty_like(x).log_normal_() + x


def rrelu(x):
    return F.rrelu(x, training=True) * 2


@pytest.mark.parametrize("fn", [gumbel, exponential, geometric, cauchy, log_normal, rrelu])
@pytest.mark.parametrize("how", ["backend", "cleave.compile"])
def test_seeded_draws_match_eager(fn, how):
    compiled = torch.compile(fn, backend="cleave") if how == "backend" else cleave.compile(fn)
    for rows in (3, 3, 5):
        x = torch.randn(rows, 7, generator=torch.Generator().manual_seed(rows))
        torch.manual_seed(11)
        want = fn(x)
        torch.manual_seed(11)
        with torch.no_grad():
            got = compiled(x)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def own_generator(x):
    g = torch.Generator().manual_seed(0)
    return x + torch.rand(x.shape, generator=g)


@pytest.mark.parametrize("dynamic", [None, "all"])
def test_a_generator_made_inside_the_function_runs_eagerly_there(dynamic):
    """torch.export lifts the Generator as an object input: its capture raised an
    AttributeError from cleave's translator at every call."""
    compiled = cleave.compile(own_generator, dynamic=dynamic)
    for rows in (3, 5, 3):
        x = torch.randn(rows, 7)
        torch.testing.assert_close(compiled(x), own_generator(x), rtol=0, atol=0)
    assert dynamic or "Generator object the function makes" in str(compiled.capture_error)
