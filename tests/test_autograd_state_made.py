"""Tensors a function makes require grad keep their autograd state under cleave.compile.

The inputs of these functions do not require grad, so cleave captured them; the exported
graph has no trace of `x.requires_grad_()` or of a factory's `requires_grad=True`, and the
results came back without `requires_grad` (and the input's flag unset): `backward()`
then failed. Such a function now runs through torch.compile's graphs (eager's autograd
state, cleave's kernels where there is none)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave


def marks_its_input(x):
    x.requires_grad_()
    return (x * 2).sum()


def marks_an_intermediate(x):
    y = x * 2
    y.requires_grad_()
    return y


def makes_a_leaf(x):
    return torch.ones(3, requires_grad=True) * x


@pytest.mark.parametrize("fn", [marks_its_input, marks_an_intermediate, makes_a_leaf])
def test_autograd_state_made_inside_is_kept(fn):
    compiled = cleave.compile(fn)
    for _ in range(2):
        x, x_eager = torch.randn(3), None
        x_eager = x.clone()
        out, expected = compiled(x), fn(x_eager)
        torch.testing.assert_close(out.detach(), expected.detach())
        assert out.requires_grad == expected.requires_grad is True
        assert x.requires_grad == x_eager.requires_grad
        out.sum().backward()
        if fn is marks_its_input:
            expected.sum().backward()
            torch.testing.assert_close(x.grad, x_eager.grad)


def test_under_no_grad_the_same_function_compiles():
    compiled = cleave.compile(makes_a_leaf)
    with torch.no_grad():
        x = torch.randn(3)
        out = compiled(x)
        assert not out.requires_grad
        torch.testing.assert_close(out, makes_a_leaf(x))
    assert compiled.capture_error is None and compiled.stats["graph_breaks"] == 0


def test_parameters_requiring_grad_still_run_eagerly_with_their_warning():
    model = torch.nn.Linear(5, 3)
    compiled = cleave.compile(model)
    x = torch.randn(7, 5)
    with pytest.warns(UserWarning, match="inputs require grad"):
        out = compiled(x)
    assert out.requires_grad
    torch.testing.assert_close(out, model(x))


def test_parameters_read_through_a_bound_method_are_named_as_the_cause():
    """A module's forward compiled as a bound method reads its parameters as constants of
    the capture: the reason a capture is refused names them, not a factory call the code
    does not make; the gradients are dynamo's, and right."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    compiled = cleave.compile(model.forward)
    x = torch.randn(4, 5)
    for _ in range(2):
        out = compiled(x)
    assert "parameters that require grad" in compiled.capture_error
    torch.testing.assert_close(out, model(x))
    (grad,) = torch.autograd.grad(out.sum(), model[0].weight)
    (expected,) = torch.autograd.grad(model(x).sum(), model[0].weight)
    torch.testing.assert_close(grad, expected)
