"""torch.export runs forward on the tensors it holds as constants (a module's tensor
attribute that is no buffer, a global or closure tensor), so an in-place change of one
happened in the capture's trace and again when the call ran: `self.count.add_(1)` left
the count a step ahead for good, and every output scaled by a global step after it was
off. The trace's changes are undone (runtime/guards.py: TensorContents)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave

STEP = torch.zeros(())


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.count = torch.zeros((), dtype=torch.long)  # a plain attribute, no buffer

    def forward(self, x):
        self.count.add_(1)
        return self.fc(x) + self.count


class Stepped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        STEP.add_(1)
        return self.fc(x) * STEP


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize("entry", ["cleave", "backend"])
def test_an_attribute_counter_counts_each_call_once(entry):
    torch.manual_seed(0)
    m, twin = Counter().eval(), Counter().eval()
    twin.load_state_dict(m.state_dict())
    f = cleave.compile(m) if entry == "cleave" else torch.compile(m, backend="cleave")
    with torch.no_grad():
        for n in range(1, 4):
            x = torch.randn(2, 4)
            torch.testing.assert_close(f(x), twin(x))
            assert m.count.item() == n == twin.count.item()


@pytest.mark.parametrize("entry", ["cleave", "backend"])
def test_a_global_step_counts_each_call_once(entry):
    torch.manual_seed(0)
    m = Stepped().eval()
    f = cleave.compile(m) if entry == "cleave" else torch.compile(m, backend="cleave")
    STEP.zero_()
    with torch.no_grad():
        for n in range(1, 4):
            x = torch.randn(2, 4)
            got = f(x)
            assert STEP.item() == n
            torch.testing.assert_close(got, m.fc(x) * n)


def test_a_global_made_under_inference_mode_is_read():
    """Such a tensor has no version counter: reading it raised from the guards."""
    with torch.inference_mode():
        table = torch.arange(3.0)

    def shifted(x):
        return x * table + 1

    f = cleave.compile(shifted)
    x = torch.randn(3)
    torch.testing.assert_close(f(x), shifted(x))
    with torch.inference_mode():
        torch.testing.assert_close(f(torch.ones(3)), shifted(torch.ones(3)))
