"""Rescale / softmax: safe softmax fuses through separability and online
rescaling (RedFuser's incremental form), with the row max kept."""
from .dsl import parse_rules

RULES = parse_rules("""
family rescale

rule exp-sub-separate: exp(sub(x, c)) => mul(exp(x), exp(neg(c)))
  why: exp(x - c) = exp(x) * exp(-c): with c constant along a reduced axis, a running c rescales by exp(c_old - c_new)
  f32: exp(x) and exp(-c) overflow apart where exp(x - c) does not (inf * 0); the extraction keeps no exp of an operand that is not a difference (extract.py), so the bare product is a proof step, never a kernel
  rewrites: exp(sub(x, c)) with x[m, n], c[m, 1]
  keeps: exp(add(x, c)) with x[m, n], c[m, 1]

rule exp2-sub-separate: exp2(sub(x, c)) => mul(exp2(x), exp2(neg(c)))
  why: 2^(x - c) = 2^x * 2^-c: as exp-sub-separate, in base 2, a running c rescales by exp2(c_old - c_new)
  f32: as exp-sub-separate: the bare product overflows, and the extraction keeps no exp2 of an operand that is not a difference
  rewrites: exp2(sub(x, c)) with x[m, n], c[m, 1]
  keeps: exp2(add(x, c)) with x[m, n], c[m, 1]

rule split-softmax-sum: rsum(exp(sub(x, c)), a) => squeeze(rsum(mul(rsum(exp(sub(split(x, a, -inf), inf_to_zero(rmax(split(x, a, -inf), a)))), a), exp(sub(inf_to_zero(rmax(split(x, a, -inf), a)), unsqueeze(c, a)))), a-1), a)
  if splittable(x, a) and flat(c, a) and nonempty(x, a)
  why: sum_a exp(x - c) = sum_chunks exp(m_i - c) * sum_chunk exp(x - m_i) for any finite m_i: the chunk max, or 0 where a mask or padding left the chunk all -inf (its max would make exp(-inf - -inf) = NaN)
  rewrites: rsum(exp(sub(x, c)), -1) with x[m, n], c[m, 1]
  keeps: rsum(exp(sub(x, c)), -1) with x[n, n], c[n, 1]

rule split-softmax-matmul: matmul(exp(sub(x, c)), y) => squeeze(rsum(mul(matmul(swap(exp(sub(split(x, -1, -inf), inf_to_zero(rmax(split(x, -1, -inf), -1))))), split(y, -2, 0)), swap(exp(sub(inf_to_zero(rmax(split(x, -1, -inf), -1)), unsqueeze(c, -1))))), -3), -2)
  if splittable(x, -1) and flat(c, -1) and nonempty(x, -1)
  why: exp(x - c) @ y = sum_chunks exp(m_i - c) * (exp(x_i - m_i) @ y_i): each chunk's partial output is rescaled by its max (0 for an all -inf chunk, as in split-softmax-sum)
  rewrites: matmul(exp(sub(s, c)), v) with s[m, n], c[m, 1], v[n, d]
  keeps: matmul(exp(sub(s, c)), v) with s[m, n], c[1, n], v[n, d]

family softmax

rule normalize-after-matmul: matmul(div(x, c), y) => div(matmul(x, y), c)
  if flat(c, -1) and nonzero(c)
  why: a row divisor constant along the contracted axis commutes with the MatMul (softmax's division moves after P@V); not one that may be 0, where eager's 0/0 is NaN and the moved division's 1/0 inf
  rewrites: matmul(div(p, rsum(exp(sub(s, rmax(s, -1))), -1)), v) with p[m, n], s[m, n], v[n, d]
  keeps: matmul(div(p, l), v) with p[m, n], l[1, n], v[n, d]
  keeps: matmul(div(p, l), v) with p[m, n], l[m, 1], v[n, d]

rule softmax-shift: div(exp(sub(x, c)), rsum(exp(sub(x, c)), a)) => div(exp(sub(x, rmax(x, a))), rsum(exp(sub(x, rmax(x, a))), a))
  if flat(c, a) and within(c, x)
  why: softmax is invariant to a shift constant along its axis; the row max is the safe one (c within x: dropping it keeps the shape)
  f32: where exp(x - c) overflows or every exp(x - c) of a row underflows (NaN in f32), the max-shifted softmax is finite and exact: the rewrite exists to be more exact than the program there
  rewrites: div(exp(sub(x, c)), rsum(exp(sub(x, c)), -1)) with x[m, n], c[m, 1]
  keeps: div(exp(sub(x, c)), rsum(exp(sub(x, c)), -1)) with x[m, n], c[1, n]

rule topk-softmax-values: topk_values(div(exp(sub(x, c)), rsum(exp(sub(x, c)), a)), k, a) => div(exp(sub(topk_values(x, k, a), c)), rsum(exp(sub(x, c)), a))
  if flat(c, a)
  why: x -> exp(x - c)/l with l > 0 is strictly increasing along a, so it commutes with top-k
  rewrites: topk_values(div(exp(sub(x, c)), rsum(exp(sub(x, c)), -1)), 2, -1) with x[t, e], c[t, 1]
  keeps: topk_values(div(exp(sub(x, c)), rsum(exp(sub(x, c)), -1)), 2, -1) with x[t, e], c[1, e]

rule topk-softmax-indices: topk_indices(div(exp(sub(x, c)), rsum(exp(sub(x, c)), a)), k, a) => topk_indices(x, k, a)
  if flat(c, a) and within(c, x)
  why: a strictly increasing map along a keeps the order, so the top-k positions are those of the logits (c within x: dropping it keeps the shape)
  f32: where f32 rounds two probabilities equal (close logits, or exps that underflow to 0) the program's top-k takes the lower index and the logits' order the larger logit: exact in the reals, the order of the logits is kept
  rewrites: topk_indices(div(exp(sub(x, c)), rsum(exp(sub(x, c)), -1)), 2, -1) with x[t, e], c[t, 1]
  keeps: topk_indices(div(exp(sub(x, c)), rsum(exp(sub(x, c)), -1)), 2, -1) with x[t, e], c[1, e]
""", source=__file__)
