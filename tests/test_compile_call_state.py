"""cleave.compile against eager where a call depends on more than its tensors' shapes:
calls made for their effect (print, warnings, logging), the function's own defaults and
code changed after the first call, and tensor subclass arguments; and cleave.capture
refusing dynamic symbols the kernels cannot take, as cleave.compile does."""
from __future__ import annotations

import logging
import warnings

import pytest
import torch

import cleave
from cleave.frontends.errors import CaptureError


def _close(got, want):
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# -- calls made for their effect ------------------------------------------------
def _prints(x):
    print("step")
    return x + 1


def _warns(x):
    warnings.warn("user warning")
    return x * 2


def _logs(x):
    logging.getLogger("cleave_probe").warning("logged")  # a call chain: not named, not looked into
    logging.warning("module-level")
    return x - 1


def _report(y):
    print("helper", y.shape[0])


def _calls_a_reporting_helper(x):
    _report(x)
    return x.exp()


@pytest.mark.parametrize("fn", [_prints, _calls_a_reporting_helper])
def test_print_runs_at_every_call(fn, capsys):
    f = cleave.compile(fn, verbose=False)
    x = torch.arange(3.0)
    for _ in range(3):
        _close(f(x), fn(x))
    out = capsys.readouterr().out
    assert out.count("step") + out.count("helper") == 6  # three calls, and three eager ones
    assert "print" in f.capture_error


def test_warnings_warn_runs_at_every_call():
    f = cleave.compile(_warns, verbose=False)
    x = torch.arange(3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            _close(f(x), x * 2)
    assert sum("user warning" in str(w.message) for w in caught) == 3


def test_logging_runs_at_every_call(caplog):
    f = cleave.compile(_logs, verbose=False)
    x = torch.arange(3.0)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            _close(f(x), x - 1)
    assert caplog.text.count("module-level") == 3


def _collects_locally(x):
    parts = []
    parts.append(x * 2)  # a local list: the trace records what it holds
    x.mul_(1)
    return torch.cat(parts).sum()


def test_calls_on_locals_and_tensors_still_capture_whole():
    f = cleave.compile(_collects_locally, verbose=False)
    x = torch.randn(8)
    _close(f(x), _collects_locally(x))
    assert f.capture_error is None and f.stats["operators"] == 1


# -- the function's defaults and code ---------------------------------------------
def _reseeds(x):
    torch.manual_seed(7)
    return x @ x.t()


def _reads_the_precision(x):
    scale = 2.0 if torch.get_float32_matmul_precision() == "highest" else 3.0
    return x * scale + torch.initial_seed() % 1000


def test_torch_process_state_is_set_and_read_at_every_call():
    """A trace made `torch.manual_seed(7)` once, at the first call, and kept the first
    answers of `torch.get_float32_matmul_precision()` and `torch.initial_seed()`: eager
    reseeds and reads them at every call."""
    x = torch.randn(3, 5)
    reseeds = cleave.compile(_reseeds, verbose=False)
    for _ in range(3):
        torch.manual_seed(0)
        _close(reseeds(x), _reseeds(x))
        drawn = torch.rand(2)
        torch.manual_seed(0)
        _reseeds(x)
        assert torch.equal(drawn, torch.rand(2))
    reads = cleave.compile(_reads_the_precision, verbose=False)
    try:
        for precision, seed in (("highest", 101), ("medium", 102), ("highest", 103)):
            torch.set_float32_matmul_precision(precision)
            torch.manual_seed(seed)
            _close(reads(x), _reads_the_precision(x))
    finally:
        torch.set_float32_matmul_precision("highest")
    assert "torch.get_float32_matmul_precision" in reads.capture_error


def test_a_change_of_defaults_is_followed():
    def scaled(x, s=2.0):
        return x * s

    f = cleave.compile(scaled, verbose=False)
    x = torch.arange(3.0)
    _close(f(x), x * 2)
    scaled.__defaults__ = (5.0,)
    _close(f(x), x * 5)


def test_a_change_of_keyword_only_defaults_is_followed():
    def scaled(x, *, k=3.0):
        return x * k

    f = cleave.compile(scaled, verbose=False)
    x = torch.arange(3.0)
    _close(f(x), x * 3)
    scaled.__kwdefaults__ = {"k": 7.0}
    _close(f(x), x * 7)
    scaled.__kwdefaults__["k"] = 4.0  # the dict changed in place
    _close(f(x), x * 4)


def test_a_replaced_code_object_is_followed():
    """IPython's autoreload applies an edit by replacing the function's __code__."""
    def edited(x, y):
        return x - y

    f = cleave.compile(edited, verbose=False)
    a, b = torch.arange(3.0), torch.ones(3)
    _close(f(a, b), a - b)
    edited.__code__ = (lambda y, x: (x - y) * 100).__code__  # its parameters swapped, too
    _close(f(a, b), (b - a) * 100)
    _close(f(x=a, y=b), (a - b) * 100)  # keywords bound by the new parameters


# -- tensor subclass arguments ------------------------------------------------------
class _Clip(torch.Tensor):
    """Clamps the result of every multiplication to [-1, 1]."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if func in (torch.Tensor.__mul__, torch.Tensor.mul):
            with torch._C.DisableTorchFunctionSubclass():
                return out.clamp(-1, 1)
        return out


class _Tag(torch.Tensor):
    pass


def _affine(x):
    return x * 3 + 1


@pytest.mark.parametrize("cls", [_Clip, _Tag])
def test_a_tensor_subclass_argument_runs_eagerly_with_a_warning(cls):
    x = torch.tensor([0.1, 0.5, -0.9])
    f = cleave.compile(_affine, verbose=False)
    _close(f(x), _affine(x))  # a plain tensor first: its launch must not serve the subclass
    with pytest.warns(UserWarning, match=f"'x' is a {cls.__name__}, a torch.Tensor subclass"):
        got = f(x.as_subclass(cls))
    want = _affine(x.as_subclass(cls))
    assert type(got) is type(want)  # _Tag's result is a _Tag; _Clip's clamp returns a plain tensor
    _close(got.as_subclass(torch.Tensor), want.as_subclass(torch.Tensor))
    _close(f(x), _affine(x))


# -- dynamic symbols cleave.capture takes ------------------------------------------
@pytest.mark.parametrize("symbol, why", [("pid", "a name the generated kernels use"),
                                         ("tl", "a name the generated kernels use"),
                                         ("if", "a Python keyword"), ("len", "a Python builtin"),
                                         ("x", "also an argument's name")])
def test_capture_refuses_symbols_the_kernels_cannot_take(symbol, why):
    with pytest.raises(CaptureError, match=f"symbol {symbol!r} is {why}"):
        cleave.capture(lambda x: x.sum(), torch.randn(3), dynamic={"x": {0: symbol}})
    assert cleave.capture(lambda x: x.sum(), torch.randn(3), dynamic={"x": {0: "n"}}).inputs["x"].rank == 1


class _TupleScaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x, scales=None):
        h = self.lin(x)
        return h if scales is None else h * scales[0]


def test_a_rejected_call_through_dynamo_raises_eagers_error_without_torchs_log(capfd):
    """A tuple argument sends the module through dynamo's graphs; a call with a wrong
    width then fails in the fake-tensor trace, which torch logged with its traceback
    (19 lines) before eager's one-line error."""
    compiled = cleave.compile(_TupleScaled().eval())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(torch.randn(5, 16))
        compiled(torch.randn(5, 16), scales=(torch.tensor(2.0),))
        capfd.readouterr()
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            compiled(torch.randn(5, 17))
    assert "failed while attempting to run meta" not in capfd.readouterr().err
