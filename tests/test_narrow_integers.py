"""int8, uint8 and int16 tensors, and the bit operations on integers: packed weights
unpacked and dequantised in the MatMul's kernel. They ran eagerly: a region with an
int8 input was not captured at all ("dtype torch.int8 has no IR equivalent"), and
`&`, `|`, `^`, `~`, `<<`, `>>` compiled on bools only."""
from __future__ import annotations

import itertools

import pytest
import torch

from cleave.interpreter import TORCH_DTYPES
from cleave.ir import Graph, ShapeError
from cleave.ir.dtypes import DType, promote

from backend_case import ctx  # noqa: F401 (a fixture)


def _exact(got, want):
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
        assert torch.equal(g, w), (i, g, w)


def _compiled_whole(ctx):
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_promotion_of_every_pair_is_torchs():
    for a, b in itertools.product(DType, DType):
        assert TORCH_DTYPES[promote(a, b)] == torch.promote_types(TORCH_DTYPES[a], TORCH_DTYPES[b]), (a, b)


def test_bit_ops_of_floats_are_refused_by_name():
    g = Graph("g")
    x = g.input("x", (3,), "f32")
    with pytest.raises(ShapeError, match="bit_and: takes integer or bool operands, not f32"):
        g.add("bit_and", x, x)
    b = g.input("b", (3,), "bool")
    with pytest.raises(ShapeError, match="shl: takes integer operands, not bool"):
        g.add("shl", b, b)


def test_narrow_integer_arithmetic_and_bit_ops_are_exact(ctx):
    """Wrapping arithmetic in the narrow type, promotion across signedness (uint8 with
    int8 meets at int16), reductions (a sum in int64 as torch's), and each bit op."""
    def ops(a, b, c):
        return (a & b, a | 3, a ^ b, ~a, ~b, a * 3 + 100, b + 200, b.to(torch.int16) - c, a.sum(-1),
                (a * 3).amax(-1), b.amin(-1), (c >> 3) + a, c.to(torch.float32) * 0.5, (b > a) & (c > 0))

    f = torch.compile(ops, backend="cleave", dynamic=True)
    for n in (9, 13):
        a = torch.randint(-128, 128, (3, n), dtype=torch.int8)
        b = torch.randint(0, 256, (3, n), dtype=torch.uint8)
        c = torch.randint(-30000, 30000, (3, n), dtype=torch.int16)
        _exact(f(a, b, c), ops(a, b, c))
    _compiled_whole(ctx)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_shifts_by_any_amount_are_torchs(ctx, dtype):
    """torch shifts by an amount outside [0, bits) to 0 (left) or the sign (right); on
    the GPU such a shift is undefined, so the kernels select."""
    def shifts(x, s):
        return x << s, x >> s, x << 3, x >> 2

    info = torch.iinfo(dtype)
    bits = info.bits
    s = torch.arange(-2 if info.min < 0 else 0, bits + 3, dtype=dtype)
    x = torch.randint(info.min, info.max, (3, s.numel()), dtype=dtype)
    _exact(torch.compile(shifts, backend="cleave")(x, s.expand_as(x).contiguous()), shifts(x, s.expand_as(x)))
    _compiled_whole(ctx)


def test_int4_packed_weights_dequantise_inside_the_matmul(ctx):
    """Two int4 values per uint8, unpacked with `&` and `>>`, interleaved, scaled per
    output row: one kernel, the unpacking at the weight tile's load."""
    def matmul_w4(x, packed, scale):
        low = (packed & 0xF).to(torch.int8) - 8
        high = (packed >> 4).to(torch.int8) - 8
        w = torch.stack([low, high], -1).reshape(packed.shape[0], -1).to(x.dtype) * scale[:, None]
        return x @ w.t()

    for dynamic in (False, True):
        f = torch.compile(matmul_w4, backend="cleave", dynamic=dynamic)
        for rows in (5, 11):
            x = torch.randn(rows, 34)
            packed = torch.randint(0, 256, (7, 17), dtype=torch.uint8)
            scale = torch.rand(7)
            want = matmul_w4(x.double(), packed, scale.double())
            got = f(x, packed, scale)
            assert got.dtype == torch.float32
            assert ((got.double() - want).norm() / want.norm()).item() < 1e-5
    _compiled_whole(ctx)
    static = next(op for op in ctx.operators.values() if not op.dynamic)
    for spec in static.specs.values():  # no dequantised weight in memory
        assert len(spec.plans[0].kernels) == 1 and "tl.dot(" in spec.plans[0].kernels[0].source


def test_int8_weights_scaled_after_the_matmul(ctx):
    def matmul_w8(x, w, scale):
        return (x @ w.to(x.dtype).t()) * scale

    x, w, scale = torch.randn(6, 40), torch.randint(-128, 128, (9, 40), dtype=torch.int8), torch.rand(9)
    want = matmul_w8(x.double(), w, scale.double())
    got = torch.compile(matmul_w8, backend="cleave")(x, w, scale)
    assert ((got.double() - want).norm() / want.norm()).item() < 1e-5
    _compiled_whole(ctx)


def test_rules_leave_integer_arithmetic_alone():
    """Rules are proven over the reals: `div-mul-assoc` moved an int32 product into
    float ((x*y)/c -> x*(y/c)), so it no longer wrapped (2.86e9 where eager gives
    43690.7). Integer values enter the search as leaves."""
    import cleave

    def f(x, y, c):
        return (x * y) / c

    x = torch.full((4, 8), 65536, dtype=torch.int32)
    y = torch.full((4, 8), 65537, dtype=torch.int32)
    c = torch.full((4, 1), 1.5)
    g = cleave.compile(f)
    with torch.no_grad():
        assert torch.equal(g(x, y, c), f(x, y, c))
    assert g.stats["unsupported"] == [] and g.stats["failed"] == 0


@pytest.mark.parametrize("fn", [lambda x: x + (-1), lambda x: x * -3, lambda x: x - 300, lambda x: x == 300,
                                lambda x: x > -1])
def test_a_python_int_out_of_a_narrow_type_wraps_into_it(fn):
    # torch wraps the int into uint8 (x + (-1) adds 255, x == 300 is x == 44); the kernel's
    # uint8 -1 failed to build, and the interpreter refused a uint8 300: both ran eagerly
    import warnings

    import cleave

    x = torch.tensor([0, 1, 7, 128, 255, 3, 200], dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = cleave.compile(fn, verbose=False)(x)
    _exact(got, fn(x))


# -- session 33's probe: integer operands of other widths, as torch computes them ---------
def _both_paths(fn, *args, dynamic=False):
    import warnings

    import cleave

    want = fn(*args)
    torch._dynamo.reset()
    for compiled in (cleave.compile(fn, verbose=False), torch.compile(fn, backend="cleave", dynamic=dynamic)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # compiled, no eager fallback
            _exact(compiled(*args), want)


def test_an_integer_to_a_float_power_is_computed_in_floats():
    """i8 ** 2.0 took 2.0 for the int 2 and squared in int8 (124 ** 2.0 gave 16.0)."""
    i8 = torch.tensor([124, -100, 3, 7], dtype=torch.int8)
    u8 = torch.tensor([200, 17, 3, 7], dtype=torch.uint8)
    _both_paths(lambda a, b: (a ** 2.0, torch.pow(a, 3.0), a ** -2.0, b ** 2.0, a ** 0.0, a ** 2), i8, u8)


def test_alpha_scales_in_the_result_type():
    """torch.sub(int32, int8, alpha=3) multiplied the int8 by 3 in int8 (wrapping)."""
    a = torch.tensor([0, 10, -5, 7], dtype=torch.int32)
    b = torch.tensor([100, -128, 127, 50], dtype=torch.int8)
    _both_paths(lambda a, b: (torch.sub(a, b, alpha=3), torch.add(a, b, alpha=100), torch.rsub(b, a, alpha=3)), a, b)


def test_a_zero_dim_integer_wraps_into_the_tensors_type():
    """torch.maximum(int8, tensor(300)) is int8 with 300 read as 44; it was computed in int64."""
    i = torch.tensor([-128, -100, 7, 44, 100, 127], dtype=torch.int8)
    s = torch.tensor(300)
    _both_paths(lambda i, s: (torch.maximum(i, s), torch.minimum(i, s), i // s, i % s, i == s, i < s), i, s)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16])
def test_a_dynamic_int_argument_wraps_into_the_tensors_type(dtype):
    """A SymInt beside an int8 was used at int32 width (i // 300 was i // 300, not i // 44);
    beside a uint8 the kernel failed to build (mixed signedness) and ran eagerly."""
    import warnings

    def f(i, s):
        return i // s, i % s, i == s, i < s, i * s

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="cleave", dynamic=True)
    i = torch.tensor([0, 100, 44, 7, 127, 3], dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s in (3, 300, 70000, 7):
            _exact(compiled(i, s), f(i, s))


def test_a_returned_cast_of_an_input_is_no_view():
    """x.to(torch.int8) returned was taken for a view of x (aten.to's schema may alias),
    and cleave.compile sent the function through dynamo."""
    import cleave

    def f(x):
        return x.to(torch.int8), x.half(), x * 2

    compiled = cleave.compile(f, verbose=False)
    x = torch.randn(3, 5) * 50
    _exact(compiled(x), f(x))
    assert compiled.capture_error is None


def test_a_python_int_beside_a_bool_tensor_is_an_int64():
    """It was lifted as a bool (2 is True): m == 2 held where m, m | 2 gave 1, m % 2 gave 0,
    and `%` / fmod failed to build the kernel (int1 with int64) and ran eagerly."""
    m = torch.tensor([True, False, True, True, False])
    _both_paths(lambda m: (m == 2, m < 2, m > -1, m | 2, m ^ 5, 6 | m, m % 2, torch.fmod(m, 3), m + 3, m // 2,
                           torch.div(m, 2, rounding_mode="trunc")), m)


def test_a_dynamic_int_argument_beside_a_bool_tensor_is_an_int64():
    import warnings

    def f(m, s):
        return m + s, m * s, m == s, m < s

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="cleave", dynamic=True)
    m = torch.tensor([True, False, True, True])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s in (3, 5, 3):
            _exact(compiled(m, s), f(m, s))


def test_alpha_with_a_number_operand():
    """torch.add(x, 3, alpha=2) raised an AttributeError from the translator (no fallback)."""
    x = torch.tensor([1, 2, 3], dtype=torch.int32)
    _both_paths(lambda x: (torch.add(x, 3, alpha=2), torch.sub(x, 2, alpha=3)), x)


def test_where_takes_both_branches_in_the_result_type():
    """torch.where(m, m, 2) is int64; its 2 was lifted beside the bool branch as True, and
    torch.where(m, x_f16, x_f32)'s branches were not brought to f32."""
    m = torch.tensor([True, False, True, False, True])
    i8 = torch.tensor([-3, 100, 7, -128, 5], dtype=torch.int8)
    h = torch.tensor([0.1, 3.0, -2.5, 7.0, 1e3], dtype=torch.float16)
    f = torch.tensor([1.5, -2.0, 9.0, 0.25, 1e5])
    _both_paths(lambda m, i8, h, f: (torch.where(m, m, 2), torch.where(m, 2, m), torch.where(m, i8, True),
                                     torch.where(m, i8, 2.5), torch.where(m, h, f), torch.where(~m, m, i8)),
                m, i8, h, f)


def test_narrow_integer_reductions_wrap_in_their_own_type(ctx):
    """Triton reduces integers narrower than 32 bits in int32: an int8 row max, an int8
    sum or cumsum asked for in int8, then arithmetic on it, must wrap as int8 as eager's
    does (x - x.amax() gave -255 where eager gives 1), in one tile and in a loop over a
    dynamic row (n = 37, then 9)."""
    def ops(a, b, c):
        return ((a - a.amax(1, keepdim=True)).float(), (a - a.amax(1, keepdim=True)) > 0,
                (b.amax(1) << 1) >> 1, (c * c.amax(1, keepdim=True)) < 0,
                a.sum(1, dtype=torch.int8).float(), a.cumsum(1, dtype=torch.int8).float(), (a - a.max()).float())

    f = torch.compile(ops, backend="cleave", dynamic=True)
    for n in (37, 9):
        a = torch.randint(-128, 128, (3, n), dtype=torch.int8)
        a[:, 0], a[:, -1] = 127, -128
        b = torch.randint(0, 256, (3, n), dtype=torch.uint8)
        b[:, 1] = 200
        c = torch.randint(-300, 300, (3, n), dtype=torch.int16)
        c[:, 2] = 300
        _exact(f(a, b, c), ops(a, b, c))
    _compiled_whole(ctx)
