"""A region after a strided conv reads its length as floor(s/4): binding solves it (any
length of the run that gives the input's size serves), so the region compiles at every
size instead of running eagerly at each call."""
import warnings

import pytest
import sympy
import torch
import torch.nn as nn
import torch.nn.functional as F

from cleave.ir import BindingError, Graph
from cleave.ir import dims as D


def _graph():
    s = D.symbol("s")
    g = Graph("after_conv")
    x = g.input("x", [2, sympy.floor(s / 4)], "f32")
    y = g.input("y", [sympy.floor((s - 1) / 2) + 1], "f32")
    g.output(x, names=["out"])
    g.output(y, names=["out2"])
    return g


def test_floor_dims_bind_to_a_length_giving_both_sizes():
    env = _graph().bind({"x": [2, 3], "y": [7]})
    s = env["s"]
    assert s // 4 == 3 and (s - 1) // 2 + 1 == 7


def test_floor_dims_that_no_length_gives_are_refused():
    with pytest.raises(BindingError, match="cannot solve"):
        _graph().bind({"x": [2, 3], "y": [2]})


class PatchEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.norm, self.fc = nn.Conv2d(3, 16, 4, 4), nn.LayerNorm(16), nn.Linear(16, 16)

    def forward(self, img):
        return self.fc(self.norm(self.proj(img).flatten(2).transpose(1, 2))).relu()


def test_region_after_a_strided_conv_compiles_at_every_size():
    torch._dynamo.reset()
    m = PatchEmbed().eval()
    compiled = torch.compile(m, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for hw in (12, 8):
            x = torch.randn(2, 3, hw, hw)
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-5)
    eager = [str(w.message) for w in caught if "do not fit" in str(w.message)]
    assert not eager, eager


def test_rows_of_a_width_that_divides_serve_every_length():
    """(n, 6) viewed as rows of 3 under dynamic shapes reads n·w // 3: w is read as 3·t
    (its traced size divides by 3), which every n serves. n was read as 3·t + 2 (its
    traced size 5 and the first name), and two lengths in three ran eagerly."""
    torch._dynamo.reset()
    rows = lambda a: a.reshape(-1, 3).amax(1)  # noqa: E731
    compiled = torch.compile(rows, backend="cleave", dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (5, 3, 4, 7):
            x = torch.randn(n, 6)
            assert torch.equal(compiled(x), rows(x))
    eager = [str(w.message) for w in caught if "runs eagerly" in str(w.message)]
    assert not eager, eager


def test_an_interpolate_scaled_by_a_factor_compiles_at_every_size():
    """int(n * 1.5), interpolate's output size under dynamic shapes, is torch's TruncToInt:
    read as a floor (the size is not negative), it compiles; left as TruncToInt, no
    index expression printed and every call ran eagerly."""
    torch._dynamo.reset()
    scaled = lambda x: torch.nn.functional.interpolate(x, scale_factor=1.5, mode="bilinear",  # noqa: E731
                                                       align_corners=True)
    compiled = torch.compile(scaled, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for h, w in ((4, 4), (5, 5), (7, 6)):
            x = torch.randn(2, 3, h, w)
            torch.testing.assert_close(compiled(x), scaled(x), rtol=1e-5, atol=1e-6)
    said = [str(w.message) for w in caught if "cleave" in str(w.message)]
    assert not said, said  # "could not compile f ... cannot print index expression TruncToInt"


@pytest.mark.parametrize("fn", [
    lambda x: F.pad(x, (0, (-x.shape[1]) % 4)).view(x.shape[0], -1, 4).sum(-1),  # up to a multiple
    lambda x: x[:, : x.shape[1] - x.shape[1] % 4].reshape(x.shape[0], -1, 4).amax(-1),  # down to one
], ids=["pad_up", "crop_down"])
def test_a_length_rounded_to_a_multiple_serves_every_length(fn):
    """n + (-n) % 4 under dynamic shapes is torch's Mod: read as 4·ceiling(n/4) (the pad
    4·ceiling(n/4) - n proven not negative by ceiling's bound), one compiled region
    serves every n. Kept as a Mod, the unifier read n as 4·t + 1 from the first call and
    the other residues ran eagerly ("no positive integer makes 4*t+1 = 6")."""
    from cleave.runtime.backend import reset

    torch._dynamo.reset()
    ctx = reset()
    compiled = torch.compile(fn, backend="cleave", dynamic=True)
    lengths = (5, 6, 7, 8, 13)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in lengths:
            x = torch.randn(3, n)
            torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-6)
    said = [str(w.message) for w in caught if "cleave" in str(w.message)]
    assert not said, said
    assert sum(op.stats["calls"] for op in ctx.operators.values()) == len(lengths), ctx.stats()
