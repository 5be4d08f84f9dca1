"""Writes at indices (index_put, index_copy, index_add, index_fill, scatter, scatter_add)
compile as reads (`frontends/aten_scatter.py`); each was a graph break. A write into an
input (a KV cache's index_copy_) stays eager, where torch writes the rows alone."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import cleave


def mask_set(x):
    y = x.clone()
    y[y < 0] = 0.5
    return y * 2


def index_fill(x):
    return x.index_fill(1, torch.tensor([0, -2]), -1.0) + 1  # a negative index counts from the end


def topk_mask(x):
    v, i = x.topk(2, -1)
    return torch.full_like(x, float("-inf")).scatter(-1, i, v).softmax(-1)


def router_gates(x):
    w, i = x.softmax(-1).topk(3, -1)
    return torch.zeros_like(x).scatter(1, i, w / w.sum(-1, keepdim=True)) * 2


def scatter_add(x):
    i = (x.abs() * 3).long() % 5
    return torch.zeros(x.shape[0], 5, dtype=x.dtype).scatter_add(1, i, x) + 1


def index_copy(x):
    c = torch.zeros(x.shape[0], 9, dtype=x.dtype)
    c.index_copy_(1, torch.tensor([8, 2, 5, 0, 1, 3, 4]), x)
    return c + 1


def index_add(x):
    c = torch.ones(x.shape[0], 4, dtype=x.dtype)
    c.index_add_(1, torch.tensor([0, 3, 3, 1, 0, 2, 2]), x, alpha=0.5)
    return c * 1


def rows_put(x):
    c = torch.zeros(3, *x.shape, dtype=x.dtype)
    c[torch.tensor([2, 0])] = x * 2
    return c - 1


def put_accumulate(x):
    c = torch.zeros(4, x.shape[1], dtype=x.dtype)
    c.index_put_((torch.tensor([1, 1, 2]),), x[:3] * 2, accumulate=True)  # row 1 twice: both added
    return c


def last_write_wins(x):
    c = torch.zeros(x.shape[0], 3, dtype=x.dtype)
    c[:, torch.tensor([1, 1, 2])] = x[:, :3]  # column 1 twice: the last entry's, as torch's CPU kernel
    return c


def pairs_put(x):
    y = x.clone()  # entries on two axes, broadcast together; -1 counts from the end
    y[torch.tensor([[0], [2]]), torch.tensor([1, -1])] = torch.tensor([5.0, 6.0])
    return y * 1


def pairs_accumulate(x):
    y = torch.zeros(3, 4, dtype=x.dtype)
    y.index_put_((torch.tensor([0, 0, 2]), torch.tensor([1, 1, 3])), x[0, :3], accumulate=True)
    return y * 1


def pad_embedding(x):
    y = x.clone()  # a vector for each masked row: one value per trailing element
    y[x[:, 0] > 0] = torch.arange(7, dtype=x.dtype)
    return y * 1


def empty_index(x):
    y = x.clone()  # nothing written: the graph as written failed in the reference interpreter
    y[torch.tensor([], dtype=torch.long)] = 1.0
    return y * 1


CASES = [empty_index, pad_embedding, mask_set, index_fill, topk_mask, router_gates, scatter_add, index_copy, index_add, rows_put,
         put_accumulate, last_write_wins, pairs_put, pairs_accumulate]


def _no_break(f, *args):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # a graph break or a fallback warns
        return f(*args)


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_writes_at_indices_compile_exactly(fn):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(5, 7, generator=gen)
    f = torch.compile(fn, backend="cleave")
    torch.testing.assert_close(_no_break(f, x), fn(x), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(_no_break(cleave.compile(fn, verbose=False), x), fn(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fn", [index_copy, rows_put, mask_set, index_add, pad_embedding], ids=lambda f: f.__name__)
def test_writes_at_indices_under_dynamic_shapes_and_bf16(fn):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(3)
    f = torch.compile(fn, backend="cleave", dynamic=True)
    for rows in (5, 8, 11):
        x = torch.randn(rows, 7, generator=gen)
        torch.testing.assert_close(_no_break(f, x), fn(x), rtol=1e-6, atol=1e-6)
    xb = torch.randn(6, 7, generator=gen).bfloat16()
    torch.testing.assert_close(_no_break(torch.compile(fn, backend="cleave"), xb).float(), fn(xb).float(),
                               rtol=1e-2, atol=1e-2)


def test_a_write_into_an_input_stays_eager_and_exact():
    """A KV cache written in place: torch writes the row alone, where a kernel's result is
    the whole cache, copied back. The write is a graph break, named with its reason."""
    def step(cache, k):
        cache.index_copy_(0, torch.tensor([3]), k)
        return cache.sum(-1)

    torch._dynamo.reset()
    cache = torch.randn(6, 7)
    kept, k = cache.clone(), torch.randn(1, 7)
    with pytest.warns(UserWarning, match=r"aten.index_copy.default .*a write into an input stays eager"):
        got = torch.compile(step, backend="cleave")(cache, k)
    want = step(kept, k)
    torch.testing.assert_close(got, want)
    assert torch.equal(cache, kept)


def returned_index_fill(x):
    return torch.index_fill(x, 0, torch.tensor([1, 3]), 1.5)


def returned_scatter(x):
    return torch.scatter(x, 1, torch.tensor([[0], [2], [1], [0], [4]]), -2.0)


def returned_index_copy(x):
    return torch.index_copy(x, 1, torch.tensor([4, 0]), torch.ones(5, 2))


@pytest.mark.parametrize("fn", [returned_index_fill, returned_scatter, returned_index_copy], ids=lambda f: f.__name__)
def test_a_write_on_an_input_returned_as_a_new_tensor_compiles(fn):
    """Out of place on an input and returned directly, the write is a new tensor (the
    input keeps its values), not a write into the input: it compiles."""
    torch._dynamo.reset()
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(5))
    kept = x.clone()
    for f in (torch.compile(fn, backend="cleave"), cleave.compile(fn, verbose=False)):
        got = _no_break(f, x)
        torch.testing.assert_close(got, fn(kept), rtol=0, atol=0)
        assert torch.equal(x, kept) and got.data_ptr() != x.data_ptr()


def test_an_entry_outside_its_axis_writes_nothing():
    """Merged, (0, 9) of a 3 x 4 tensor would name position 9, row 2's second element:
    an entry outside its axis names none (eager raises; README, *Indices out of range*)."""
    def put(x):
        y = x.clone()
        y[torch.tensor([0, 1]), torch.tensor([9, 2])] = -1.0
        return y * 1

    torch._dynamo.reset()
    x = torch.randn(3, 4)
    want = x.clone()
    want[1, 2] = -1.0
    torch.testing.assert_close(_no_break(torch.compile(put, backend="cleave"), x), want)


def test_a_long_or_dynamic_index_accumulates_eagerly():
    """Each element compares with every index entry: an accumulating write of more than
    SHORT_INDEX entries stays eager, named, and exact."""
    from cleave.frontends.aten_scatter import SHORT_INDEX

    def histogram(i):
        return torch.zeros(10).index_add_(0, i, torch.ones(i.shape[0])) * 1

    torch._dynamo.reset()
    i = torch.randint(0, 10, (SHORT_INDEX + 1,))
    with pytest.warns(UserWarning, match=r"the index has 257 entries \(over 256\)"):
        got = torch.compile(histogram, backend="cleave")(i)
    torch.testing.assert_close(got, histogram(i))


def test_one_hot_gates_of_a_router():
    """The dense gates a MoE router builds by scatter, used in its combine."""
    def moe(x, w1, w2):
        probs = F.softmax(x @ w1.sum(-1).T, -1)
        w, i = probs.topk(2, -1)
        gates = torch.zeros_like(probs).scatter(1, i, w)
        return torch.einsum("te,etd->td", gates, torch.einsum("td,edf->etf", x, w1) @ w2)

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(11)
    x, w1, w2 = torch.randn(9, 8, generator=gen), torch.randn(4, 8, 6, generator=gen), torch.randn(6, 8, generator=gen)
    torch.testing.assert_close(_no_break(torch.compile(moe, backend="cleave"), x, w1, w2), moe(x, w1, w2),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("write", ["uint8 mask", "f16 values"])
def test_writes_torch_refuses_raise_as_eagerly(write):
    """A uint8 mask and values of another dtype: torch's index_put_ refuses both, and the
    compiled function raised nothing."""
    def put(x):
        y = x.clone()
        if write == "uint8 mask":
            y.index_put_(((x > 0).to(torch.uint8),), torch.tensor(0.5))
        else:
            y.index_put_((torch.tensor([0, 2]),), torch.ones(2, 5, dtype=torch.float16))
        return y * 1

    torch._dynamo.reset()
    x = torch.randn(4, 5)
    with pytest.raises(RuntimeError) as eager:
        put(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the graph break
        with pytest.raises(RuntimeError, match=re.escape(str(eager.value).split("\n")[0][:40])):
            torch.compile(put, backend="cleave")(x)
