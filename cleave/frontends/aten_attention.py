"""scaled_dot_product_attention, decomposed into the workloads' safe-softmax attention."""
from __future__ import annotations

import operator

import sympy

from ..ir import dims as D
from .aten_layout import matmul, repeat_interleave, reshape, swap
from .aten_map import rule
from .errors import CaptureError
from .aten_reduce import safe_softmax

NEG_INF = float("-inf")


def _check(a, n):
    if a.get("dropout_p", 0.0) != 0.0:
        return "dropout_p must be 0"
    if a.get("is_causal") and _mask(a) is not None:
        return "attn_mask together with is_causal is not supported"
    if n is not None and isinstance(n.meta.get("val"), (tuple, list)) and _uses_more_than_the_output(n):
        return "its logsumexp (or another output besides the attention) is used, as autograd does"
    q, k = a["query"], a["key"]
    if q.dim() >= 3 and isinstance(q.shape[-3], int) and not isinstance(k.shape[-3], int):
        # groups of a constant q count over a dynamic kv count: no constant group size
        return (f"grouped-query attention over a dynamic key/value head count ({k.shape[-3]}) and a static "
                f"query head count ({q.shape[-3]}) is not supported")
    return None


def _mask(a):
    """The additive or boolean mask, by the name each attention op gives it."""
    return a.get("attn_mask", a.get("attn_bias"))


def _uses_more_than_the_output(node) -> bool:
    return any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users)


def _fused(t, node, a):
    """A fused kernel SDPA dispatches to (its outputs: the attention, then logsumexp and
    the like, which only autograd reads): the attention first, the rest unavailable."""
    rest = len(node.meta["val"]) - 1
    return (_sdpa(t, node, a),) + (None,) * rest


# SDPA, and the kernels it dispatches to once AOTAutograd has traced through it
rule("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
     "_scaled_dot_product_attention_math", check=_check)(_fused)


def _heads_like(t, x, heads):
    """k or v with q's count of heads: each kv head repeated for its group of q heads, or
    the same heads where the counts are equal by the graph's constraints (kv heads
    repeated by a symbolic q_heads // kv_heads before SDPA: kv_heads * floor(h/kv_heads))."""
    axis = x.rank - 3
    ratio = sympy.simplify(heads / x.shape[axis])
    if ratio.is_Integer:
        return repeat_interleave(t, x, int(ratio), axis)
    if D.equal(D.exact_quotients(heads), D.exact_quotients(x.shape[axis])):
        return reshape(t, x, x.shape[:axis] + (heads,) + x.shape[axis + 1:])
    if not heads.is_number:  # enable_gqa under dynamic shapes: hq a symbol, hkv a symbol or a number (MQA's 1)
        # a group of floor(hq / hkv) heads; the reshape's constraint (hkv * floor(hq / hkv) = hq)
        # leaves a call whose kv heads do not divide its q heads to eager, which raises
        grouped = repeat_interleave(t, x, sympy.floor(heads / x.shape[axis]), axis)
        return reshape(t, grouped, x.shape[:axis] + (heads,) + x.shape[axis + 1:])
    raise CaptureError(f"{t.op}: {D.fmt(heads)} query heads over {D.fmt(x.shape[axis])} key/value heads "
                       f"is not a constant group size" + (f" (at {t.loc})" if t.loc else ""))


@rule("scaled_dot_product_attention", check=_check)
def _sdpa(t, node, a):
    q, k, v = a["query"], a["key"], a["value"]
    # enable_gqa, or a fused kernel SDPA dispatched to with fewer kv heads than query heads
    if q.rank >= 3 and not D.equal(q.shape[-3], k.shape[-3]):
        k, v = (_heads_like(t, x, q.shape[-3]) for x in (k, v))
    scores = matmul(t, q, swap(t, k, -2, -1))
    if not scores.dtype.is_float or scores.dtype.value in ("bf16", "f16"):
        scores = t.add("cast", scores, dtype="f32")  # softmax in f32, like the workloads
    scores = t.add("mul", scores, _scale(t, a.get("scale"), q.shape[-1], scores.dtype))
    rows, cols = scores.shape[-2], scores.shape[-1]
    if a.get("is_causal"):
        i = t.add("iota", shape=(rows, cols), axis=0, dtype="i64")
        j = t.add("iota", shape=(rows, cols), axis=1, dtype="i64")
        scores = t.add("where", t.add("le", j, i), scores, t.const(NEG_INF, scores.dtype))
    mask = _mask(a)
    if mask is not None:
        if mask.dtype.value == "bool":
            scores = t.add("where", mask, scores, t.const(NEG_INF, scores.dtype))
        else:
            scores = t.add("add", scores, mask)
    probs = safe_softmax(t, scores, scores.rank - 1)
    if probs.dtype != v.dtype:
        probs = t.add("cast", probs, dtype=v.dtype)
    out = matmul(t, probs, v)
    if mask is not None:
        # A query whose every key is masked attends to nothing: torch gives 0 there (its
        # _safe_softmax), where exp(-inf - -inf) is NaN. A select on the row max after
        # the product leaves the softmax and the product as FlashAttention's rules match them.
        m = t.add("reduce", scores, op="max", axis=scores.rank - 1, keepdim=True)
        out = t.add("where", t.add("eq", m, t.const(NEG_INF, m.dtype)), t.const(0.0, out.dtype), out)
    return out


def _scale(t, scale, head_dim, dtype):
    """The user's scale, else 1/sqrt(head_dim) (a `size` node when head_dim is symbolic)."""
    if scale is not None:
        return t.const(float(scale), dtype)
    if head_dim.is_number:
        return t.const(float(1 / sympy.sqrt(head_dim)), dtype)
    return t.add("rsqrt", t.add("size", value=head_dim, dtype=dtype))
