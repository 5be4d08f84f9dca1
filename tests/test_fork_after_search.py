"""A process forked after its parent searched (a server's workers after a warm-up)
searches without hanging: freeing an e-graph waited for good on egglog's thread pool,
which stayed in the parent. The child keeps its e-graphs instead, and says so."""
import os
import sys
import time

import pytest
import torch

import cleave


def layer(x, w):
    return torch.tanh(x @ w) * 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_searches_a_new_shape(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))  # no operator from an earlier run: both search
    w = torch.randn(8, 4)
    f = cleave.compile(layer, verbose=False)
    with torch.no_grad():
        f(torch.randn(5, 8), w)  # the parent's search starts the pool
    assert f.stats["searches"] == 1
    pid = os.fork()
    if pid == 0:  # the child: a new static shape, so a new search
        code = 1
        try:
            x = torch.randn(3, 8)
            with pytest.warns(UserWarning, match="forked after its parent searched"), torch.no_grad():
                torch.testing.assert_close(f(x, w), layer(x, w))
            code = 0
        finally:
            sys.stdout.flush()
            os._exit(code)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.2)
    os.kill(pid, 9)
    pytest.fail("the forked child's search hung")
