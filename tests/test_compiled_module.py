"""cleave.compile(module) is an nn.Module: the original's parameters and state_dict keys
(no `_orig_mod.` prefix, also inside a larger model), train()/eval() reaching the
flags its forward reads, .to() moving the original, attribute access forwarded, and
cleave.explain of it and of a module compiled in place (`m.compile(backend="cleave")`).
Tiny modules under TRITON_INTERPRET=1."""
from __future__ import annotations

import contextlib
import copy
import pathlib
import warnings

import pytest
import torch

import cleave


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)
        self.register_buffer("scale", torch.full((8,), 2.0))
        self.label = "net"

    def forward(self, x):
        return self.drop(torch.relu(self.lin(x))) * self.scale

_QUANTIZATION_RULES = pathlib.Path(__file__).parents[1] / "docs" / "examples" / "quantization.rules"


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dropout is a graph break, said once
        yield


def test_compiled_module_is_the_module_with_its_own_keys():
    torch.manual_seed(0)
    m = _Net()
    c = cleave.compile(m)
    assert isinstance(c, torch.nn.Module)
    assert [n for n, _ in c.named_parameters()] == [n for n, _ in m.named_parameters()] == ["lin.weight", "lin.bias"]
    assert all(a is b for a, b in zip(c.parameters(), m.parameters()))
    assert list(c.state_dict()) == list(m.state_dict()) == ["scale", "lin.weight", "lin.bias"]
    c.load_state_dict({k: torch.zeros_like(v) for k, v in m.state_dict().items()})
    assert not m.lin.weight.any() and not m.scale.any()
    outer = torch.nn.Sequential(c, torch.nn.ReLU())  # inside a larger model, saved and loaded alike
    saved = outer.state_dict()
    assert list(saved) == ["0.scale", "0.lin.weight", "0.lin.bias"]
    outer.load_state_dict({k: torch.ones_like(v) for k, v in saved.items()})
    assert m.lin.weight.eq(1).all()
    assert c.lin is m.lin and c.label == "net"
    c.label = "renamed"
    assert m.label == "renamed"
    assert "Linear" in repr(c) and "_orig_mod" not in repr(c)


def test_train_and_eval_reach_the_forward():
    """Dropout follows the mode: eval() gives eager's deterministic result, train() the
    same mask as eager for the same seed."""
    torch.manual_seed(0)
    m, x = _Net(), torch.randn(16, 8)
    c = cleave.compile(m)
    with _quiet(), torch.no_grad():
        for mode in (True, False, True):
            assert c.train(mode) is c and c.training is mode and m.training is mode and m.drop.training is mode
            torch.manual_seed(1)
            got = c(x)
            torch.manual_seed(1)
            torch.testing.assert_close(got, m(x))
        c.eval()
        torch.testing.assert_close(c(x), torch.relu(m.lin(x)) * m.scale)


def test_to_moves_the_original_and_calls_follow():
    torch.manual_seed(0)
    m = _Net().eval()
    c = cleave.compile(m)
    x = torch.randn(4, 8)
    with _quiet(), torch.no_grad():
        torch.testing.assert_close(c(x), m(x))
        assert c.to(torch.float64) is c and m.lin.weight.dtype == torch.float64 and m.scale.dtype == torch.float64
        torch.testing.assert_close(c(x.double()), m(x.double()))


def test_a_hook_on_the_compiled_module_fires_once_a_call():
    m = _Net().eval()
    c = cleave.compile(m)
    seen = []
    c.register_forward_hook(lambda module, args, out: seen.append(module))
    with _quiet(), torch.no_grad():
        c(torch.randn(2, 8))
    assert seen == [m]


def test_deepcopy_compiles_a_copy():
    m = _Net().eval()
    c = cleave.compile(m)
    d = copy.deepcopy(c)
    assert isinstance(d, type(c)) and d.lin is not m.lin and d._cleave_function is not c._cleave_function
    torch.testing.assert_close(d.lin.weight, m.lin.weight)


def test_explain_takes_the_compiled_module_and_one_compiled_in_place():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    with torch.no_grad():
        report = cleave.explain(cleave.compile(_Net().eval()), x)
        assert report.operators and report.fidelity[0]["max_abs"] < 1e-5
        m = _Net().eval()
        m.compile(backend="cleave")
        report = cleave.explain(m, x)
    assert report.operators and report.fidelity[0]["max_abs"] < 1e-5
    assert m._compiled_call_impl is not None  # the module itself is left compiled


def test_explain_says_why_a_call_ran_eagerly():
    """With autograd on, a compiled module's call runs eagerly (its kernels have no
    backward); explain reported 0 operators and a perfect match, without the reason."""
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="inputs require grad"):
        report = cleave.explain(cleave.compile(_Net().eval()), x)
    assert not report.operators
    assert any("runs eagerly: inputs require grad" in note for note in report.eager), report.eager
    assert "eager so far: _Net runs eagerly: inputs require grad" in str(report)


def test_compiled_modules_inside_other_compiled_code():
    """A compiled module inside a model: opaque to torch.compile; inside cleave.compile's
    capture it is traced through (the guards read its original's flags: a wrapper's
    `training` is in no __dict__, and reading it raised KeyError, for torch.compile's
    OptimizedModule too)."""
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    inner = cleave.compile(torch.nn.Linear(8, 8))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(lambda t: inner(t * 2) - 1, backend="eager")(x), inner(x * 2) - 1)
        for wrapped in (inner, torch.compile(torch.nn.Linear(8, 8), backend="eager")):
            model = torch.nn.Sequential(wrapped, torch.nn.ReLU())
            torch.testing.assert_close(cleave.compile(model)(x), model(x))
            model.eval()
            assert wrapped.training is False
            torch.testing.assert_close(cleave.compile(model)(x), model(x))
    assert [str(w.message) for w in caught if "cleave" in str(w.message)] == []


def test_torch_save_pickles_the_module_and_how_it_was_compiled(tmp_path):
    """torch.save of the compiled module (or of a model holding it) raised "cannot pickle
    code objects"; it loads as the original compiled with the same arguments."""
    torch.manual_seed(0)
    m = _Net().eval()
    c = cleave.compile(m, dynamic={"x": {0: "b"}}, top_k=2, rules=[_QUANTIZATION_RULES])
    outer = torch.nn.Sequential(c, torch.nn.ReLU())
    x = torch.randn(3, 8)
    with torch.no_grad(), _quiet():
        want = outer(x)
        torch.save(outer, tmp_path / "model.pt")
        back = torch.load(tmp_path / "model.pt", weights_only=False)
        inner = back[0]
        assert type(inner) is type(c) and inner._orig_mod is not m
        assert inner._options["dynamic"] == {"x": {0: "b"}} and inner._options["top_k"] == 2
        assert [r.name for r in inner._options["rules"]] == [r.name for r in c._options["rules"]]
        assert list(inner.state_dict()) == list(c.state_dict())
        torch.testing.assert_close(back(x), want)
        assert inner.stats["calls"] == 1 and inner.stats["operators"] >= 1, inner.stats


class _Scaled(torch.nn.Module):
    def forward(self, x, k: int):  # an int argument: the module runs through dynamo's graphs
        return torch.tanh(x) * k


def test_modules_through_dynamo_each_keep_their_own_compiled_frames():
    """Every module cleave.compile sends through dynamo was called from one wrapper code
    object: dynamo counted each module as a recompile of it, and from the ninth on
    (torch's recompile_limit, 8) the modules ran eagerly, the tenth without a word."""
    x = torch.randn(4, 5)
    with torch.no_grad():
        for _ in range(torch._dynamo.config.recompile_limit + 2):
            compiled = cleave.compile(_Scaled())
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.testing.assert_close(compiled(x, 2), torch.tanh(x) * 2)
            assert not [w for w in caught if "eager" in str(w.message)], [str(w.message) for w in caught]
            assert compiled.stats["operators"] == 1, compiled.stats


def test_a_lazy_module_under_a_dynamic_axis_makes_its_parameters_first():
    """nn.LazyLinear infers its weight's shape at its first call; traced under a dynamic
    axis that inference met symbolic sizes, and every call raised from inside dynamo."""
    torch.manual_seed(0)
    lazy = torch.nn.LazyLinear(4)
    compiled = cleave.compile(lazy, dynamic=True)
    with torch.no_grad():
        for rows in (3, 5, 2):
            x = torch.randn(rows, 6)
            torch.testing.assert_close(compiled(x), x @ lazy.weight.t() + lazy.bias)


def test_a_forward_assigned_on_the_compiled_module_runs():
    """`cm.forward = ...` was kept on the wrapper, which called the original's forward."""
    m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    cm, x = cleave.compile(m, verbose=False), torch.randn(3, 5)

    def skip_tanh(self, x):
        return self[2](self[0](x)) * 10

    with torch.no_grad():
        cm(x)
        cm.forward = skip_tanh.__get__(m)
        torch.testing.assert_close(cm(x), skip_tanh(m, x))


def test_a_forward_branching_on_requires_grad_or_layout_is_captured_again():
    """The capture evaluates a branch on a parameter once: its requires_grad and strides
    are now checked at each call beside its shape, dtype and device."""
    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(5, 7)

        def forward(self, x):
            w = self.lin.weight
            return self.lin(x) * (2 if w.requires_grad else -1) + (0 if w.is_contiguous() else 10)

    m = Gated()
    cm, x = cleave.compile(m, verbose=False), torch.randn(3, 5)
    with torch.no_grad():
        cm(x)
        m.requires_grad_(False)
        torch.testing.assert_close(cm(x), m(x))
        m.lin.weight = torch.nn.Parameter(m.lin.weight.t().contiguous().t(), requires_grad=False)
        torch.testing.assert_close(cm(x), m(x))


def test_a_parametrization_registered_on_the_compiled_module_is_refused_cleanly():
    """register_parametrization deleted the weight through the wrapper, then gave the
    wrapper a class: both the original and the compiled module lost their weight."""
    from torch.nn.utils import parametrize

    class Symmetric(torch.nn.Module):
        def forward(self, w):
            return (w + w.T) / 2

    lin = torch.nn.Linear(5, 5)
    cm, x = cleave.compile(lin, verbose=False), torch.randn(3, 5)
    with torch.no_grad():
        want = lin(x)
        with pytest.raises(TypeError, match="register the parametrization on the module itself"):
            parametrize.register_parametrization(cm, "weight", Symmetric())
        torch.testing.assert_close(cm(x), want)
        parametrize.register_parametrization(cm._orig_mod, "weight", Symmetric())
        torch.testing.assert_close(cm(x), lin(x))
        assert not torch.allclose(lin(x), want)


def test_user_attributes_named_like_cleaves_are_written_to_the_module():
    """`cm.compiled = True` replaced the compiled function (the next call raised), and
    `cm.stats = ...` raised: writes reach the module; reads of cleave's documented names
    (`stats`, `operators`, ...) stay cleave's."""
    class Flagged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.compiled, self.stats = torch.nn.Linear(5, 3), False, {"seen": 0}

        def forward(self, x):
            return self.lin(x)

    m = Flagged()
    cm, x = cleave.compile(m, verbose=False), torch.randn(3, 5)
    with torch.no_grad():
        cm(x)
        cm.compiled, cm.stats = True, {"seen": 1}
        assert m.compiled is True and cm.compiled is True and m.stats == {"seen": 1}
        assert cm.stats["calls"] == 1
        torch.testing.assert_close(cm(x), m(x))


def test_a_compiled_submodule_under_dynamo_is_not_reported_as_eager():
    """A buffer mutated in forward sends the outer module through dynamo, which breaks its
    graph at the compiled inner module: that was warned as code that "runs eagerly"."""
    class Outer(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.lin = inner, torch.nn.Linear(7, 3)
            self.register_buffer("seen", torch.zeros(3))

        def forward(self, x):
            y = self.lin(self.inner(x).relu())
            self.seen.add_(y.mean(0))
            return y

    inner = cleave.compile(torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh()), verbose=False)
    outer = cleave.compile(Outer(inner), verbose=False)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 5):
            outer(torch.randn(n, 5))
    assert not [w for w in caught if "CompiledFunction" in str(w.message)], [str(w.message) for w in caught]
    assert inner.stats["calls"] >= 2


def test_a_module_classes_own_eval_and_to_run_through_the_compiled_module():
    """cm.eval() ran nn.Module.eval on the wrapper, which trains the original off but
    skipped the class's own eval (here it also sets a scale)."""
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.scale, self.moved = torch.nn.Linear(5, 3), 1.0, 0

        def forward(self, x):
            return self.lin(x) * self.scale

        def eval(self):
            self.scale = 0.5
            return super().eval()

        def to(self, *args, **kwargs):
            self.moved += 1
            return super().to(*args, **kwargs)

    m = Scaled()
    cm, x = cleave.compile(m, verbose=False), torch.randn(4, 5)
    with torch.no_grad():
        cm(x)
        assert cm.eval() is cm and cm.to(torch.float32) is cm
        assert m.scale == 0.5 and not m.training and m.moved == 1
        torch.testing.assert_close(cm(x), m(x))
