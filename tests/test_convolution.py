"""Convolution (frontends/aten_windows.py) as im2col: the windows of the zero-padded
input, taken from its flattened form, contracted with the weight (a MatMul, batched by
group). Compiled where asked (CLEAVE_CONVOLUTIONS=compile): exact against eager at odd
sizes for 1-D to 3-D, stride, padding (zeros, "same", reflect through its own pad),
dilation, groups and depthwise, static and dynamic. Transposed convolutions stay
eager, with a warning naming them. By default a convolution runs eagerly on cuDNN,
3-42x faster than these kernels (H100, RESULTS.md session 41), with a warning saying
so, and the rest of the function compiles."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from backend_case import close as _close
from backend_case import ctx  # noqa: F401 (a fixture)

@pytest.fixture
def compiled_convolutions(monkeypatch):
    from cleave.frontends.aten_windows import COMPILE_CONVOLUTIONS

    monkeypatch.setenv(*COMPILE_CONVOLUTIONS)


CONVS = {
    "2-D": (lambda: nn.Conv2d(3, 5, 3), (2, 3, 9, 8)),
    "stride 2, padded": (lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1), (2, 3, 9, 10)),
    "dilated": (lambda: nn.Conv2d(3, 4, (3, 2), dilation=(2, 1), padding=(2, 0)), (1, 3, 11, 7)),
    "groups": (lambda: nn.Conv2d(4, 6, 3, groups=2, padding=1), (2, 4, 6, 7)),
    "depthwise": (lambda: nn.Conv2d(4, 4, 3, groups=4, bias=False), (2, 4, 6, 7)),
    "same, reflect": (lambda: nn.Conv2d(3, 4, 3, padding="same", padding_mode="reflect"), (1, 3, 7, 8)),
    "1-D": (lambda: nn.Conv1d(4, 6, 5, padding=2), (3, 4, 17)),
    "3-D": (lambda: nn.Conv3d(2, 3, 2), (1, 2, 4, 5, 6)),
}


@pytest.mark.parametrize("name", CONVS)
@pytest.mark.parametrize("dynamic", [False, True])
def test_convolution_compiles_exactly(ctx, compiled_convolutions, name, dynamic):
    make, shape = CONVS[name]
    torch.manual_seed(len(name))
    m = make().eval()
    f = torch.compile(m, backend="cleave", dynamic=dynamic)
    gen = torch.Generator().manual_seed(len(name))
    with torch.no_grad():
        for extra in (0, 3):
            size = list(shape)
            size[-1] += extra
            x = torch.randn(*size, generator=gen)
            _close(f(x), m(x), tol=1e-4)
    st = ctx.stats()
    assert st["failed"] == 0 and st["graph_breaks"] == 0 and st["unsupported"] == [], st


def test_a_small_cnn_in_bf16(ctx, compiled_convolutions):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=8, padding=1),
                      nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8 * 3 * 4, 5)).bfloat16().eval()
    f = torch.compile(m, backend="cleave")
    x = torch.randn(2, 3, 6, 8).bfloat16()
    with torch.no_grad():
        got, want = f(x).float(), m(x).float()
    assert ((got - want).norm() / want.norm()).item() < 2e-2
    assert ctx.stats()["graph_breaks"] == 0


def test_by_default_a_convolution_runs_eagerly_and_the_rest_compiles(ctx):
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                      nn.Linear(4 * 3 * 4, 5)).eval()
    f = torch.compile(m, backend="cleave")
    x = torch.randn(2, 3, 6, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _close(f(x), m(x), tol=1e-5)
    said = [str(w.message) for w in caught if "convolution" in str(w.message)]
    assert said and all("cuDNN" in w and "CLEAVE_CONVOLUTIONS=compile" in w for w in said), said
    st = ctx.stats()
    assert st["failed"] == 0 and st["graph_breaks"] >= 1 and st["operators"] >= 1, st


def test_a_transposed_convolution_runs_eagerly_with_a_warning(ctx, compiled_convolutions):
    m = nn.ConvTranspose2d(3, 2, 3).eval()
    f = torch.compile(m, backend="cleave")
    x = torch.randn(1, 3, 5, 5)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(f(x), m(x))
    assert any("convolution" in str(w.message) and "transposed" in str(w.message) for w in caught)
