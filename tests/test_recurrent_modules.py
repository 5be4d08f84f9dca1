"""A model calling nn.GRU or nn.LSTM: torch.compile does not trace recurrent modules,
so the function calling one runs eagerly; cleave.compile said nothing (its stats showed
no operator, and capture_error blamed GRU._flat_weight_refs)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave


class RecurrentHead(torch.nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(8, 8, batch_first=True)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        out, _ = self.rnn(x)
        return torch.tanh(self.fc(out[:, -1])) * 2


@pytest.mark.parametrize("cell", [torch.nn.GRU, torch.nn.LSTM])
def test_a_recurrent_module_is_named_in_a_warning(cell, monkeypatch, tmp_path):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    model = RecurrentHead(cell).eval()
    compiled = cleave.compile(model)
    x = torch.randn(2, 5, 8)
    with torch.no_grad(), pytest.warns(UserWarning, match=rf"calls rnn \(a {cell.__name__}\), a recurrent module"):
        got = compiled(x)
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))
