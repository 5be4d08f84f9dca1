"""How far a compiled output is from eager fp32: for a floating output the max absolute
difference and the KL divergence of the softmax over the last dim (for logits, the
next-token distribution); an integer or bool output is compared exactly."""
from __future__ import annotations

import copy
import math

import torch
from torch.utils import _pytree as pytree


def compare(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    """max |got - want| and mean over rows of KL(softmax(want) || softmax(got)), in fp64.

    Non-finite entries: one that is NaN in both, or the same infinity in both, matches
    (difference 0) and drops out of its row's softmax on both sides; one that is
    non-finite in only one of them, or a different infinity, makes max_abs inf and its
    row's KL inf, so a NaN or overflow that eager does not have always shows."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if got.numel() == 0:
        return {"max_abs": 0.0, "kl": 0.0}
    nonfinite = ~(got.isfinite() & want.isfinite())
    same = nonfinite & ((got == want) | (got.isnan() & want.isnan()))
    differ = nonfinite & ~same
    max_abs = (got - want).abs().masked_fill(same, 0.0).masked_fill(differ, math.inf).max().item()
    if want.dim() == 0:
        return {"max_abs": max_abs, "kl": 0.0}
    # matching entries as -inf on both sides: probability 0, so a term of neither softmax
    log_p, log_q = want.masked_fill(same, -math.inf).log_softmax(-1), got.masked_fill(same, -math.inf).log_softmax(-1)
    p = log_p.exp()
    # 0 * log(0 / 0) is 0 (a masked logit; a row of matching entries only has no terms)
    terms = torch.where(p > 0, p * (log_p - log_q), 0.0)
    kl = terms.sum(-1).masked_fill(differ.any(-1), math.inf).mean().item()
    return {"max_abs": max_abs, "kl": kl}


def compare_exact(got: torch.Tensor, want: torch.Tensor) -> dict[str, int]:
    """How many elements of an integer or bool output differ from eager's."""
    got, want = got.detach().cpu(), want.detach().cpu()
    if got.shape != want.shape:
        return {"mismatches": max(got.numel(), want.numel()), "numel": want.numel()}
    return {"mismatches": int((got != want).sum()), "numel": want.numel()}


def check(got: torch.Tensor, want: torch.Tensor) -> dict:
    """compare for a floating output, compare_exact for any other."""
    return compare(got, want) if want.is_floating_point() else compare_exact(got, want)


def eager_fp32(fn, args, kwargs=None, fp32: bool = True):
    """fn's eager result with its floating tensors (arguments, a module's parameters and
    buffers) in fp32, or as given with `fp32=False`; a module is copied, not cast in
    place, and the arguments are copies (fn may write to them)."""
    if isinstance(fn, torch.nn.Module) and fp32:
        fn = copy.deepcopy(fn).float()

    def up(a):
        if not isinstance(a, torch.Tensor):
            return a
        return a.detach().to(torch.float32 if fp32 and a.is_floating_point() else a.dtype, copy=True)

    with torch.no_grad():
        return fn(*map(up, args), **{k: up(v) for k, v in (kwargs or {}).items()})


def outputs(result) -> list[tuple[int, torch.Tensor]]:
    """The tensors of a result (a tensor, or any nesting of tuples, lists and dicts),
    each with its position among the result's values in pytree order, as it returns them."""
    return [(k, t) for k, t in enumerate(pytree.tree_leaves(result)) if isinstance(t, torch.Tensor)]
