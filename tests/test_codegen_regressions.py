"""Regressions of generated Triton code that the differential fuzz (tests/test_fuzz.py)
found: kernels that failed on their first launch (so the program ran eagerly) and a
grid of thousands of programs for tensors of 50 elements. Each runs under
TRITON_INTERPRET=1 at small odd shapes and compares with eager PyTorch (or the fp64
interpreter)."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

import cleave
from cleave.ir import Graph
from cleave.scheduler import schedule
from cleave.scheduler.exprs import evaluate
from kernel_check import run_and_check


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _check(f, prog, *args):
    got, want = f(*args), prog(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert f.stats["failed"] == 0


# -- a mask that does not vary over the tile ------------------------------------
# torch.cat's operand loads are masked by the program's grid index alone (`tid0 < n`);
# Triton's CPU interpreter rejected such a scalar mask on a tile of pointers.
def cat_rows(x, y):
    return torch.cat([x, y], dim=0)


def cat_cols(x, y):
    return torch.cat([x, y, x], dim=-1)


@pytest.mark.parametrize("prog, dynamic, shapes", [
    (cat_rows, {"x": {0: "n"}, "y": {0: "n"}}, [[(3, 3), (3, 3)], [(7, 3), (7, 3)]]),
    (cat_rows, None, [[(3, 5), (7, 5)]]),
    (cat_cols, {"x": {0: "n"}, "y": {0: "n"}}, [[(3, 5), (3, 7)], [(9, 5), (9, 7)]]),
])
def test_cat_runs_compiled(prog, dynamic, shapes):
    f = cleave.compile(prog, dynamic=dynamic) if dynamic else cleave.compile(prog)
    for i, call in enumerate(shapes):
        _check(f, prog, *(torch.randn(*s, generator=_gen(i)) for s in call))


# -- a MatMul whose operands do not vary over its contraction ----------------------
def unit_matmul(x):  # M = N = K = 1: no operand has a tiled dim
    v = x.sum(0).reshape(1, 1)
    return v @ v


def broadcast_k_matmul(x, y):  # operands broadcast along K = 5: each product counts 5 times
    return x.sum(1, keepdim=True).expand(-1, 5) @ y.sum(0, keepdim=True).expand(5, -1)


def test_unit_matmul_runs_compiled():
    f = cleave.compile(unit_matmul, dynamic={"x": {0: "n"}})
    for n in (3, 8):
        _check(f, unit_matmul, torch.randn(n, generator=_gen(n)))


def test_matmul_constant_along_k_runs_compiled():
    f = cleave.compile(broadcast_k_matmul, dynamic={"x": {0: "n"}})
    for n in (3, 9):
        _check(f, broadcast_k_matmul, torch.randn(n, 4, generator=_gen(n)), torch.randn(6, 7, generator=_gen(0)))


# -- a unit-K MatMul whose operand the kernel also stores --------------------------
# |x| of (M, 1) returned beside |x| @ w: the stored |x| is read at k = 0, so the dot's
# operand did not vary over K, and the contraction became a broadcast product whose
# [M, N, K] tile (K padded to 16) held 16x the output in registers: "no tiling ... fits"
# from M = 33 with N = 300, and eager. Such an operand is broadcast along K into tl.dot.
def unit_k_beside_operand(x, w):
    a = x.abs()
    return a @ w, a


def unit_k_beside_weight(x, w):
    b = w * 2
    return x @ b, b


@pytest.mark.parametrize("prog", [unit_k_beside_operand, unit_k_beside_weight])
def test_a_unit_k_matmul_beside_its_stored_operand_compiles(prog):
    f = cleave.compile(prog)
    for m, n in ((33, 300), (257, 301)):
        x, w = torch.randn(m, 1, generator=_gen(m)), torch.randn(1, n, generator=_gen(n))
        got, want = f(x, w), prog(x, w)
        assert all(torch.equal(g, e) for g, e in zip(got, want))  # one product a term: exact
    assert f.stats["failed"] == 0


# -- a value constant along one of its stored axes -------------------------------
# x @ ones(k, n) varies over its rows only. With n equal to the row count, the tiler
# aliased the column label to the row label (both one full tile, never together in a
# value) and the store wrote element [i, i] for [i, j]: a wrong answer, not an error.
def matmul_by_ones(x):
    return x.reshape(x.shape[0], -1) @ torch.full((x[0].numel(), x.shape[0]), 2.0)


@pytest.mark.parametrize("rows", [2, 4, 3])
def test_axes_a_value_does_not_vary_over_keep_their_own_index(rows):
    f = cleave.compile(matmul_by_ones)
    _check(f, matmul_by_ones, torch.randn(rows, 3, 4, 5, generator=_gen(rows)))


# -- pow with a scalar exponent ---------------------------------------------------
def powers(x, y):
    return (torch.pow(x, 3), torch.pow(x, 3.0), x ** 2, x ** 0.5, x ** -1, x ** -2, torch.pow(x, y),
            torch.pow(x, 0))


def test_pow_scalar_exponents_follow_torch():
    """A negative base keeps its sign under an odd integer exponent (given as 3 or
    3.0) and gives NaN under a fractional one, with a scalar or a tensor exponent."""
    f = cleave.compile(powers, dynamic={"x": {0: "n"}, "y": {0: "n"}})
    x = torch.tensor([-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0])
    y = torch.tensor([3.0, 2.0, 0.5, -1.0, 0.0, 2.5, -2.0, 1.0, -3.0])
    _check(f, powers, x, y)
    _check(f, powers, x[:5], y[:5])
    torch.testing.assert_close(f(torch.linspace(-2, 2, 5), y[:5])[0], torch.tensor([-8.0, -1.0, 0.0, 1.0, 8.0]))


def tanh_gelu_cubed(x):
    return F.gelu(x, approximate="tanh") + x ** -2


def test_integer_powers_are_products_as_torch_computes_them():
    """x**3 (GPT-2's tanh GELU) and x**-2 are x*x*x and 1/(x*x), as PyTorch computes
    them, not exp(3 log|x|) with its sign selects: the GELU epilogue of a GEMM."""
    f = cleave.compile(tanh_gelu_cubed, dynamic={"x": {0: "n"}})
    x = torch.tensor([-2.0, -1.5, -1.0, -0.5, 0.25, 0.5, 1.0, 2.0, 3.0])
    _check(f, tanh_gelu_cubed, x)
    (op,) = f.operators
    sources = [k.source for spec in op.specs.values() for k in spec.plans[0].kernels]
    assert sources and not any("tl.log(" in s for s in sources), sources


# -- outputs over unrelated dims ----------------------------------------------------
def test_outputs_over_unrelated_dims_get_their_own_grids():
    """A (10n,), a (5n,) and an (n, 5) output in one kernel had a grid of 50 n^3
    programs (each storing every output); outputs over a shared dim still share one."""
    g = Graph("unrelated_outputs")
    x, y = g.input("x", ("n", 5)), g.input("y", (1,))
    flat = x.sigmoid().transpose(0, 1).reshape(x.shape[0] * 5)
    e = x.exp()
    g.output(g.add("concat", flat, flat, axis=0), flat + y, e / e.sum(1, keepdim=True), e.sum(1),
             names=["cat", "shifted", "softmax", "rowsum"])
    env = {"n": 5}
    plan = schedule(g, env, dynamic={"n"}, top_k=1)[0]
    assert len(plan.kernels) == 3  # the softmax rows and their row sums share one
    assert sum(evaluate(k.grid[0], env) for k in plan.kernels) <= 50 + 25 + 25  # no more than elements
    for n in (5, 2):
        run_and_check(g, plan, {"n": n}, seed=n)


def test_outputs_over_overlapping_dims_get_their_own_grids_and_tile_their_inner_dim():
    """x.repeat_interleave(3, 0), x.repeat_interleave(2, 1) + 1 and x.repeat(2, 3) share
    only the row dim: in one kernel the grid was the product of all their dims, each
    program storing one element (13,230 programs for 1,155 elements; minutes in the
    interpreter). The (n, 3, m) and (2, n, 3, m) outputs still share one kernel, tiled
    along m, not along the 2 that x.repeat(2, 3) adds in front."""
    from cleave.ir import parse_graph

    g = parse_graph('''graph repeats {
  %0 = input(name="x", shape=[n,m], dtype=f32) : f32[n,m]
  %1 = reshape(%0, shape=[n,1,m]) : f32[n,1,m]
  %2 = broadcast(%1, shape=[n,3,m]) : f32[n,3,m]
  %3 = reshape(%2, shape=[3*n,m]) : f32[3*n,m]
  %4 = reshape(%0, shape=[n,m,1]) : f32[n,m,1]
  %5 = broadcast(%4, shape=[n,m,2]) : f32[n,m,2]
  %6 = reshape(%5, shape=[n,2*m]) : f32[n,2*m]
  %7 = const(value=1.0, dtype=f32) : f32[]
  %8 = add(%6, %7) : f32[n,2*m]
  %9 = reshape(%0, shape=[1,n,1,m]) : f32[1,n,1,m]
  %10 = broadcast(%9, shape=[2,n,3,m]) : f32[2,n,3,m]
  %11 = reshape(%10, shape=[2*n,3*m]) : f32[2*n,3*m]
  return rows=%3, cols=%8, tiled=%11
}''')
    env = {"n": 9, "m": 100}
    plan = schedule(g, env, dynamic={"n", "m"}, top_k=1)[0]
    assert len(plan.kernels) == 2
    elements = 3 * 9 * 100 + 9 * 200 + 18 * 300
    assert sum(evaluate(k.grid[0], env) for k in plan.kernels) <= elements // 16
    for n, m in ((5, 7), (3, 33)):
        run_and_check(g, plan, {"n": n, "m": m}, seed=n)


# -- a plan that reads no tensor ----------------------------------------------------
def test_a_plan_reading_no_tensor_runs_into_given_outputs_or_says_why_not():
    from cleave.ir import BindingError, parse_graph
    from cleave.runtime.launch import launch

    g = parse_graph('''graph ramp {
  %0 = iota(shape=[7], axis=0, dtype=f32) : f32[7]
  %1 = const(value=2.0, dtype=f32) : f32[]
  %2 = mul(%0, %1) : f32[7]
  return out=%2
}''')
    (plan,) = schedule(g, {}, top_k=1)
    with pytest.raises(BindingError, match="none names the device"):
        launch(plan, {})
    (got,) = launch(plan, {}, out=[torch.full((7,), float("nan"))])
    assert torch.equal(got, torch.arange(7.0) * 2)


# -- Triton's limit on a tensor's elements -----------------------------------------
def test_tilings_past_tritons_tensor_size_limit_are_no_option(monkeypatch):
    """Triton refuses a tensor of more than 2**20 elements when it compiles for the GPU
    (its CPU interpreter does not check): the ragged prefill's split plans multiplied a
    [64, 16, 4, 128] product in registers and failed there. Such tilings are skipped,
    and where none is left the error says why."""
    import cleave.scheduler.codegen as codegen
    from cleave.ir import BindingError, parse_graph

    g = parse_graph('''graph mm {
  %0 = input(name="x", shape=[s,k], dtype=f32) : f32[s,k]
  %1 = input(name="w", shape=[k,n], dtype=f32) : f32[k,n]
  %2 = matmul(%0, %1) : f32[s,n]
  return out=%2
}''')
    env = {"s": 100, "k": 40, "n": 90}
    monkeypatch.setattr(codegen, "MAX_TENSOR_NUMEL", 64 * 128)
    for plan in schedule(g, env, top_k=4):
        (k,) = plan.kernels
        assert max(plan.tiles[f"{k.name}.X{i}"] * plan.tiles[f"{k.name}.X{j}"] for i, j in ((0, 1), (0, 2), (1, 2))) \
            <= 64 * 128
        run_and_check(g, plan, env, seed=0)
    monkeypatch.setattr(codegen, "MAX_TENSOR_NUMEL", 8)
    with pytest.raises(BindingError, match="exceeds Triton's 8 per tensor"):
        schedule(g, env, top_k=1)
