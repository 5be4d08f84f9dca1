"""How far a compiled output is from eager fp32: max absolute difference, and the KL
divergence of the softmax over the last dim (for logits, the next-token distribution)."""
from __future__ import annotations

import copy

import torch


def compare(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    """max |got - want| and mean over rows of KL(softmax(want) || softmax(got)), in fp64."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if got.numel() == 0:
        return {"max_abs": 0.0, "kl": 0.0}
    max_abs = (got - want).abs().max().item()
    if want.dim() == 0:
        return {"max_abs": max_abs, "kl": 0.0}
    log_p, log_q = want.log_softmax(-1), got.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean().item()
    return {"max_abs": max_abs, "kl": kl}


def eager_fp32(fn, args, kwargs=None):
    """fn's eager result with its floating tensors (arguments, a module's parameters and
    buffers) in fp32; a module is copied, not cast in place."""
    if isinstance(fn, torch.nn.Module):
        fn = copy.deepcopy(fn).float()

    def up(a):  # a copy: fn may write to its arguments
        return a.detach().to(torch.float32, copy=True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a

    with torch.no_grad():
        return fn(*map(up, args), **{k: up(v) for k, v in (kwargs or {}).items()})


def outputs(result) -> list[torch.Tensor]:
    """The floating tensors of a result (a tensor, or a tuple, list or dict of them)."""
    if isinstance(result, torch.Tensor):
        return [result] if result.is_floating_point() else []
    if isinstance(result, dict):
        result = list(result.values())
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in outputs(r)]
    return []
