"""Shape buckets for autotuning: each dynamic symbol rounded up to a power of two.

Plans are valid for every shape (dynamic axes are runtime extents); only which of
the top-k plans is fastest changes with the shape, and it changes slowly, so one
profiling run per bucket is enough.
"""
from __future__ import annotations


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def bucket(env: dict[str, int], dynamic: set[str]) -> str:
    """A stable text key, e.g. 'L=8192,b=64'; '' when nothing is dynamic."""
    return ",".join(f"{k}={next_pow2(env[k])}" for k in sorted(dynamic) if k in env)
