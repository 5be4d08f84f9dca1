"""What a tensor argument carries besides its values and layout: a lazy negation (the
negative bit of `z.conj().imag`), its storage offset and whether it is an inference
tensor, which code can read; and elements sharing memory, which an in-place write of
the argument must see as eager does. Found by the session-49 probes: each gave a
wrong answer, or eager's error raised from inside cleave after the kernels ran."""
from __future__ import annotations

import warnings

import pytest
import torch

import cleave


def _close(got, want):
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _softmax(t):
    return t.softmax(-1)


def _row_sums(t, w):
    return (t @ w).sum(-1)


def _doubled_max(t):
    t.mul_(2)
    return t.amax()


@pytest.mark.parametrize("route", ["capture", "dynamo"])
def test_a_negative_view_is_read_with_its_sign(route):
    """`torch._neg_view` (as `z.conj().imag` makes) keeps x in memory and reads -x: the
    kernels took its raw memory, and computed on +x."""
    wrap = (lambda f: cleave.compile(f, verbose=False)) if route == "capture" else \
        (lambda f: torch.compile(f, backend="cleave"))
    held = torch.randn(3, 5)
    x = torch._neg_view(held)
    assert x.is_neg()
    with torch.no_grad():
        _close(wrap(_softmax)(x), _softmax(-held))
        w = torch.randn(5, 4)
        _close(wrap(_row_sums)(x, w), _row_sums(-held, w))


def test_an_input_written_in_place_through_a_negative_view_keeps_its_sign():
    held = torch.randn(3, 5)
    x, want = torch._neg_view(held.clone()), -held * 2
    with torch.no_grad():
        got = cleave.compile(_doubled_max, verbose=False)(x)
    _close(x, want)
    _close(got, want.amax())


def _plus_offset(x):
    return x.sum(-1) + x.storage_offset()


def _branch_on_inference(x):
    return x.sum(-1) if x.is_inference() else x.amax(-1)


def test_code_reading_a_storage_offset_gets_this_calls():
    """A capture kept the offset it traced (1) as a constant for every later offset:
    such code runs through dynamo's graphs, which guard it."""
    base = torch.randn(60)
    f = cleave.compile(_plus_offset, verbose=False)
    _close(f(base[1:16].view(3, 5)), _plus_offset(base[1:16].view(3, 5)))
    _close(f(base[7:22].view(3, 5)), _plus_offset(base[7:22].view(3, 5)))


def test_code_reading_whether_a_tensor_is_an_inference_tensor_gets_this_calls():
    f = cleave.compile(_branch_on_inference, verbose=False)
    x = torch.randn(3, 5)
    _close(f(x), x.amax(-1))
    with torch.inference_mode():
        it = torch.randn(3, 5)
    _close(f(it), it.sum(-1))


def _doubled_sum(x):
    x.mul_(2)
    return x.sum(-1)


def _add_one_sum(x):
    x.add_(1)
    return x.sum()


def test_an_input_written_in_place_whose_elements_share_memory_runs_eagerly():
    """Eager doubles a shared element once per index that reaches it; the kernels' copy
    back doubled each once."""
    want_base = torch.randn(20)
    got_base = want_base.clone()
    want = _doubled_sum(want_base.as_strided((4, 5), (2, 1)))
    with pytest.warns(UserWarning, match="elements share memory"):
        got = cleave.compile(_doubled_sum, verbose=False)(got_base.as_strided((4, 5), (2, 1)))
    _close(got, want)
    _close(got_base, want_base)


def test_an_input_written_in_place_through_a_strided_slice_still_compiles():
    """Every other column, `x[:, ::2]`, shares no element: torch's overlap check cannot
    tell for such views, and they ran eagerly as if they overlapped."""
    want_base = torch.randn(4, 10)
    got_base = want_base.clone()
    want = _doubled_sum(want_base[:, ::2])
    f = cleave.compile(_doubled_sum, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager run would warn
        got = f(got_base[:, ::2])
    _close(got, want)
    _close(got_base, want_base)
    assert f.stats["searches"] == 1


def test_writing_an_expanded_input_raises_eagers_error_from_the_users_code():
    x = torch.randn(1, 5).expand(3, 5)
    f = cleave.compile(_add_one_sum, verbose=False)
    with pytest.warns(UserWarning, match="elements share memory"), \
            pytest.raises(RuntimeError, match="more than one element of the written-to tensor") as err:
        f(x)
    assert "graph_breaks" not in err.traceback[-1].path.name


def _scaled_softmax(x, scale=2.0):
    return (x * scale).softmax(-1)


def test_a_call_through_dynamo_takes_inference_tensors():
    """A float argument sends the call through dynamo's graphs, whose version check of
    the arguments raised "Inference tensors do not track version counter"."""
    f = cleave.compile(_scaled_softmax, verbose=False)
    with torch.inference_mode():
        x = torch.randn(3, 5)
        with pytest.warns(UserWarning, match="runs through torch.compile's graphs"):
            _close(f(x, scale=3.0), _scaled_softmax(x, scale=3.0))
        _close(f(x, scale=3.0), _scaled_softmax(x, scale=3.0))
