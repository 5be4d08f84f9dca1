"""Meta tensors carry shapes only: a call with them runs eagerly (shape inference), with
no kernel launched and no warning; it warned that the kernels failed on their first
launch ("Cannot copy out of meta tensor")."""
import warnings

import torch

import cleave


def row_sum_twice(a):
    return a.sum(-1) * 2


def test_meta_calls_infer_shapes_quietly():
    torch._dynamo.reset()
    for f in (cleave.compile(row_sum_twice), torch.compile(row_sum_twice, backend="cleave")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = f(torch.randn(2, 3, 5, device="meta"))
        assert out.is_meta and out.shape == (2, 3)
