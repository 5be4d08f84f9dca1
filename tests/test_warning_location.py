"""cleave's warnings name the user's line (the call of the compiled function), not a
line of cleave's runtime (compile.py:101, backend.py:50)."""
import warnings

import torch

import cleave


def test_eager_and_graph_break_warnings_name_the_callers_line():
    lin = torch.nn.Linear(7, 7)
    f = cleave.compile(lin)
    g = cleave.compile(lambda x: torch.sort(x, -1).values)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f(torch.randn(3, 7))  # parameters require grad: eager
        g(torch.randn(3, 7))  # sort: a graph break
    ours = [w for w in caught if str(w.message).startswith("cleave:")]
    assert len(ours) >= 2
    assert all(w.filename == __file__ for w in ours), [(w.filename, w.lineno) for w in ours]
