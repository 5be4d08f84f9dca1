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


def test_fake_tensor_calls_infer_shapes_quietly():
    """Under FakeTensorMode (a framework's shape inference) the search's candidate check
    ran on fake tensors, and the call warned it could not compile (a failure counted)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cleave.runtime import backend

    torch._dynamo.reset()
    ctx = backend.reset()
    f = torch.compile(row_sum_twice, backend="cleave")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with FakeTensorMode():
            out = f(torch.empty(2, 3, 5))
    assert out.shape == (2, 3) and ctx.stats()["failed"] == 0
    x = torch.randn(2, 3, 5)
    torch.testing.assert_close(f(x), row_sum_twice(x))


def test_an_ignored_compile_mode_is_said_at_the_users_call():
    """It named torch/__init__.py's wrapper as the line."""
    torch._dynamo.reset()
    f = torch.compile(row_sum_twice, backend="cleave", mode="max-autotune-no-cudagraphs")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f(torch.randn(2, 3))
    ours = [w for w in caught if "does not apply to the cleave backend" in str(w.message)]
    assert ours and all(w.filename == __file__ for w in ours), [(w.filename, w.lineno) for w in ours]


def test_prepare_of_meta_tensors_serves_the_calls_to_come():
    """It keyed the operator to the meta device: the first real call searched and
    compiled again, and the cache kept an entry no call finds."""
    compiled = cleave.compile(row_sum_twice, dynamic={"a": {0: "n"}})
    op = compiled.prepare(torch.empty(3, 4, device="meta"))
    assert op.fields["device"] != "meta"
    x = torch.randn(5, 4)
    torch.testing.assert_close(compiled(x), row_sum_twice(x))
    assert compiled.stats["searches"] == 1 and len(compiled.operators) == 1
