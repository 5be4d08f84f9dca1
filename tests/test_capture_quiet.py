"""A branch on a tensor's value fails the capture (the function runs through dynamo):
torch.export printed its partial graph to stderr, twice, before cleave said why in one
line (`capture_error`)."""
import torch

import cleave


def branch_on_value(x):
    if x.sum() > 0:
        return x * 2
    return x - 1


def test_failed_capture_prints_no_graph(capsys):
    f = cleave.compile(branch_on_value)
    for x in (torch.ones(3, 4), -torch.ones(3, 4)):
        assert torch.equal(f(x), branch_on_value(x))
    err = capsys.readouterr().err
    assert "def forward" not in err and "Unable to find user code" not in err
    assert "data-dependent" in f.capture_error
