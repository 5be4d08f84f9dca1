"""Integer reductions are exact: sum, max, min, argmax, cumsum and topk of int64 values
past 2^24 ran through f32 in the kernels (amax of 2^25 + 1 gave 2^25, argmax of int64
rows an index past the axis), and an int32 sum past 2^31 wrapped before torch's int64
result. They now reduce in their integer type (an int32 or bool sum in int64, as torch),
over a whole tile, a loop, and a split of a dynamic axis (its pad the type's neutral)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave
from kernel_check import assert_one_exact_compile

PROGRAMS = {
    "sum": lambda x: x.sum(-1),
    "amax": lambda x: x.amax(-1) - 1,
    "amin": lambda x: x.amin(-1),
    "argmax": lambda x: torch.argmax(x, -1),
    "cumsum": lambda x: x.cumsum(-1),
    "int32_sum": lambda x: (x % 2 ** 31).int().sum(-1),
    "bool_count": lambda x: (x > 2 ** 40).sum(-1),
    "topk": lambda x: torch.topk(x, 2, dim=0).values,
}


def _values(rows, n, seed):
    """Distinct int64 values around 2^30 and 2^40 (f32 keeps 24 bits), some negative."""
    gen = torch.Generator().manual_seed(seed)
    big = torch.randperm(rows * n, generator=gen).reshape(rows, n) * 7 + 1
    return big + torch.tensor([2 ** 30, -(2 ** 40), 2 ** 40, 3])[torch.arange(rows) % 4, None]


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_integer_reductions_are_exact_over_a_dynamic_axis(name):
    fn = PROGRAMS[name]
    f = cleave.compile(fn, dynamic={"x": {1: "n"}}, verbose=False)
    # topk keeps its (static) axis 0 whole (test_dynamic_topk.py); the others reduce n
    shapes = [(37, 3), (37, 6)] if name == "topk" else [(5, 7), (5, 300)]
    assert_one_exact_compile(f, fn, [(_values(*s, seed=k),) for k, s in enumerate(shapes)])
