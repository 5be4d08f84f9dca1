"""Calls in contexts cleave's kernels cannot serve run eagerly, with a warning, and
leave the compiled function as it was: torch.func transforms (vmap, jvp), whose
wrapped tensors have no storage (a warmed shape crashed reading one), and forward-mode
AD tangents (dropped without a word). A global module hook fires once, as eagerly."""
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import cleave


def layer(x, w):
    return torch.tanh(x @ w) * 3


W = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("compiled", ["cleave", "backend"])
def test_a_forward_ad_tangent_is_kept(compiled):
    f = cleave.compile(layer, verbose=False) if compiled == "cleave" else torch.compile(layer, backend="cleave")
    x, t = _x(6, 8), _x(6, 8, seed=2)
    f(x, W)  # warm: the hot path must see the tangent too
    with fwAD.dual_level():
        with pytest.warns(UserWarning, match="forward-mode AD tangent"):
            got = fwAD.unpack_dual(f(fwAD.make_dual(x, t), W))
        want = fwAD.unpack_dual(layer(fwAD.make_dual(x, t), W))
        torch.testing.assert_close(got.tangent, want.tangent)
        torch.testing.assert_close(got.primal, want.primal)


def test_vmap_and_jvp_over_a_warmed_shape_run_eagerly():
    f = cleave.compile(layer, verbose=False)
    f(_x(6, 8), W)
    xs = _x(3, 6, 8)
    with pytest.warns(UserWarning, match="torch.func transform"):
        got = torch.vmap(lambda a: f(a, W))(xs)
    torch.testing.assert_close(got, torch.vmap(lambda a: layer(a, W))(xs))
    x, t = _x(6, 8), _x(6, 8, seed=2)
    torch.testing.assert_close(torch.func.jvp(lambda a: f(a, W), (x,), (t,)),
                               torch.func.jvp(lambda a: layer(a, W), (x,), (t,)))


def test_a_first_call_under_vmap_leaves_the_function_compiled():
    f = cleave.compile(layer, verbose=False)
    xs = _x(3, 6, 8)
    with pytest.warns(UserWarning, match="torch.func transform"):
        torch.testing.assert_close(torch.vmap(lambda a: f(a, W))(xs), torch.vmap(lambda a: layer(a, W))(xs))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # compiled whole: no warning
        torch.testing.assert_close(f(xs[0], W), layer(xs[0], W))
    assert f.capture_error is None and f.stats["operators"] == 1, f.stats


def test_a_global_forward_hook_fires_once():
    m = torch.nn.Linear(8, 4)
    calls = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, i, o: (calls.append(mod), o + 100)[1])
    try:
        with torch.no_grad():
            want = m(_x(6, 8))
            calls.clear()
            got = cleave.compile(m, verbose=False)(_x(6, 8))
        assert len(calls) == 1, calls
        torch.testing.assert_close(got, want)
    finally:
        handle.remove()
