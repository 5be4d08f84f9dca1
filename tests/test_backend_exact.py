"""Programs through torch.compile(backend="cleave") whose results were silently wrong:
each now matches eager exactly, or runs eagerly with a warning that names the op."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import cleave
from cleave.ir import ShapeError, parse_graph

from backend_case import ctx  # noqa: F401 (a fixture)


def test_adding_bools_is_a_logical_or(ctx):
    """torch's add on bools is `or`; computed on 1-bit integers True + True wrapped to
    False, and a count of true entries came out short."""
    def votes(a, b):
        either = (a > 0) + (b > 0)
        return either, either.sum(), (a > 0) + True

    f = torch.compile(votes, backend="cleave")
    a, b = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0]), torch.tensor([1.0, -1.0, 1.0, -1.0, -3.0])
    for got, want in zip(f(a, b), votes(a, b)):
        assert got.dtype == want.dtype and torch.equal(got, want)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_xor_of_bools_and_bool_scalars_compile(ctx):
    """`^` on bools was not mapped (a graph break), and a Python bool on the other side
    of `&`, `|` or `^` failed the whole region's lowering (its operand check read the
    scalar's dtype)."""
    def flags(a, b):
        return (a > 0) ^ (b > 0), torch.logical_xor(a, b), (a > 0) & True, (a > 0) | False, (a > 0) ^ True

    f = torch.compile(flags, backend="cleave")
    a, b = torch.tensor([1.0, 1.0, -1.0, 0.0, 2.0]), torch.tensor([1.0, -1.0, 1.0, 0.0, 0.0])
    for got, want in zip(f(a, b), flags(a, b)):
        assert got.dtype == want.dtype and torch.equal(got, want)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_integers_concatenated_or_padded_stay_integers(ctx):
    """torch.cat and F.pad of int64 tensors: the concatenation was computed in f32, and
    a pad's fill lifted as a float made the result float, so values past 2**24 came
    back rounded (16777217 as 16777216). The pad's fill takes the tensor's dtype, as
    torch converts it (7.9 fills an integer tensor with 7)."""
    def join(a, b):
        return torch.cat([a, b]) + 1, F.pad(a, (1, 2), value=7.9), torch.cat([a[None], b[None, :2]], 1)

    f = torch.compile(join, backend="cleave")
    a = torch.tensor([16777217, 123456789, 2 ** 40 + 3, -(2 ** 35) - 7])
    b = torch.tensor([2 ** 53 + 1, -3, 5])
    for got, want in zip(f(a, b), join(a, b)):
        assert got.dtype == want.dtype and torch.equal(got, want)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_integer_and_f64_contractions_run_eagerly_with_a_warning(ctx):
    """Kernels contract in f32: an int64 product past 2**24 came back rounded
    (4097 * 4097 + 4097 as 16789504) and an f64 one at f32's 1e-7. Such a contraction
    now runs eagerly, and the warning names the op and the dtype."""
    def product(a, b):
        return a @ b

    cases = [(torch.tensor([[4097, 4097]]), torch.tensor([[4097], [1]])),
             (torch.randn(5, 7, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64))]
    for a, b in cases:
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = torch.compile(product, backend="cleave")(a, b)
        assert torch.equal(got, product(a, b))
        dtype = str(a.dtype).removeprefix("torch.")
        assert any("aten.mm" in str(w.message) and f"contraction on {dtype}" in str(w.message) for w in caught)


def test_a_query_whose_every_key_is_masked_attends_to_nothing(ctx):
    """SDPA with a mask that hides every key from one query: torch gives 0 for that
    row (its _safe_softmax), cleave gave NaN (exp(-inf - -inf)). Bool and additive
    masks, the other rows as eager's."""
    def attend(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    f = torch.compile(attend, backend="cleave")
    q, k, v = (torch.randn(2, 3, 7, 16) for _ in range(3))
    hidden = torch.rand(7, 7) > 0.3
    hidden[2] = False
    bias = torch.randn(7, 7)
    bias[4] = float("-inf")
    for mask in (hidden, bias):
        got, want = f(q, k, v, mask), attend(q, k, v, mask)
        assert not got.isnan().any() and torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_the_scheduler_refuses_an_integer_or_f64_matmul():
    """Other paths to kernels (cleave.compile, a graph written in the IR) meet the same
    limit in the scheduler: a clear error naming the MatMul, not rounded results."""
    for dtype in ("i64", "f64"):
        graph = parse_graph(f'''graph product {{
  %0 = input(name="a", shape=[m,k], dtype={dtype}) : {dtype}[m,k]
  %1 = input(name="b", shape=[k,n], dtype={dtype}) : {dtype}[k,n]
  %2 = matmul(%0, %1) : {dtype}[m,n]
  return y=%2
}}''')
        with pytest.raises(ShapeError, match=f"matmul %2 on {dtype}"):
            cleave.schedule(graph, {"m": 5, "k": 7, "n": 3})


def test_an_output_that_is_a_view_of_another_shares_its_memory(ctx):
    """`return z, z.t()`: eager's second output is a view of the first, so a write into
    z shows in it. The kernels write each output anew; the views are made again from
    the output they view, as Inductor reinterprets its buffers."""
    def both(x, y):
        z = x + y
        return z, z.t(), z[1:, ::2], z

    f = torch.compile(both, backend="cleave")
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    got, want = f(x, y), both(x, y)
    for g, w in zip(got, want):
        assert torch.equal(g, w) and g.stride() == w.stride()
    got[0].add_(10)
    want[0].add_(10)
    for g, w in zip(got[1:], want[1:]):
        assert torch.equal(g, w)
    assert got[3] is got[0]
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_an_index_built_by_concatenation_gathers(ctx):
    """`x[torch.cat([i, j])]`: the concatenated index was an f32 tile, which Triton
    rejects as a pointer offset, so the region failed at its first launch and ran
    eagerly."""
    def pick(x, i, j):
        return x[torch.cat([i, j])] * 2

    f = torch.compile(pick, backend="cleave")
    x, i, j = torch.randn(7, 5), torch.tensor([1, 3]), torch.tensor([0, 6])
    assert torch.equal(f(x, i, j), pick(x, i, j))
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_gather_with_an_index_shorter_than_its_input(ctx):
    """torch.gather's index may be shorter than its input along the other axes: that
    ran eagerly ("dim 0 is 37 vs 5"), and under dynamic shapes the candidate check found
    no small binding with the index's extent within the input's."""
    def pick(x, i):
        return torch.gather(x, 0, i) + 1

    f = torch.compile(pick, backend="cleave")
    for (rows, cols), (i_rows, i_cols) in (((37, 45), (5, 3)), ((13, 70), (7, 9))):
        x = torch.randn(rows, cols)
        i = torch.randint(0, rows, (i_rows, i_cols))
        assert torch.equal(f(x, i), pick(x, i))
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_a_product_of_aranges_is_computed_in_int64(ctx):
    """torch.arange is int64; in the kernel an iota is an int32 tile, and the product of
    two, or its square or cube, overflowed past 2**31 (46341 * 46341 came back negative)."""
    def squares(x):
        i = torch.arange(x.shape[0])
        return i * i + x, i ** 2 - x, i ** 3

    x = torch.zeros(46342, dtype=torch.long)
    for got, want in zip(torch.compile(squares, backend="cleave")(x), squares(x)):
        assert torch.equal(got, want)


def test_a_pad_to_a_multiple_of_a_count_passed_as_an_int(ctx):
    """F.pad to a multiple of n, then blocks of n: the pad is Mod(-T, n) rows, which the
    kernels printed as `(-T) % n`. Triton's % truncates toward 0 as C's (-7 % 8 is -7),
    where sympy's Mod and the host's grid floor (1): the kernel read past its input."""
    def blocks(x, n):
        y = F.pad(x, (0, 0, 0, (n - x.shape[1] % n) % n))
        return y.view(y.shape[0], -1, n, y.shape[-1]).sum(2)

    f = torch.compile(blocks, backend="cleave", dynamic=True)
    for t, n in ((7, 8), (13, 8), (13, 5)):
        x = torch.randn(2, t, 5, generator=torch.Generator().manual_seed(t))
        got, want = f(x, n), blocks(x, n)
        assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_python_scalars_beside_half_and_bool_tensors_are_torchs(ctx):
    """torch computes a bf16 or f16 tensor with a Python number in f32, the number not
    rounded to the half type (x * 1.004 is not x, x_f16 * 1e5 is finite), compares it in
    the half type (x_bf16 == 0.1 holds), and adds an int to a bool as an int64 (True + 2
    is 3). cleave rounded the number to the half type first, the interpreter truncating
    its literal (0.1 became 0.099609375), and added in bool."""
    def with_scalars(x, m):
        return (x * 1.004, x * 1e5, x / 1e5, x + 1e-3, x > 0.1, x == 0.1, 0.1 < x,
                x.masked_fill(x > 0.5, 0.1), (m > 0) + 2, (m > 0) * 3, (m > 0) + (-1))

    f = torch.compile(with_scalars, backend="cleave")
    m = torch.tensor([1.0, -1.0, 2.0, 0.0])
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.tensor([0.1, 1.0, 0.3, -0.25], dtype=dtype)
        for got, want in zip(f(x, m), with_scalars(x, m)):
            assert got.dtype == want.dtype and torch.equal(got, want), (dtype, got, want)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_integer_tensors_beside_half_tensors_take_the_half_type_first(ctx):
    """torch converts an integer or bool tensor beside a bf16 or f16 one to the half type
    before the op: int32 2049 == f16 2048 holds, and 2049 + 0.5 in f16 is 2048. The
    kernels took the integer to f32 whole and compared or added there."""
    def mixed(i, h, m):
        return i == h, i < h, h <= i, i + h, h * i, torch.maximum(i, h), (m > 0) + h

    f = torch.compile(mixed, backend="cleave")
    i = torch.tensor([2049, 4097, 3, -2049, 257, 1023], dtype=torch.int32)
    m = torch.tensor([1.0, -1.0, 2.0, 0.0, 1.0, -3.0])
    for dtype in (torch.float16, torch.bfloat16):
        h = torch.tensor([2048, 4096, 3, -2048, 256, 0.5], dtype=dtype)
        for got, want in zip(f(i, h, m), mixed(i, h, m)):
            assert got.dtype == want.dtype and torch.equal(got, want), (dtype, got, want)
    assert torch.equal(cleave.compile(lambda a, b: a == b)(i, h), i == h)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_a_half_tensor_filled_with_a_number_holds_the_number_rounded(ctx):
    """A fill of a bf16 or f16 tensor (full_like, masked_fill, where with a number, a
    pad value, a half arange) holds the half's value: torch converts the number to the
    tensor's type. The kernels kept 0.1 as 0.1 in f32, which a widening cast or a
    compare then showed (bf16(0.1) is 0.10009765625, bf16(257) is 256)."""
    def fills(a, m):
        return (torch.full_like(a, 0.1).float(), a.masked_fill(m, 257).float(), torch.where(m, 0.1, a).float(),
                a == torch.full_like(a, 0.1), F.pad(a, (1, 2), value=0.1).float(),
                torch.arange(a.shape[0] + 300, dtype=a.dtype)[-5:].float())

    f = torch.compile(fills, backend="cleave")
    m = torch.tensor([True, False, True, False])
    for dtype in (torch.bfloat16, torch.float16):
        a = torch.tensor([0.1, 0.2, 256.0, -3.0], dtype=dtype)
        for got, want in zip(f(a, m), fills(a, m)):
            assert got.dtype == want.dtype and torch.equal(got, want), (dtype, got, want)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_a_loss_torch_decomposes_wrongly_runs_as_torchs_kernel():
    """torch's decomposition of multilabel_margin_loss, applied while AOTAutograd traces,
    gives 2.05 where its kernel gives 0.85: the frame runs eagerly, with a warning naming
    the op, as a function, a module or the aten op."""
    x = torch.tensor([[0.1, 0.2, 0.4, 0.8], [0.3, -0.5, 0.2, 0.1], [1.0, 2.0, -1.0, 0.5]])
    target = torch.tensor([[3, 0, -1, 1], [1, -1, 0, 0], [2, 1, 0, 3]])
    calls = [lambda x, t: F.multilabel_margin_loss(x, t, reduction="none"),
             torch.nn.MultiLabelMarginLoss(),
             lambda x, t: torch.ops.aten.multilabel_margin_loss_forward(x, t, 1)[0] * 2]
    for fn in calls:
        with pytest.warns(UserWarning, match="multilabel_margin_loss(_forward)?: torch.s decomposition"):
            got = torch.compile(fn, backend="cleave")(x, target)
        assert torch.equal(got, fn(x, target))


def test_an_overload_called_directly_or_a_custom_op_compiles_or_breaks_there(ctx):
    """`torch.ops.aten.mul.Tensor(...)` (an overload, not its packet), a custom op and
    torch._check under dynamic shapes crashed the backend (AttributeError: 'OpOverload'
    object has no attribute '_qualified_op_name')."""
    @torch.library.custom_op("cleave_test::halve", mutates_args=())
    def halve(x: torch.Tensor) -> torch.Tensor:
        return x / 2

    @halve.register_fake
    def _(x):
        return torch.empty_like(x)

    def overload(x):
        return torch.ops.aten.mul.Tensor(x, 2.0) + 1

    def custom(x):
        return halve(x * 3) + 1

    def checked(x):
        torch._check(x.shape[0] > 2)
        return x[:3] * 2

    x = torch.randn(5)
    for fn, dynamic in ((overload, False), (custom, False), (checked, True)):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            got = torch.compile(fn, backend="cleave", dynamic=dynamic)(x)
        assert torch.equal(got, fn(x))
        assert fn is not custom or any("cleave_test.halve" in str(w.message) for w in said)


def test_a_constant_without_dense_storage_runs_eagerly():
    """A sparse global, or a tensor torch.func.grad wraps, met as a constant, crashed
    cleave.compile ("Cannot access data pointer of Tensor that doesn't have storage")."""
    sparse = torch.tensor([[2.0]]).to_sparse()

    def dense_of_sparse(x):
        return x * sparse.to_dense()

    def grad_of(x):
        return torch.func.grad(lambda t: (t.sin() * t).sum())(x)

    for fn, x in ((dense_of_sparse, torch.ones(3)), (grad_of, torch.randn(5))):
        torch.testing.assert_close(cleave.compile(fn, verbose=False)(x), fn(x))


def test_inputs_named_like_outputs_or_intermediates_keep_their_own_buffers():
    """An argument called `out` or `out0`, or a module parameter `self.out`, had the
    name of cleave's default output: one kernel argument served both, and the kernel
    read the output it wrote. An input called `t2` could meet an intermediate's name."""
    def scaled(out, y):
        return (out * y).sum(0)

    def both(out0, y):
        return out0 * y, out0 + y

    def through(t2, t3):
        return torch.softmax(t2 @ t3, -1).sum(-1)

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.out = torch.nn.Parameter(torch.full((3,), 3.0))

        def forward(self, x):
            return x * self.out

    a, b = torch.ones(5, 3), torch.full((5, 3), 2.0)
    with torch.no_grad():
        for fn, args in ((scaled, (a, b)), (both, (a, b)), (through, (a, b.t())), (Scale(), (b,))):
            got, want = cleave.compile(fn)(*args), fn(*args)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                torch.testing.assert_close(g, w)


def test_degenerate_reductions_and_an_ignored_addend_are_torchs(ctx):
    """var/std where N - correction <= 0 is NaN (torch divides by max(0, N - correction);
    cleave divided by the negative count: -0.); addmm and baddbmm with beta=0 ignore the
    input, NaN or inf in it included; a 0-d tensor reduced or softmaxed over dim 0 is
    itself, or 1 (the axis normalisation divided by its rank of 0)."""
    def degenerate(x, c, a, b, s):
        return (x.var(1, correction=2), x.std(1), torch.var_mean(x, 1), torch.addmm(c, a, b, beta=0),
                torch.baddbmm(c[None], a[None], b[None], beta=0), s.sum(0), s.softmax(0), s.log_softmax(-1))

    f = torch.compile(degenerate, backend="cleave")
    c = torch.tensor([[float("nan"), 0.0], [0.0, float("inf")]])
    args = (torch.randn(3, 1), c, torch.eye(2), torch.ones(2, 2), torch.tensor(1.5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own "degrees of freedom is <= 0"
        got, want = f(*args), degenerate(*args)
    for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        assert g.shape == w.shape and torch.allclose(g, w, equal_nan=True), (g, w)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_a_product_with_alpha_zero_is_skipped_as_torch_skips_it(ctx):
    """addmm and addmv with alpha=0 ignore the product, NaN or inf in the operands
    included (cleave multiplied it by 0: NaN); with beta=0 too, zeros. baddbmm computes
    it (CPU eager)."""
    def skipped(c, a, b, v, bias):
        return (torch.addmm(c, a, b, alpha=0), torch.addmm(bias, a, b, alpha=0, beta=2.5),
                torch.baddbmm(c[None], a[None], b[None], alpha=0, beta=0), torch.addmv(bias, b, v, alpha=0))

    f = torch.compile(skipped, backend="cleave")
    a = torch.tensor([[float("nan"), 1.0, 2.0], [float("inf"), 0.0, 1.0]])
    args = (torch.randn(2, 3), a, torch.full((3, 3), float("inf")), torch.randn(3), torch.randn(3))
    got, want = f(*args), skipped(*args)
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g.nan_to_num(7.0), w.nan_to_num(7.0)), (g, w)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_var_of_integers_raises_as_eager_does():
    f = torch.compile(lambda i: i.var(1), backend="cleave")
    with pytest.raises(RuntimeError, match="floating point"):
        f(torch.arange(12).reshape(3, 4))


def test_topk_ranks_nan_highest_and_takes_each_entry_once(ctx):
    """torch.topk ranks NaN above every number (and, for the smallest k, after them). The
    kernel's max skipped NaN: no lane matched, and it returned -inf with index n, out of
    range. A row's -inf entries came out as one index repeated: a taken lane, set to
    -inf, was taken again."""
    nan, inf = float("nan"), float("inf")

    def ranked(x):
        largest, smallest = torch.topk(x, 3, dim=1), torch.topk(x, 2, dim=1, largest=False)
        return largest.values, largest.indices, smallest.values, smallest.indices, x.argmax(1)

    x = torch.tensor([[1.0, nan, 3.0, 0.5, 2.0], [4.0, 1.0, 2.0, 3.0, 0.0], [1.0, -inf, 2.0, -inf, -inf]])
    got, want = torch.compile(ranked, backend="cleave")(x), ranked(x)
    for values, indices, k in ((got[0], got[1], 3), (got[2], got[3], 2)):
        assert all(len(set(row.tolist())) == k for row in indices)  # torch orders ties as it likes: no repeats
        assert torch.allclose(x.gather(1, indices), values, equal_nan=True)
    for g, w in zip((got[0], got[2], got[4]), (want[0], want[2], want[4])):
        assert torch.allclose(g, w, equal_nan=True) if g.is_floating_point() else torch.equal(g, w), (g, w)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_smallest_k_take_inf_before_nan(ctx, dtype):
    """Flipped for the smallest k, +inf and NaN both became -inf and tied: a NaN earlier
    in the row than the +inf was taken in its place ([1, 2, nan] for [1, 2, inf])."""
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[nan, inf, 1.0, 2.0], [3.0, inf, 0.0, nan], [nan, -inf, inf, nan]], dtype=dtype)
    got = torch.compile(lambda x: torch.topk(x, 3, dim=1, largest=False), backend="cleave")(x)
    want = torch.topk(x, 3, dim=1, largest=False)
    assert torch.equal(got.indices, want.indices), (got.indices, want.indices)
    torch.testing.assert_close(got.values, want.values, rtol=0, atol=0, equal_nan=True)
    assert ctx.stats()["failed"] == 0 and ctx.stats()["unsupported"] == []


def test_tanh_keeps_its_relative_precision_near_zero(ctx):
    """tanh as 2 sigmoid(2x) - 1 cancels near 0: tanh(1e-6) came out 7% off and
    tanh(3e-10) as 0."""
    x = torch.tensor([3e-10, 1e-6, -1e-5, 1e-3, 0.05, 0.0625, 0.07, -0.5, 3.0, 20.0, -50.0, -0.0])
    got = torch.compile(torch.tanh, backend="cleave")(x)
    want = torch.tanh(x.double())
    assert ((got.double() - want).abs() <= 2e-6 * want.abs()).all(), (got, want)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_cat_and_stack_of_many_tensors_compile(ctx):
    """The search encodes an opaque op of at most 3 operands: a cat of 4 or more ran the
    whole region eagerly. They join as nested concats of at most 3."""
    def joined(a, b, c, d, e):
        return torch.cat([a, b, c, d, e], 0) * 2, torch.stack([a, b, c, d], 1).sum(1), torch.cat([a, b] * 4, 1)

    args = [torch.randn(7, 3, generator=torch.Generator().manual_seed(i)) for i in range(5)]
    for got, want in zip(torch.compile(joined, backend="cleave", dynamic=True)(*args), joined(*args)):
        assert torch.equal(got, want)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_float_functions_of_bools_and_integer_powers(ctx):
    """sin, sqrt, sigmoid... of a bool tensor failed on first launch (Triton's sin of a
    1-bit integer); an integer power past the cube went through exp and log in f32
    (1000 ** 5 rounds there) and now runs eagerly, named."""
    def of_bools(m):
        return torch.sin(m), torch.sqrt(m), torch.sigmoid(m), m ** 0.5, m.to(torch.int64) ** 3 + m.to(torch.int64) ** 0

    m = torch.tensor([True, False, True])
    for got, want in zip(torch.compile(of_bools, backend="cleave")(m), of_bools(m)):
        assert got.dtype == want.dtype and torch.allclose(got.double(), want.double())
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st
    i = torch.tensor([1000, -7, 3])
    with pytest.warns(UserWarning, match="integer power"):
        assert torch.equal(torch.compile(lambda i: i ** 5 + 1, backend="cleave")(i), i ** 5 + 1)


def test_values_computed_in_float64_run_eagerly_with_a_warning():
    """The kernels compute floats in f32: exp of a float64 tensor, or of x.double(), came
    back at f32's 1e-7 relative error (tanh(1e-12) as 0). Such ops run eagerly, named."""
    def upcast(x):
        d = x.double()
        return torch.exp(d) / 3, torch.tanh(d * 1e-12), (d / 3).sum()

    x = torch.tensor([0.5, 1e-3, 0.3, 2.0, 1e-12])
    with pytest.warns(UserWarning, match="float64"):
        got = torch.compile(upcast, backend="cleave")(x)
    for g, w in zip(got, upcast(x)):
        assert torch.equal(g, w)


def test_same_expression_of_two_symbols_compiles_once_they_are_one(ctx):
    """`x[::2] = y[::2] + 1` after a second shape: dynamo gives x and y symbols of their
    own, and the copy's broadcast met floor(s/2 + 1/2) against floor(t/2 + 1/2): the
    region ran eagerly. Such a pair is read as one symbol, as s + 1 against t + 1 was."""
    def every_other(x, y):
        x[::2] = y[::2] + 1
        return x

    f = torch.compile(every_other, backend="cleave")
    for shape in ((7, 13), (5, 9)):
        x, y = (torch.randn(*shape, generator=torch.Generator().manual_seed(k)) for k in range(2))
        assert torch.equal(f(x.clone(), y), every_other(x.clone(), y))
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_halves_of_a_dynamic_width_compile(ctx):
    """GLU's `a, b = x.chunk(2, -1)` over a dynamic width s: the halves are ceil(s/2)
    and s - ceil(s/2), which `a * sigmoid(b)` needs equal, and the region ran eagerly.
    s is read as 2t (dynamo guards the width even), and one compile serves every t."""
    def glu(x):
        a, b = x.chunk(2, dim=-1)
        return a * torch.sigmoid(b)

    f = torch.compile(glu, backend="cleave", dynamic=True)
    for half in (3, 5, 8):
        x = torch.randn(4, 2 * half, generator=torch.Generator().manual_seed(half))
        assert torch.allclose(f(x), glu(x), atol=1e-6)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st
    assert st["operators"] == 1, st


def test_views_into_blocks_of_a_dynamic_size_compile(ctx):
    """Patch merging, `x.reshape(B, T // 4, 4 * C) @ w`, and Swin's window partition and
    reverse under dynamic shapes: torch guards T (and H, W) a multiple of the block, which
    the IR kept as constraints (a MatMul met 4·C as C·floor(T/floor(T/4)) and ran
    eagerly; the windows' candidate check found no small binding, bumped to sizes of
    10^5, and skipped the check). Such a size is read as a multiple of its block."""
    w = torch.randn(12, 5, generator=torch.Generator().manual_seed(0))

    def merge(x):
        b, t, c = x.shape
        return x.reshape(b, t // 4, 4 * c) @ w

    def windows(x, ws=4):
        b, h, wd, c = x.shape
        p = x.view(b, h // ws, ws, wd // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        a = (p @ p.transpose(1, 2)).softmax(-1) @ p
        a = a.view(b, h // ws, wd // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
        return a.reshape(b, h, wd, c)

    f = torch.compile(merge, backend="cleave", dynamic=True)
    for t in (8, 20):
        x = torch.randn(2, t, 3, generator=torch.Generator().manual_seed(t))
        assert torch.allclose(f(x), merge(x), atol=1e-5)
    g = torch.compile(windows, backend="cleave")
    for s in (4, 8):
        x = torch.randn(2, s, s + 4, 3, generator=torch.Generator().manual_seed(s))
        assert torch.allclose(g(x), windows(x), atol=1e-5)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_log_softmax_and_variance_keep_f32_accuracy_at_large_values(ctx):
    """log_softmax was x - (max + log(sum)): the sum of a large max and a small log
    rounded first (3e-4 relative off at logits around 1e4; cross_entropy too). var and
    std took the f32-rounded mean uncorrected (5e-3 off on rows of 1e6 ± 1)."""
    def stats(x, target):
        return x.log_softmax(-1), F.cross_entropy(x, target), x.var(-1), x.std(-1, correction=0)

    f = torch.compile(stats, backend="cleave")
    gen = torch.Generator().manual_seed(0)
    for offset in (1e4, 1e6):
        x = offset + torch.randn(6, 37, generator=gen)
        target = torch.randint(0, 37, (6,), generator=gen)
        want = stats(x.double(), target)
        for got, ref in zip(f(x, target), want):
            assert ((got.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_fp16_attention_scaled_past_one_stays_finite(ctx):
    """`scale-into-prologue` moved SDPA's scale (100) onto q, whose f16 operand then
    overflowed (q = 1000 -> 1e5 > 65504): every output was NaN. Rules that move a factor
    into a MatMul operand say `wide_operands()` and are left out where operands are f16."""
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=100.0)

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 5, 16, generator=gen)
    q[..., 0] = 1000.0
    k = torch.randn(1, 2, 9, 16, generator=gen) * 0.1
    k[..., 0] = 1e-3
    v = torch.randn(1, 2, 9, 16, generator=gen)
    q, k, v = q.half(), k.half(), v.half()
    out = torch.compile(attention, backend="cleave", dynamic=True)(q, k, v)
    assert not out.isnan().any()
    want = attention(q.double(), k.double(), v.double())
    assert (out.double() - want).abs().max() < 0.1  # scores of ~100 from f16 keys: eager's own error is 0.01-0.07
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_half_attention_scores_stay_f32_in_every_plan(ctx):
    """SDPA's q·kᵀ scores are f32 in torch's kernels. Where the head dim is dynamic the
    plan stores them between kernels, and stored in f16 (their node's type) |q·kᵀ| past
    65504 was inf and the softmax NaN on almost every output; a half MatMul's result
    only read widened to f32 is stored in f32 (scheduler.partition.stored_dtype)."""
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    gen = torch.Generator().manual_seed(0)
    q, k, v = (60 + 40 * torch.randn(1, 1, 37, 16, generator=gen) for _ in range(3))
    q, k, v = q.half(), k.half(), (v / 100).half()
    out = torch.compile(attention, backend="cleave", dynamic=True)(q, k, v)
    want = attention(q.double(), k.double(), v.double())
    eager = attention(q, k, v).double()
    assert out.isfinite().all()
    assert (out.double() - want).abs().max() <= 2 * (eager - want).abs().max() + 1e-3
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_values_are_rounded_where_a_step_reads_them(ctx, dtype):
    """Half intermediates are computed in f32; a compare, a cast to an integer and a floor
    read them rounded, as eager does: f16 g * 1024 past 65504 was finite to isfinite (a
    GradScaler-style overflow check passed), (g + 1) == g never held at 2049, and
    (h * 3).to(int32) was off by up to 4."""
    def steps(g, h):
        return (torch.isfinite(g * 1024.0).all(), (g + 1) == g, (h * 3).to(torch.int32),
                torch.floor(h * 1.3), (h / 3) < 0.7)

    g = torch.tensor([100.0, 2.0, 3000.0, 2049.0, 60000.0], dtype=dtype)
    h = torch.tensor([3564.0, 1.7, -2.3, 0.7, 10001.0], dtype=dtype)
    got = torch.compile(steps, backend="cleave")(g, h)
    for a, b in zip(got, steps(g, h)):
        assert a.dtype == b.dtype and torch.equal(a, b), (a, b)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_a_compare_of_a_computed_bf16_value_checks_against_eager_roundings():
    """The decoded input graph rounds a compare's bf16 operand as torch does, and the fp64
    reference did not: the check called the input graph itself a mismatch
    (CandidateRejected, "no rule (the input graph, decoded)") and dropped every rewrite."""
    from cleave.search import CandidateRejected

    def above(x):
        return (x - x.mean(-1, keepdim=True)) >= 0.3

    x = torch.randn(7, 33, generator=torch.Generator().manual_seed(3)).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CandidateRejected)
        got = cleave.compile(above, dynamic={"x": {0: "n"}}, verbose=False)(x)
    assert torch.equal(got, above(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_default_eps_of_a_half_input_is_f32s(dtype):
    """torch computes a half RMSNorm in f32, with f32's machine epsilon for `eps=None`
    (nn.RMSNorm's default); cleave took the half type's (bf16 0.0078): rows of size 0.05
    came out 49% off under cleave.compile."""
    norm = torch.nn.RMSNorm(33).to(dtype)
    x = (0.05 * torch.randn(5, 33, generator=torch.Generator().manual_seed(0))).to(dtype)
    with torch.no_grad():
        got = cleave.compile(norm, verbose=False)(x)
        want = norm(x)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)


def test_a_loss_against_constant_labels_compiles(ctx):
    """Labels all 0 (as InfoNCE losses write them) gather the bias at one index for every
    row: that load's address was a scalar under the rows' mask, which tl.load refuses, and
    the whole function ran eagerly after its first launch failed."""
    def loss(x, w, b):
        return F.cross_entropy(x @ w + b, torch.zeros(x.shape[0], dtype=torch.long))

    f = torch.compile(loss, backend="cleave")
    x, w, b = torch.randn(5, 16), torch.randn(16, 7), torch.randn(7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = f(x, w, b)
    want = loss(x.double(), w.double(), b.double())
    assert abs(got.item() - want.item()) < 1e-5 * abs(want.item())
    st = ctx.stats()
    assert st["failed"] == 0 and st["graph_breaks"] == 0, st
