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


def _copied_in(x, index, rows):
    x[index] = rows  # a write into an input: a graph break (README, *Writes at indices*)
    return x * 2


def test_an_op_a_decomposition_made_names_what_the_user_called():
    """The warning named `aten.index_put` alone; the user wrote `x[index] = rows`."""
    x, rows = torch.zeros(5, 3), torch.ones(2, 3)
    index = torch.tensor([0, 3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(_copied_in, backend="cleave")(x, index, rows)
    said = [str(w.message) for w in caught if "is not supported" in str(w.message)]
    assert any("aten.index_put.default (of setitem)" in m for m in said), said
    assert torch.equal(out, _copied_in(torch.zeros(5, 3), index, rows))


def _dropped(x):
    return torch.nn.functional.dropout(x, 0.5, training=True) * 2, torch.randint(0, 10, (3,))


def test_random_ops_draw_as_eager_does():
    """Dropout decomposed into rand_like drew in another order than torch's kernel, and
    two regions run eagerly were reordered (a randint after a dropout ran first): under
    a seed, every random value differed from eager's."""
    f = torch.compile(_dropped, backend="cleave")
    x = torch.ones(4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the graph breaks at the random ops
        torch.manual_seed(123)
        got = f(x)
    torch.manual_seed(123)
    want = _dropped(x)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), (got, want)


def test_a_library_modules_op_is_not_placed_in_cleaves_own_code():
    """cleave.compile calls a module through a wrapper of its own: a graph break inside
    torch.nn's Embedding named that wrapper's line as the op's source."""
    torch._dynamo.reset()  # Embedding.forward compiled by an earlier test would not warn again
    embedding = torch.nn.Embedding(10, 4, max_norm=1.0)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        cleave.compile(embedding)(torch.tensor([1, 2, 3]))
    said = [str(w.message) for w in caught if "embedding_renorm" in str(w.message)]
    assert said and not any("cleave/" in m or "cleave\\" in m for m in said), said


class _Sorting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).sort(-1).values * 2


def _widened(x):
    return x.float() * 2


def _rounded(x, i8):
    return i8.double().float() * x


def _sorted_between(x, w):
    y = (x * w).exp()
    return (y.sort(-1).values * 2).softmax(-1)


def test_backend_warnings_name_the_users_function_and_arguments():
    """The backend's warnings named its regions by a process-wide count (`frame6`), the
    inputs by AOTAutograd's placeholders (`arg0_1`), the op a decomposition made by
    dynamo's node (`of float_1`), and a split graph's part by the line torch.fx generated
    (`<eval_with_key>.1:5`)."""
    import torch.autograd.forward_ad as fwad

    from cleave.runtime import backend

    torch._dynamo.reset()
    backend.reset()  # each op is said once a context: another test's sort was said there
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        torch.compile(_Sorting(), backend="cleave")(x)
        torch.compile(_widened, backend="cleave")(torch.ones(4, dtype=torch.uint16))
        torch.compile(_rounded, backend="cleave")(x, torch.ones(3, 4, dtype=torch.int8))
        sorted_between = torch.compile(_sorted_between, backend="cleave")
        sorted_between(x, x)
        with fwad.dual_level():
            sorted_between(fwad.make_dual(x, torch.ones_like(x)), x)
    said = [str(w.message) for w in caught if str(w.message).startswith("cleave:")]
    assert any("aten.sort.default" in m and "runs eagerly in _Sorting.forward (graph break)" in m for m in said), said
    assert any("capture of _widened (cannot capture input 'x': dtype torch.uint16" in m for m in said), said
    assert any("aten._to_copy.default (of float) on float64" in m for m in said), said
    assert any(m.startswith("cleave: part of _sorted_between (from ") and "forward-mode AD" in m for m in said), said
    assert not any(internal in m for m in said for internal in ("frame", "arg0_1", "float_1")), said
    assert all(w.filename == __file__ for w in caught if str(w.message).startswith("cleave:")), \
        [(w.filename, w.lineno) for w in caught]


def test_a_torch_module_compiled_itself_is_named_after_its_class_and_each_module_warns():
    """torch.compile of a module torch defines runs in a wrapper of dynamo's: the warning
    said `runs eagerly in wrap_inline.<locals>.inner`. A second compiled function with
    the same unsupported op warned nothing (one warning per op and reason a process)."""
    torch._dynamo.reset()
    lin = torch.nn.Linear(4, 3).double()

    def scaled(y):
        return torch.nn.functional.linear(y, lin.weight) * 2

    y = torch.randn(2, 4, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        torch.compile(lin, backend="cleave")(y)
        torch.compile(scaled, backend="cleave")(y)
    said = [str(w.message) for w in caught if "is not supported" in str(w.message)]
    assert any("runs eagerly in Linear.forward" in m for m in said), said
    assert any("runs eagerly in test_a_torch_module_compiled_itself" in m and "scaled" in m for m in said), said
    assert not any("wrap_inline" in m for m in said), said


def _scaled(a, n):
    return a * n


def test_explain_names_the_users_line_and_arguments():
    """Through explain, the warning that an int argument sends the function through
    dynamo named explain.py's line, and the report named the input `arg0_1`."""
    f = cleave.compile(_scaled)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = cleave.explain(f, torch.randn(3, 8), 3)
    ours = [w for w in caught if str(w.message).startswith("cleave")]
    assert ours and all(w.filename == __file__ for w in ours), [(w.filename, w.lineno) for w in ours]
    shapes = next(line for line in str(report).splitlines() if line.startswith("shapes: "))
    assert shapes.startswith("shapes: a (") and "=[3, 8]" in shapes, shapes


def test_a_topk_of_a_dynamic_k_says_why_it_breaks():
    """It said "k must be a Python int" of the user's int, which dynamo had made a symbol."""
    f = torch.compile(lambda x, k: x.topk(k).values * 2, backend="cleave", dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in (2, 3):
            x = torch.randn(3, 7)
            torch.testing.assert_close(f(x, k), x.topk(k).values * 2)
    said = [str(w.message) for w in caught if "topk" in str(w.message)]
    assert said and all("k is a dynamic size" in m for m in said), said
