"""A slice write into a KV cache passed beside a view of it: AOTAutograd merges the two
into a synthetic base, and torch's slice_scatter decomposition compares the slice's
bounds with the cache's symbolic length in Python. Each compare was a guard on a symbol
of that base, which has no source: dynamo's guard builder raised IndexError at the
second cache length (automatic dynamic), and at every call under dynamic=True. Over a
symbolic size the decomposition now builds its mask without branching
(frontends/decompositions.py `_slice_scatter`)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()


def write_and_read(cache, k, q):
    cache[:, 2:3] = k  # q is a view of this very row
    return q * 2 + cache.sum(1, keepdim=True)


def strided_write(x, y):
    x[:, ::2] = y
    return x * 1


def tail_write(x, y):
    x[:, x.shape[1] - 2:] = y
    return x + 1


def _cache_args(length):
    cache = torch.randn(2, length, 4)
    return cache, torch.randn(2, 1, 4), cache[:, 2:3]


CASES = [
    (write_and_read, _cache_args),
    (strided_write, lambda n: (torch.randn(3, n), torch.randn(3, (n + 1) // 2))),
    (tail_write, lambda n: (torch.randn(3, n), torch.randn(3, 2))),
]


@pytest.mark.parametrize("fn, make", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("dynamic", [None, True])
def test_slice_writes_over_a_dynamic_length_match_eager(fn, make, dynamic):
    compiled = torch.compile(fn, backend="cleave", dynamic=dynamic)
    for length in (6, 8, 5):
        torch.manual_seed(length)
        ours = make(length)
        torch.manual_seed(length)
        theirs = make(length)
        torch.testing.assert_close(compiled(*ours), fn(*theirs))
        for a, b in zip(ours, theirs):  # the writes into the arguments too
            torch.testing.assert_close(a, b)


def test_the_cache_write_under_cleave_compile_matches_eager():
    compiled = cleave.compile(write_and_read, dynamic="all")
    for length in (6, 9):
        torch.manual_seed(length)
        ours = _cache_args(length)
        torch.manual_seed(length)
        theirs = _cache_args(length)
        torch.testing.assert_close(compiled(*ours), write_and_read(*theirs))
        torch.testing.assert_close(ours[0], theirs[0])
