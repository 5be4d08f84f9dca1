"""Elementwise math PyTorch's decompositions leave as prims (atan2, hypot, signbit,
erf_inv) and copysign compile, with IEEE special values as torch gives them: signed
zeros and NaN signs (copysign and signbit read the sign bit), infinities, NaN, hypot
near overflow. Checked against fp64, bit for bit where torch's result is exact."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import torch

import cleave
from kernel_check import check_outputs

SPECIAL = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 1e-30, -3e38, 3e38, 0.5]


def _pairs(n=11):
    """Every pair of special values, and n * n random ones of mixed scale."""
    gen = torch.Generator().manual_seed(torch.seed() % 10_000)
    s = torch.tensor(SPECIAL)
    a, b = torch.meshgrid(s, s, indexing="ij")
    r = torch.randn(2, n, n, generator=gen) * torch.logspace(-3, 3, n)
    return torch.cat([a.flatten(), r[0].flatten()]), torch.cat([b.flatten(), r[1].flatten()])


def _compiled(fn, *args):
    f = cleave.compile(fn, verbose=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # a graph break (eager fallback) warns
        got = f(*args)
    assert f.stats["failed"] == 0 and f.stats["graph_breaks"] == 0, f.stats
    return got


def _check(fn, *args):
    got = _compiled(fn, *args)
    # in fp64 (integers too: torch computes their atan2 in a float), rounded to the
    # output's f32: hypot(3e38, 3e38) overflows there
    ref = fn(*(a.double() for a in args)).to(got.dtype).double()
    check_outputs([got], [ref], fn.__name__)
    return got, ref


def atan2(y, x):
    return torch.atan2(y, x)


def hypot(a, b):
    return torch.hypot(a, b)


def copysign(a, b):
    return torch.copysign(a, b)


def signbit(a, b):
    return torch.signbit(b) | torch.signbit(a * 0.0 + a)


def erfinv(a):
    return torch.erfinv(a)


def test_atan2_takes_each_quadrant_zero_sign_and_infinity():
    y, x = _pairs()
    got, ref = _check(atan2, y, x)
    zeros = (y == 0) & (x == 0)
    assert torch.equal(got[zeros], ref[zeros].float())  # +-0 and +-pi by the operands' signs
    assert torch.equal(torch.signbit(got[zeros]), torch.signbit(ref[zeros]))


def test_atan2_of_integers_and_bf16():
    gen = torch.Generator().manual_seed(3)
    y, x = torch.randint(-9, 9, (7, 5), generator=gen), torch.randint(-9, 9, (7, 5), generator=gen)
    _check(atan2, y, x)  # torch computes integers' atan2 in the default float
    yb, xb = torch.randn(33, generator=gen).bfloat16(), torch.randn(33, generator=gen).bfloat16()
    got = _compiled(atan2, yb, xb)
    check_outputs([got], [atan2(yb.double(), xb.double())], "atan2 in bf16")


def test_hypot_neither_overflows_early_nor_loses_an_infinity_beside_nan():
    a, b = _pairs()
    got, ref = _check(hypot, a, b)
    assert torch.isinf(got[torch.isinf(a) | torch.isinf(b)]).all()  # hypot(inf, nan) is inf


def test_copysign_and_signbit_read_the_sign_bit():
    a, b = _pairs()
    got, ref = _check(copysign, a, b)
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got[~got.isnan()], ref[~ref.isnan()].float())
    assert torch.equal(torch.signbit(got), torch.signbit(ref.float()))  # -0.0 and negative NaN
    got = _compiled(signbit, a, b)
    assert torch.equal(got, signbit(a, b))


def test_erfinv_up_to_its_poles():
    gen = torch.Generator().manual_seed(5)
    x = torch.cat([torch.rand(200, generator=gen) * 2 - 1, torch.tensor([0.0, -0.0, 1.0, -1.0, 1 - 2**-24, -0.999,
                                                                          1e-30, 1.5, float("nan")])])
    _check(erfinv, x)


def erfc(a):
    return torch.special.erfc(a)


def test_erfc_keeps_its_relative_precision_in_the_tail():
    """1 - erf(x) is 0 in f32 past x = 4, where erfc is 1.5e-8; it was a graph break."""
    gen = torch.Generator().manual_seed(9)
    x = torch.cat([torch.randn(300, generator=gen) * 4, torch.linspace(-10, 10.5, 83),
                   torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-30, 26.0,
                                 1e35, -1e35, 3e38, -3e38])])  # |x| * 16 overflows: NaN before
    got, ref = _check(erfc, x)
    tail = (x > 3) & (x < 9)
    assert ((got[tail] - ref[tail]).abs() <= 2e-6 * ref[tail].abs()).all()


def power(a, b):
    return torch.pow(a, b)


def test_pow_takes_c_special_values():
    """pow(-inf, 1.5) was NaN (inf), pow(-inf, -0.5) NaN (0), pow(1, nan) and
    pow(-1, inf) NaN (1), pow(-0., -1) inf (-inf): the kernels' pow now follows C's,
    as torch's does, for every pair of special values and the exponents that pick
    a branch (odd, even, fractional, infinite)."""
    a = torch.tensor(SPECIAL + [-2.0, -0.5, 2.0])
    b = torch.tensor(SPECIAL + [-1.0, 2.0, 3.0, -3.0, 1.5, -0.5])
    x, y = torch.meshgrid(a, b, indexing="ij")
    got = _compiled(power, x.flatten(), y.flatten())
    want = torch.pow(x.flatten().double(), y.flatten().double()).float()
    exact = want.isinf() | want.isnan() | (want == 0) | (want.abs() == 1)
    assert torch.equal(got[exact].isnan(), want[exact].isnan())
    same = exact & ~want.isnan()
    assert torch.equal(got[same], want[same]) and torch.equal(got[same].signbit(), want[same].signbit())
    check_outputs([got[~exact].double()], [want[~exact].double()], "pow")
