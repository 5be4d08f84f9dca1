"""Under autograd, a function `cleave.compile` sends through dynamo's graphs runs eagerly,
as a captured one does (README, "Modules"): a Dropout, a graph break, an int argument or
a `torch.autograd.grad` inside take that path. It was compiled through AOTAutograd,
whose backward refuses a second backward over one forward (`retain_graph=True`, two
losses: "compiled with non-empty donated buffers") and double backward (a gradient
penalty), both of which eager takes. And a function called under autograd at a third
shape no longer says it "is searched again for each shape": such calls search nothing."""
import copy
import os
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn as nn

import cleave


def _grads(model):
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)

    def forward(self, x, k: int):
        return torch.tanh(self.lin(x)) * k


def _two_losses(model, rows, *extra):
    torch.manual_seed(1)
    out = model(torch.randn(rows, 5), *extra)
    out.pow(2).mean().backward(retain_graph=True)
    out.abs().mean().backward()


def test_two_backwards_over_one_forward_match_eager():
    torch.manual_seed(0)
    for net, extra in ((nn.Sequential(nn.Linear(5, 7), nn.Dropout(0.2), nn.Tanh(), nn.Linear(7, 3)), ()),
                       (Scaled(), (2,))):
        compiled_net = copy.deepcopy(net)
        compiled = cleave.compile(compiled_net)
        for rows in (3, 5, 3):  # the second size compiles anew (dynamo's automatic dynamic)
            net.zero_grad(), compiled_net.zero_grad()
            _two_losses(net, rows, *extra)
            _two_losses(compiled, rows, *extra)
            for want, got in zip(_grads(net), _grads(compiled_net)):
                torch.testing.assert_close(got, want)


def gradient_penalty(x, w):
    y = torch.sigmoid(x @ w).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    return y + g.pow(2).sum()


def test_double_backward_matches_eager():
    compiled = cleave.compile(gradient_penalty)
    for rows in (3, 5, 3):
        x, w = torch.randn(rows, 5, requires_grad=True), torch.randn(5, 7, requires_grad=True)
        xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        compiled(x, w).backward()
        gradient_penalty(xe, we).backward()
        torch.testing.assert_close(w.grad, we.grad)
        torch.testing.assert_close(x.grad, xe.grad)


def test_a_critic_with_dropout_takes_a_gradient_penalty():
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(5, 7), nn.Dropout(0.2), nn.Tanh(), nn.Linear(7, 1))
    compiled_critic = copy.deepcopy(critic)
    compiled = cleave.compile(compiled_critic)
    for model, net in ((critic, critic), (compiled, compiled_critic)):
        torch.manual_seed(1)
        x = torch.randn(3, 5, requires_grad=True)
        (g,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
        ((g.norm(dim=1) - 1) ** 2).mean().backward()
    for want, got in zip(_grads(critic), _grads(compiled_critic)):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want)


def test_calls_under_autograd_get_no_hint_to_declare_an_axis_dynamic():
    compiled = cleave.compile(nn.Sequential(nn.Linear(5, 13), nn.GELU(), nn.Linear(13, 3)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 5, 7):
            compiled(torch.randn(n, 5)).sum().backward()
    assert not [w for w in caught if "searched again" in str(w.message)], [str(w.message) for w in caught]
    assert compiled.stats["searches"] == 0
