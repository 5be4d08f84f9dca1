"""Split: a reduction over a reducible axis becomes per-chunk reductions plus a
combine over the chunks. The count is one symbol per axis (s_L for an axis L);
the ragged tail is padded with the reduction's neutral element, so any count is
valid (an entirely empty chunk is the scheduler's to guard)."""
from .dsl import parse_rules

RULES = parse_rules("""
family split

rule split-sum: rsum(x, a) => squeeze(rsum(rsum(split(x, a, 0), a), a-1), a)
  if splittable(x, a)
  why: a sum is the sum of its chunks' sums; zero padding adds nothing
  rewrites: rsum(x, -1) with x[m, n]
  keeps: rsum(x, -1) with x[n, n]

rule split-max: rmax(x, a) => squeeze(rmax(rmax(split(x, a, -inf), a), a-1), a)
  if splittable(x, a)
  why: a max is the max of its chunks' maxima; -inf padding never wins
  rewrites: rmax(x, -2) with x[n, m]
  keeps: rmax(x, -2) with x[m, m]

rule split-k: matmul(x, y) => squeeze(rsum(matmul(swap(split(x, -1, 0)), split(y, -2, 0)), -3), -2)
  if splittable(x, -1)
  why: contracting K is summing the products of K chunks; zero padding adds nothing
  rewrites: matmul(x, w) with x[m, k], w[k, n]
  keeps: matmul(x, w) with x[k, k], w[k, n]
""", source=__file__)
