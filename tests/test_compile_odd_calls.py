"""cleave.compile on calls users make that capture does not take whole: an unhashable
argument, a function returning no tensor, a swapped parameterless submodule, the dynamo
marks torch.export leaves on the caller's tensors, and a dim sympy cannot solve."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import sympy
import torch

import cleave
from cleave.ir import BindingError, Graph
from cleave.ir import dims as D


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor


def test_an_unhashable_argument_runs_through_dynamo():
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    f = cleave.compile(lambda p: p.a + p.b * 2, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.allclose(f(Pair(x, y)), x + y * 2)
        g = cleave.compile(lambda x, s: x * torch.from_numpy(s), verbose=False)
        s = np.full(5, 2.0, dtype=np.float32)
        assert torch.allclose(g(x, s), x * 2)


def test_a_function_returning_no_tensor_runs_quietly():
    f = cleave.compile(lambda x: (), verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(torch.randn(3, 4)) == ()
        assert f(torch.randn(5, 4)) == ()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.act = torch.nn.ReLU()
        self.seq = torch.nn.Sequential(torch.nn.Tanh())

    def forward(self, x):
        return self.seq(self.act(self.lin(x)))


def test_a_swapped_or_added_parameterless_submodule_recaptures():
    block = Block().eval()
    f = cleave.compile(block, verbose=False)
    x = torch.randn(3, 4)
    with torch.no_grad():
        f(x)
        block.act = torch.nn.Sigmoid()
        assert torch.allclose(f(x), block(x), atol=1e-6)
        block.seq.append(torch.nn.ReLU())
        assert torch.allclose(f(x), block(x), atol=1e-6)
        block.seq[0] = torch.nn.Identity()
        assert torch.allclose(f(x), block(x), atol=1e-6)
    assert f.recaptures == 3


def test_the_callers_tensors_keep_their_dynamo_marks():
    def pieces(x):
        return [t * 2 for t in x.unbind(0)]
    x = torch.randn(3, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cleave.compile(pieces, dynamic={"x": {0: "n"}}, verbose=False)(x)
    assert not hasattr(x, "_dynamo_dynamic_indices")
    torch.compile(pieces, backend="eager")(x)  # raised ConstraintViolationError on the mark left


def test_a_dim_sympy_cannot_solve_binds_through_its_floor():
    # a strided conv's output length (ViT's patches under dynamic shapes) reached sympy.solve;
    # the least n giving the size serves (test_floor_bind.py)
    g = Graph("floor_dim")
    x = g.input("x", (sympy.floor(D.symbol("n") / 4) - 4,), "f32")
    g.output(x.exp(), names=["y"])
    assert g.bind({"x": (7,)}) == {"n": 44}
    with pytest.raises(BindingError, match="no positive integer"):
        g.bind({"x": (-9,)})


def test_a_dynamic_axis_on_an_argument_nothing_reads_compiles_once():
    def softmax_twice(x, memory):  # memory unused, as a self-attention call's cross-attention input
        return torch.softmax(x, -1) * 2
    f = cleave.compile(softmax_twice, dynamic={"x": {0: "n"}, "memory": {0: "m"}}, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (5, 7):
            x, memory = torch.randn(n, 16), torch.randn(n + 2, 16)
            assert torch.allclose(f(x, memory), softmax_twice(x, memory), atol=1e-6)
    assert f.stats["compiles"] == 1 and f.stats["failed"] == 0


def test_threads_making_the_first_call_at_once_each_get_the_compiled_result():
    import threading

    def g(x, w):
        return torch.softmax(x @ w, -1) + x.sum(-1, keepdim=True)
    f = cleave.compile(g, verbose=False)
    barrier, results, errors = threading.Barrier(3), [], []

    def worker(seed):
        gen = torch.Generator().manual_seed(seed)
        x, w = torch.randn(5, 9, generator=gen), torch.randn(9, 9, generator=gen)
        barrier.wait()
        try:
            results.append(torch.allclose(f(x, w), g(x, w), atol=1e-5))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(repr(err))
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == [True] * 3
    assert f.stats["compiles"] + f.stats["from_cache"] == 1 and f.capture_error is None


@pytest.mark.parametrize("dtype, scalar_dtype", [(torch.float32, torch.float64), (torch.bfloat16, torch.float32)])
def test_a_zero_dim_float_of_another_width_computes_in_the_tensors_dtype(dtype, scalar_dtype):
    def scaled(x, s):
        return x * s + 1
    gen = torch.Generator().manual_seed(torch.seed() % 10_000)
    x, s = torch.randn(3, 5, generator=gen).to(dtype), torch.tensor(0.1, dtype=scalar_dtype)
    f = cleave.compile(scaled, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an f64 op ran the function eagerly, with a warning
        got = f(x, s)
    # x * s in x's op-math type from s's full value, rounded once, as torch computes it
    assert got.dtype == dtype and torch.equal(got, scaled(x, s))


def test_a_large_int_argument_is_not_materialised():
    # n reaches the kernels as an int; the [n + 1] input carrying it was copied whole
    # (2**40 bytes: the launch failed, and the region ran eagerly)
    def times(x, n):
        return x * n
    f = torch.compile(times, backend="cleave", dynamic=True)
    x = torch.arange(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (3, 5, 2 ** 40):
            assert torch.equal(f(x, n), times(x, n))


def test_an_out_argument_of_another_shape_is_resized_as_eager_does():
    """The write-back copied the result into `o` of its old shape and raised."""
    def mul_into(x, o):
        torch.mul(x, 2, out=o)
        return o.sum()

    def transpose_in_place(x):
        x.t_()
        x.mul_(2)
        return x.sum(0)

    f = cleave.compile(mul_into, verbose=False)
    x = torch.randn(3, 4)
    for shape in ((3, 4), (2, 2), (5, 4)):
        o, o2 = torch.zeros(shape), torch.zeros(shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager's own: "An output ... was resized"
            torch.testing.assert_close(f(x, o), mul_into(x, o2))
        assert o.shape == o2.shape and torch.equal(o, o2)
    g = cleave.compile(transpose_in_place, verbose=False)
    a, b = torch.randn(3, 4), None
    b = a.clone()
    torch.testing.assert_close(g(a), transpose_in_place(b))
    assert a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)


def test_max_and_topk_pairs_and_view_as_are_captured():
    """max's values and indices were taken for views of one another, and view_as had
    no mapping: each sent the function through dynamo."""
    for fn in (lambda x: x.max(1), lambda x: torch.topk(x, 2, 1), lambda x: (x * 2).view_as(x) + 1):
        f = cleave.compile(fn, verbose=False)
        x = torch.randn(4, 6)
        got, want = f(x), fn(x)
        for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
            assert torch.equal(g, w)
        assert f.capture_error is None
