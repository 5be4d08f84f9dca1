"""cleave.compile against eager when module state changes between calls or in forward:
the training flag and attributes of any submodule, hooks and their state, attributes and
buffers forward assigns, and a module reached through a global or a closure whose
parameters are replaced. A capture that cannot serve such a function recaptures or runs
it through dynamo; a plain module is still captured once."""
from __future__ import annotations

import collections
import copy
import warnings

import pytest
import torch
from torch import nn

import cleave


def _close(got, want):
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _follows(m, target, x, *changes):
    """cleave.compile(target) of module m, compared with m at x first and after each
    change (a callable that changes m's state), without grad; returns the compiled one."""
    f = cleave.compile(target, verbose=False)
    with torch.no_grad():
        _close(f(x), m(x))
        for change in changes:
            change()
            _close(f(x), m(x))
    return f


class _Doubled(nn.Module):
    """Doubles its input in training mode: a branch on `self.training` (as Dropout) that
    gives one answer per mode."""

    def forward(self, x):
        return x * 2 if self.training else x


def test_a_submodules_training_flag_is_guarded():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), _Doubled(), nn.Linear(7, 3)).eval()
    f = cleave.compile(model, verbose=False)
    x = torch.randn(4, 5)
    with torch.no_grad():
        _close(f(x), model(x))
        model.train()
        _close(f(x), model(x))
        model[1].eval()  # one submodule alone
        _close(f(x), model(x))


def test_dropout_acts_after_train():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 17), nn.Dropout(0.5), nn.Linear(17, 3)).eval()
    f = cleave.compile(model, verbose=False)
    x = torch.randn(4, 5)
    with torch.no_grad():
        f(x)
        model.train()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # dropout's random mask runs eagerly, said once
            y = f(x)
        assert not torch.allclose(y, model[2](model[0](x)))


class _Tempered(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 7)
        self.temperature = 1.0
        self.mix = [1.0, 0.5]

    def _logits(self, x):  # attributes read in a helper method, not in forward's own code
        return self.lin(x) / self.temperature * self.mix[1]

    def forward(self, x):
        return self._logits(x).softmax(-1)


def test_attributes_read_in_a_helper_and_lists_changed_in_place_are_guarded():
    torch.manual_seed(0)
    m = _Tempered().eval()
    f = _follows(m, m, torch.randn(3, 5), lambda: setattr(m, "temperature", 0.25),
                 lambda: m.mix.__setitem__(1, 3.0))
    assert f.stats["recaptures"] == 2 and f.capture_error is None


class _Scale:
    def __init__(self):
        self.k = 2.0

    def __call__(self, module, inputs, out):
        return out * self.k


def test_a_stateful_forward_hook_runs_through_dynamo():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).eval()
    hook = _Scale()
    m[0].register_forward_hook(hook)
    f = _follows(m, m, torch.randn(3, 5), lambda: setattr(hook, "k", 5.0))
    assert "hook" in f.capture_error


def test_a_hook_collecting_features_gets_each_calls_tensor():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).eval()
    feats = []
    m[1].register_forward_hook(lambda mod, inputs, out: feats.append(out))
    f = cleave.compile(m, verbose=False)
    xs = [torch.randn(4, 5) for _ in range(3)]
    with torch.no_grad():
        for x in xs:
            _close(f(x), m[2](torch.tanh(m[0](x))))
    assert len(feats) == 3  # one per call (the eager references call the layers themselves)
    for x, feat in zip(xs, feats):
        assert type(feat) is torch.Tensor
        _close(feat, torch.tanh(m[0](x)))


class _Stream(nn.Module):
    """A streaming position kept in a Python attribute that forward advances."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(5, 7)
        self.pos = 0

    def forward(self, x):
        t = x.shape[0]
        p = torch.arange(self.pos, self.pos + t, dtype=torch.float32)[:, None]
        self.pos += t
        return self.proj(x) + torch.sin(p / 10)


class _Cache(nn.Module):
    """A KV cache: a buffer forward reassigns with one more step each call."""

    def __init__(self):
        super().__init__()
        self.kv = nn.Linear(5, 5)
        self.register_buffer("k", torch.zeros(1, 0, 5), persistent=False)

    def forward(self, x):
        self.k = torch.cat([self.k, self.kv(x)], 1)
        return (x @ self.k.transpose(1, 2)).softmax(-1) @ self.k


class _Router(nn.Module):
    """A load-balancing loss left on the module for the caller."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(5, 3)
        self.aux_loss = None

    def forward(self, x):
        p = self.gate(x).softmax(-1)
        self.aux_loss = (p.mean(0) ** 2).sum() * 3
        return x * p.max(-1, keepdim=True).values


@pytest.mark.parametrize("cls, shape, state", [
    (_Stream, (4, 5), lambda m: m.pos),
    (_Cache, (1, 2, 5), lambda m: m.k),
    (_Router, (4, 5), lambda m: m.aux_loss),
])
def test_attributes_and_buffers_forward_assigns_are_kept(cls, shape, state):
    torch.manual_seed(0)
    m = cls()
    ref = copy.deepcopy(m)
    f = cleave.compile(m, verbose=False)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(shape)
            _close(f(x), ref(x))
            _close(torch.as_tensor(state(m)), torch.as_tensor(state(ref)))
    assert "state" in f.capture_error


class _Counted(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)
        self.calls = 0
        self.last = None

    def forward(self, x):
        self.calls += 1
        self.last = self.lin(x)
        return self.last


COUNTED = _Counted()


def _through_counted(x):
    return COUNTED(x).softmax(-1)


def test_a_global_modules_state_is_not_left_with_the_traces_values():
    """Export puts back the attributes of the module it exports only: a module reached
    through a global kept the trace's fake tensors (and its counter advanced once more)."""
    x = torch.randn(4, 5)
    f = cleave.compile(_through_counted, verbose=False)
    with torch.no_grad():
        for calls in (1, 2):
            _close(f(x), COUNTED.lin(x).softmax(-1))
            assert COUNTED.calls == calls and type(COUNTED.last) is torch.Tensor


GLOBAL_MODEL = nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 3))


def _predict(x):
    return GLOBAL_MODEL(x).softmax(-1)


def _closure_predict(model):
    def predict(x):
        return model(x).softmax(-1)
    return predict


@pytest.mark.parametrize("held_in", ["global", "closure"])
def test_parameters_of_a_module_in_a_global_or_closure_are_guarded(held_in):
    torch.manual_seed(0)
    model = GLOBAL_MODEL if held_in == "global" else nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 3))
    fn = _predict if held_in == "global" else _closure_predict(model)
    f = cleave.compile(fn, verbose=False)
    x = torch.randn(4, 5)
    with torch.no_grad():
        _close(f(x), fn(x))
        fresh = nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 3)).state_dict()
        model.load_state_dict(fresh, assign=True)  # new Parameter objects
        _close(f(x), fn(x))
        model[2].bias = nn.Parameter(torch.randn(3))
        _close(f(x), fn(x))
        model[0].weight.data = torch.randn(7, 5)  # the same Parameter over new memory
        _close(f(x), fn(x))
        model[0].weight.mul_(0.5)  # in place: read through the same memory, no recapture
        _close(f(x), fn(x))
        model.train()  # the module's own state is guarded too
        model[1].approximate = "tanh"
        _close(f(x), fn(x))
    assert f.stats["recaptures"] == 4 and f.capture_error is None


class _Config:
    def __init__(self):
        self.scale = 2.0


class _Configured(nn.Module):
    """An attribute cleave cannot compare (an object whose own attributes may change)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)
        self.config = _Config()

    def forward(self, x):
        return self.lin(x) * self.config.scale


def test_an_attribute_cleave_cannot_compare_runs_through_dynamo():
    torch.manual_seed(0)
    m = _Configured().eval()
    f = _follows(m, m, torch.randn(4, 5), lambda: setattr(m.config, "scale", -3.0))
    assert "config" in f.capture_error


class _Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.l2 = nn.Linear(16, 8)
        self.scale = 0.5

    def forward(self, x):
        return self.l2(self.act(self.l1(x))) * self.scale


def test_a_plain_module_is_captured_once():
    """Two compiled modules called in turn each capture once: registering the capture's
    own hook on one had made the other recapture at its next call, and so on."""
    torch.manual_seed(0)
    a, b = _Plain().eval(), nn.Sequential(nn.Linear(8, 4), nn.Tanh()).eval()
    fa, fb = cleave.compile(a, verbose=False), cleave.compile(b, verbose=False)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 8)
            _close(fa(x), a(x))
            _close(fb(x), b(x))
    for f in (fa, fb):
        assert f.stats["recaptures"] == 0 and f.capture_error is None
        assert f.stats["compiles"] + f.stats["from_cache"] == 1


def test_a_bound_forward_is_captured_and_guarded_as_its_module():
    """cleave.compile(model.forward) failed to capture (the renamed function lost self)
    and always ran through dynamo; captured, the module's parameters are baked in, so
    they are guarded as a global module's are."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)).eval()
    x = torch.randn(4, 5)
    f = _follows(m, m.forward, x)
    assert f.capture_error is None and f.stats["operators"] == 1, (f.capture_error, f.stats)
    with torch.no_grad():
        for change in (lambda: setattr(m[2], "bias", nn.Parameter(torch.randn(3))),
                       lambda: m[0].weight.mul_(2), lambda: m.__setitem__(1, _Doubled().train())):
            change()
            _close(f(x), m(x))


SCALE = 2.0
TABLE = torch.arange(8.0)


def _scaled(x):
    return x * SCALE + TABLE


def _through_a_helper(x):
    return _scaled(x).sum(-1)


class _ReadsAGlobalInAHelper(nn.Module):
    def forward(self, x):
        return self.scaled(x).sum(-1)

    def scaled(self, x):
        return _scaled(x)


class _Outer(nn.Module):
    """A submodule whose forward reads a global, and a class attribute read off self."""
    factor = 3.0

    def __init__(self):
        super().__init__()
        self.inner = _ReadsAGlobalInAHelper()

    def forward(self, x):
        return self.inner(x) * self.factor


def test_globals_read_by_the_functions_it_calls_and_class_attributes_are_guarded(monkeypatch):
    """They were baked in: cleave returned the first capture's values after SCALE, a
    global tensor updated in place, or a class attribute changed (silently wrong)."""
    x = torch.randn(4, 8)
    f = cleave.compile(_through_a_helper, verbose=False)
    _close(f(x), _through_a_helper(x))
    monkeypatch.setitem(globals(), "SCALE", 5.0)
    _close(f(x), _through_a_helper(x))
    TABLE.add_(1.0)
    _close(f(x), _through_a_helper(x))

    m = _Outer()
    changes = [lambda: monkeypatch.setitem(globals(), "SCALE", 7.0),
               lambda: monkeypatch.setattr(_Outer, "factor", 4.0)]
    _follows(m, m, x, *changes)
    _follows(m, m.forward, x, lambda: monkeypatch.setattr(_Outer, "factor", 0.5))


CONFIG = {"scale": 2.0, "shift": (1.0, 2.0)}
STEPS = [2.0]


class _Settings:
    def __init__(self):
        self.scale = 2.0


SETTINGS = _Settings()


class _Opaque:
    """An object whose attribute holds another object: cleave cannot compare it cheaply."""

    def __init__(self):
        self.inner = _Settings()


OPAQUE = _Opaque()


def _reads_containers(x):
    return (x * CONFIG["scale"] + CONFIG["shift"][1] + STEPS[0] * SETTINGS.scale).sum(-1)


def _reads_an_opaque_object(x):
    return (x * OPAQUE.inner.scale).sum(-1)


def test_containers_and_plain_objects_in_globals_are_guarded_by_content(monkeypatch):
    """A dict, list or plain object a function reads through a global was baked in at its
    first values (silently wrong after `CONFIG["scale"] = 5.0`); one cleave cannot compare
    sends the function through dynamo, which guards what it reads."""
    x = torch.randn(4, 8)
    f = cleave.compile(_reads_containers, verbose=False)
    _close(f(x), _reads_containers(x))
    monkeypatch.setitem(CONFIG, "scale", 5.0)
    _close(f(x), _reads_containers(x))
    monkeypatch.setattr(SETTINGS, "scale", 4.0)
    _close(f(x), _reads_containers(x))
    try:
        STEPS[0] = 3.0  # a list changed in place
        _close(f(x), _reads_containers(x))
    finally:
        STEPS[:] = [2.0]
    assert f.stats["recaptures"] == 3 and f.capture_error is None

    g = cleave.compile(_reads_an_opaque_object, verbose=False)
    _close(g(x), _reads_an_opaque_object(x))
    monkeypatch.setattr(OPAQUE.inner, "scale", 6.0)
    _close(g(x), _reads_an_opaque_object(x))
    assert "OPAQUE" in g.capture_error


def test_attributes_of_a_users_python_module_are_guarded(tmp_path, monkeypatch):
    """`x * settings.SCALE` with `settings` a module of the user's kept its first value
    after `settings.SCALE = 5.0`."""
    (tmp_path / "cleave_probe_settings.py").write_text("SCALE = 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import cleave_probe_settings as settings

    def scaled(x):
        return (x * settings.SCALE).sum(-1)

    x = torch.randn(4, 8)
    f = cleave.compile(scaled, verbose=False)
    _close(f(x), scaled(x))
    monkeypatch.setattr(settings, "SCALE", 5.0)
    _close(f(x), scaled(x))
    assert f.stats["recaptures"] == 1


FEATURES = []


def _collects(x):
    y = (x * 2).sum(-1)
    FEATURES.append(y)
    return y + 1


def test_a_function_appending_to_a_global_list_runs_through_dynamo():
    """The capture's trace appended a fake tensor to the user's list, and later calls
    appended nothing; the list now gets each call's tensor, as in eager."""
    x = torch.randn(4, 8)
    f = cleave.compile(_collects, verbose=False)
    try:
        _close(f(x), _collects(x))
        _close(f(x + 1), _collects(x + 1))
        assert [type(t) for t in FEATURES] == [torch.Tensor] * 4
        _close(FEATURES[0], FEATURES[1])
        _close(FEATURES[2], FEATURES[3])
        assert "FEATURES" in f.capture_error
    finally:
        FEATURES.clear()


def test_the_globals_of_a_user_modules_function_it_calls_are_guarded():
    """`settings.helper(x)` reads the module's SCALE: changed, the result follows (it
    kept the first capture's scale: the helper was not looked into)."""
    import types

    settings = types.ModuleType("settings_of_a_user")
    exec("SCALE = 2.0\ndef helper(x):\n    return x * SCALE\n", vars(settings))
    f = cleave.compile(lambda x: settings.helper(x) + 1)
    x = torch.randn(5)
    torch.testing.assert_close(f(x), x * 2 + 1)
    settings.SCALE = 5.0
    torch.testing.assert_close(f(x), x * 5 + 1)


# -- session 33's probes: changes no version counter tells, and objects the guards copied --
SCALE_T = torch.tensor([0.5])
HEAD = nn.Linear(3, 2)
HEAD.logit_scale = nn.Parameter(torch.tensor(2.0))


def _reads_one_element_tensors(x):
    return HEAD(x) * HEAD.logit_scale.exp() + x.sum(-1, keepdim=True) * SCALE_T


def test_one_element_tensors_changed_without_a_version_are_read_at_each_call():
    """They were baked into the graph as numbers under a version guard: `.data` writes
    (CLIP's `logit_scale.data.clamp_`), numpy writes and inference tensors bump no version,
    and the first value was served."""
    x = torch.randn(4, 3)
    f = cleave.compile(_reads_one_element_tensors, verbose=False)
    saved = SCALE_T.clone(), HEAD.logit_scale.detach().clone()
    try:
        with torch.no_grad():
            _close(f(x), _reads_one_element_tensors(x))
            HEAD.logit_scale.data.clamp_(0, 1.0)
            _close(f(x), _reads_one_element_tensors(x))
            SCALE_T.data.mul_(8)
            _close(f(x), _reads_one_element_tensors(x))
            SCALE_T.numpy()[0] = -3.0
            _close(f(x), _reads_one_element_tensors(x))
    finally:
        SCALE_T.data.copy_(saved[0])
        HEAD.logit_scale.data.copy_(saved[1])
    assert f.capture_error is None


with torch.inference_mode():
    INFERENCE_T = torch.tensor(2.0)


def _reads_an_inference_tensor(x):
    return x * INFERENCE_T


def test_a_one_element_inference_tensor_changed_in_place_is_read_at_each_call():
    x = torch.randn(5)
    f = cleave.compile(_reads_an_inference_tensor, verbose=False)
    _close(f(x), _reads_an_inference_tensor(x))
    with torch.inference_mode():
        INFERENCE_T.mul_(8)
    _close(f(x), _reads_an_inference_tensor(x))


Cfg = collections.namedtuple("Cfg", "scale bias")
NAMED = Cfg(2.0, 1.0)
NESTED = {"cfg": Cfg(3.0, 0.5), "order": collections.OrderedDict(a=2.0)}
SHAPE = torch.Size([2, 3])


def _reads_named_tuples(x):
    y = x * NAMED.scale + NAMED.bias + NESTED["cfg"].scale * NESTED["order"]["a"]
    return y.reshape(-1, *SHAPE[1:])


def test_named_tuples_and_dict_subclasses_in_globals_are_read_and_left_as_they_are():
    """Their guards copied them as plain tuples and dicts: the first call raised
    (AttributeError, `vars()` of a tuple), put plain tuples back into the user's dict, and
    an OrderedDict that was only read was taken for one the trace changed."""
    x = torch.randn(4, 3)
    f = cleave.compile(_reads_named_tuples, verbose=False)
    _close(f(x), _reads_named_tuples(x))
    assert type(NESTED["cfg"]) is Cfg and type(NESTED["order"]) is collections.OrderedDict
    assert f.capture_error is None


def test_a_submodules_class_swapped_is_a_new_capture():
    class Sub(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 4)

        def forward(self, x):
            return self.lin(x) * 3

    class Faster(Sub):
        def forward(self, x):
            return self.lin(x) * 11

    m = nn.Sequential(Sub(), nn.ReLU())
    _follows(m, m, torch.randn(3, 5), lambda: setattr(m[0], "__class__", Faster))


BACKBONE = nn.Linear(4, 4).requires_grad_(False)


def _features(x):
    return BACKBONE(x).relu()


def test_unfreezing_a_global_modules_parameters_is_seen():
    """They are held as constants, which the autograd check does not read: after
    `requires_grad_(True)` the compiled result had no grad and the backbone got none."""
    f = cleave.compile(_features, verbose=False)
    x = torch.randn(3, 4)
    assert not f(x).requires_grad
    BACKBONE.requires_grad_(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the eager fallback under autograd says so
            f(x).sum().backward()
        assert BACKBONE.weight.grad is not None
    finally:
        BACKBONE.requires_grad_(False)


def test_a_read_through_sys_modules_runs_through_dynamo(tmp_path, monkeypatch):
    """`sys.modules["settings"].SCALE` kept its first value: sys is a library, whose
    dict's modules the guards did not follow."""
    import sys

    (tmp_path / "cleave_probe_registry.py").write_text("SCALE = 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import cleave_probe_registry as settings

    def scaled(x):
        return x * sys.modules["cleave_probe_registry"].SCALE

    f = cleave.compile(scaled, verbose=False)
    x = torch.randn(3)
    _close(f(x), scaled(x))
    monkeypatch.setattr(settings, "SCALE", 5.0)
    _close(f(x), scaled(x))
    assert "sys.modules" in f.capture_error


class _ExtraIfAny(nn.Module):
    """Adds its buffer `extra` once it has one: registered later, or set from None."""

    def __init__(self, registered: bool):
        super().__init__()
        if registered:
            self.register_buffer("extra", None)

    def forward(self, x):
        return x * 2 + self.extra if getattr(self, "extra", None) is not None else x * 2


class _SumOfParameters(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(5), requires_grad=False)

    def forward(self, x):
        for q in self.parameters():
            x = x + q
        return x


class _HoldsExtraIfAny(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _ExtraIfAny(registered=False)

    def forward(self, x):
        return self.inner(x) - 1


@pytest.mark.parametrize("make, change", [
    (lambda: _ExtraIfAny(registered=False), lambda m: m.register_buffer("extra", torch.full((5,), 3.0))),
    (lambda: _ExtraIfAny(registered=True), lambda m: setattr(m, "extra", torch.full((5,), 3.0))),
    (_SumOfParameters, lambda m: m.register_parameter("q", nn.Parameter(torch.full((5,), 4.0), requires_grad=False))),
    (_HoldsExtraIfAny, lambda m: m.inner.register_buffer("extra", torch.full((5,), 3.0)))],
    ids=["buffer_registered", "buffer_set_from_none", "parameter_registered", "submodule_buffer_registered"])
def test_parameters_and_buffers_added_after_the_capture_are_a_new_capture(make, change):
    # the compiled module's own tensors are read at each call, but only those it had: the
    # old graph ran on, 2 to 6 off, without a warning
    m = make()
    _follows(m, m, torch.randn(3, 5), lambda: change(m))


def test_a_replaced_class_forward_is_seen_through_dynamos_graphs():
    """A module cleave.compile runs through dynamo's graphs (a SimpleNamespace attribute
    sends it there) is called from a closure, and dynamo guards no class forward reached
    so: `M.forward = ...` after the first call ran the old forward on."""
    import types

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.cfg = types.SimpleNamespace(k=2.0)

        def forward(self, x):
            return self.lin(x) * self.cfg.k

    m, x = M(), torch.randn(3, 4)
    compiled = cleave.compile(m)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(compiled(x), m(x))
        M.forward = lambda self, x: self.lin(x) - 1
        torch.testing.assert_close(compiled(x), m.lin(x) - 1)
