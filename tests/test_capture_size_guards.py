"""A Python branch on a dynamic size, in a function cleave.compile captures whole.

torch.export traces a dynamic size n as n >= 2 and decides `n == 1` or `n == 0` there
without a guard; a parity test is a guard cleave did not read. A call whose sizes take
another branch than the traced one is captured again (an extent of 0 or 1 static, as
torch traces those as 2), as dynamo compiles each branch once; a function without such a
branch is still captured once and serves every size.
"""
import math
import re
import warnings

import pytest
import torch

import cleave
from cleave.frontends.errors import CaptureError
from cleave.ir import BindingError


def pool(h):  # max-pool a variable number of items; none pools to zeros
    if h.shape[0] == 0:
        return h.new_zeros(h.shape[1:])
    return h.amax(0)


def step(x, w):  # one token (decode) or a prompt (prefill)
    if x.shape[0] == 1:
        return x @ w
    return (x @ w).softmax(0)


def prompt(x, w):
    if x.shape[0] > 1:
        return (x @ w).softmax(0)
    return x @ w


def center(x):  # odd length: minus the middle element; even: minus the mean of the two
    n = x.shape[-1]
    if n % 2:
        return x - x[..., n // 2:n // 2 + 1]
    return x - (x[..., n // 2 - 1:n // 2] + x[..., n // 2:n // 2 + 1]) / 2


def quads(x):  # another path for whole groups of four rows
    if x.shape[0] % 4 == 0:
        return x.tanh()
    return x * 2


def plain(x, w):
    return (x @ w).softmax(0)


W = torch.randn(3, 2, generator=torch.Generator().manual_seed(1))
CASES = {  # fn, dynamic, example args at extent n, (extent of the first call, later extents)
    "pool": (pool, {"h": {0: "n"}}, lambda n: (torch.randn(n, 3),), [(5, 0, 1, 2, 3), (0, 5, 1, 0)]),
    "step": (step, {"x": {0: "n"}}, lambda n: (torch.randn(n, 3), W), [(4, 1, 0, 2, 5), (1, 4, 1, 3)]),
    "prompt": (prompt, {"x": {0: "n"}}, lambda n: (torch.randn(n, 3), W), [(3, 1, 0, 2, 6)]),
    "center": (center, {"x": {1: "n"}}, lambda n: (torch.arange(2.0 * n).view(2, n),), [(7, 8, 1, 0, 2, 6, 9)]),
    "quads": (quads, {"x": {0: "n"}}, lambda n: (torch.randn(n, 3),), [(8, 0, 1, 2, 4, 5, 12)]),
}


@pytest.mark.parametrize("name, sizes", [(name, sizes) for name, case in CASES.items() for sizes in case[3]])
def test_a_branch_on_a_dynamic_size_matches_eager_at_every_size(monkeypatch, tmp_path, name, sizes):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    fn, dynamic, example, _ = CASES[name]
    f = cleave.compile(fn, dynamic=dynamic, verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in sizes:
            args = example(n)
            torch.testing.assert_close(f(*args), fn(*args), msg=f"{name} at n={n} (calls {sizes})")
    assert not [w for w in caught if "runs eagerly" in str(w.message)], [str(w.message) for w in caught]
    # a capture per branch taken, sizes 0 and 1 perhaps one each
    assert f.stats["failed"] == 0 and 2 <= f.stats["operators"] <= len(set(sizes)), f.stats
    assert sum(op.stats["calls"] for op in f.operators) == len(sizes)


@pytest.mark.parametrize("fn, dynamic, args, outside, inside", [
    (pool, {"h": {0: "n"}}, (torch.randn(5, 3),), [0], [1, 2, 7]),
    (step, {"x": {0: "n"}}, (torch.randn(4, 3), W), [1], [0, 2, 7]),
    (step, {"x": {0: "n"}}, (torch.randn(1, 3), W), [1], [0, 2, 7]),  # traced at 2
    (prompt, {"x": {0: "n"}}, (torch.randn(3, 3), W), [0, 1], [2, 9]),
    (center, {"x": {1: "n"}}, (torch.randn(2, 7),), [2, 8], [1, 3, 9]),
    (quads, {"x": {0: "n"}}, (torch.randn(8, 3),), [1, 2, 6], [0, 4, 12]),
])
def test_the_graph_holds_only_where_the_codes_decision_does(fn, dynamic, args, outside, inside):
    graph = cleave.capture(fn, *args, dynamic=dynamic)
    for n in inside:
        graph.check({"n": n})
    for n in outside:
        with pytest.raises(BindingError, match="the traced code's"):
            graph.check({"n": n})


def test_a_function_without_such_a_branch_is_captured_once_for_every_size(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    f = cleave.compile(plain, dynamic={"x": {0: "n"}}, verbose=False)
    sizes = (3, 0, 1, 2, 5, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager run would warn
        for n in sizes:
            x = torch.randn(n, 3)
            torch.testing.assert_close(f(x, W), plain(x, W))
    st = f.stats
    assert st["operators"] == 1 and st["searches"] == 1 and st["compiles"] == 1 and st["failed"] == 0, st
    assert f.recaptures == 0 and f.operators[0].stats["calls"] == len(sizes), f.operators[0].stats
    assert cleave.capture(plain, torch.randn(3, 3), W, dynamic={"x": {0: "n"}}).constraints == []


def test_a_shape_undefined_at_an_empty_size_runs_eagerly_with_its_reason():
    """reshape(-1, 4, 3) over n leaves a divisor of n in the graph's shapes: at n = 0 they
    divide by zero, which the binding reports (it raised a TypeError from sympy)."""
    graph = cleave.capture(triples, torch.randn(24), dynamic={"x": {0: "n"}})
    with pytest.raises(BindingError, match="division by zero"):
        graph.check({"n": 0})
    f = cleave.compile(triples, dynamic={"x": {0: "n"}}, verbose=False)
    for n in (24, 0, 36):
        x = torch.randn(n)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            torch.testing.assert_close(f(x), triples(x))


def triples(x):
    return x.reshape(-1, 4, 3).sum(-1)


def odd_positions(x):
    return x.sum(-1) * torch.arange(2 * x.shape[0] - 1)[::2].float()


def test_an_arange_eager_refuses_at_a_size_raises_eagers_error():
    """arange(2n - 1) at n = 0: eager raises; the compiled function returned an empty
    tensor. The graph keeps the length's sign as a constraint: that call runs eagerly."""
    f = cleave.compile(odd_positions, dynamic={"x": {0: "n"}}, verbose=False)
    torch.testing.assert_close(f(torch.ones(3, 2)), odd_positions(torch.ones(3, 2)))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="inconsistent with step sign"):
            f(torch.ones(0, 2))
    assert any("arange" in str(w.message) for w in said)


def scaled_by_root_of_rows(x):
    return x * math.sqrt(x.shape[0] * 1e6)


def test_a_float_computed_from_a_dynamic_size_follows_the_size():
    """torch.export traces math.sqrt(n * 1e6) as the number it was at the example, under a
    guard cleave did not read: every n was scaled by sqrt(4e6). Such a function runs
    through dynamo's graphs, which guard it."""
    with pytest.raises(CaptureError, match="float from a dynamic size"):
        cleave.capture(scaled_by_root_of_rows, torch.randn(4, 3), dynamic={"x": {0: "n"}})
    f = cleave.compile(scaled_by_root_of_rows, dynamic={"x": {0: "n"}}, verbose=False)
    for n in (4, 9, 16):
        x = torch.randn(n, 3)
        torch.testing.assert_close(f(x), scaled_by_root_of_rows(x))


def scaled_by_half_steps(x):
    return x * torch.arange(0, x.shape[0], 0.5)[: x.shape[0]].unsqueeze(1)


def test_a_size_through_a_float_step_compiles_at_every_size():
    """arange(0, n, 0.5) is ceiling(2.0 * n) long: the float reached the kernels' index
    expressions ("cannot print index expression 2.000") and the region past the graph
    break ran eagerly from its second size on. Sizes are read in exact rationals."""
    f = cleave.compile(scaled_by_half_steps, verbose=False)
    for n in (5, 7, 12):
        x = torch.randn(n, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.testing.assert_close(f(x), scaled_by_half_steps(x))
        assert not [w for w in caught if "could not compile" in str(w.message)], [str(w.message) for w in caught]


def residue(x):  # a branch for each residue of the row count modulo 12
    for r in range(12):
        if x.shape[0] % 12 == r:
            return x + r


def test_captures_of_one_signature_are_bounded():
    """Each residue is a branch of its own: MAX_CAPTURES of them are captured, and calls
    taking any other run eagerly, saying why."""
    from cleave.runtime.compile import MAX_CAPTURES

    f = cleave.compile(residue, dynamic={"x": {0: "n"}}, verbose=False)
    eager_at = []
    for n in range(2, 14):
        x = torch.randn(n, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.testing.assert_close(f(x), residue(x))
        if any("do not fit the compiled graph" in str(w.message) for w in caught):
            eager_at.append(n)
    assert f.stats["operators"] == MAX_CAPTURES and eager_at == list(range(2 + MAX_CAPTURES, 14)), (f.stats, eager_at)


def first_pair_doubled(x):
    return x.split(2, 0)[0] * 2


def test_a_branch_that_only_captures_static_is_captured_static():
    """x.split(2) over a dynamic axis: export pins the axis at an odd extent and keeps it
    dynamic at an even one, where cleave cannot take a split whose pieces change in
    number with it. Each extent is then a static capture (it ran eagerly at every extent
    but the first, said as "inputs do not fit the compiled graph")."""
    f = cleave.compile(first_pair_doubled, dynamic="all", verbose=False)
    for n in (5, 4, 6, 7, 4):
        x = torch.randn(n, 3)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert torch.equal(f(x), first_pair_doubled(x))
    assert f.capture_error is None and f.stats["operators"] == 4 and f.stats["graph_breaks"] == 0, f.stats


def added(a, b):
    return (a + b).relu()


def test_two_dynamic_axes_one_of_which_broadcasts_get_a_capture_each():
    """torch traces m and n of `a + b` as one size (both 2 or more); a call where one is 1
    broadcasts, and is captured with that axis static (it ran eagerly, naming one symbol
    for both)."""
    f = cleave.compile(added, dynamic={"a": {0: "m"}, "b": {0: "n"}}, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager run would warn
        for m, n in ((5, 5), (1, 5), (5, 1), (7, 7), (1, 1)):
            a, b = torch.randn(m, 3), torch.randn(n, 3)
            torch.testing.assert_close(f(a, b), added(a, b))
    assert f.stats["operators"] == 3 and f.stats["failed"] == 0, f.stats


def one_row_fast_path(x, w):  # a fast path at one row whose code fixes the width
    if x.shape[0] == 1:
        return x.reshape(x.shape[1], 6) @ w
    return (x @ w).sum(0)


def test_a_branch_taken_again_under_dynamic_all_keeps_the_axes_its_code_fixes_static():
    """Under dynamic="all" the first capture lets torch keep an axis static where the code
    fixes it; the capture of another branch (at one row) named every axis dynamic, torch
    refused the one that branch fixes, and each such call ran eagerly (nn.TransformerEncoderLayer
    at batch 1, whose fast path reads its width)."""
    f = cleave.compile(one_row_fast_path, dynamic="all", verbose=False)
    w = torch.randn(6, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager run would warn
        for rows, length in ((3, 5), (1, 5), (1, 7), (2, 7)):
            x = torch.randn(rows, length, 6)
            torch.testing.assert_close(f(x, w), one_row_fast_path(x, w))
    assert f.stats["operators"] == 2 and f.stats["failed"] == 0, f.stats


def biased(x, y):
    return x * 2 + y


def test_a_broadcast_row_under_dynamic_all_is_captured_static():
    """A size-1 axis named dynamic is traced at 2, and `x[4, 8] + y[1, 8]` failed to trace
    there (4 against 2): the first call ran eagerly without a word, and the function
    went through dynamo for good. Under "all" such an axis is captured static, as torch
    keeps a 1; a call where it is not 1 is captured again."""
    f = cleave.compile(biased, dynamic="all", verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager run would warn
        for xs, ys in (((4, 8), (1, 8)), ((6, 9), (1, 9)), ((3, 5), (3, 5))):
            x, y = torch.randn(*xs), torch.randn(*ys)
            torch.testing.assert_close(f(x, y), biased(x, y))
            assert f.capture_error is None
    assert f.stats["operators"] == 2 and f.stats["searches"] == 2, f.stats


# -- sizes the code writes as numbers (session 33's probe) ----------------------------
def view_pairs(x):
    return x.view(-1, 2, 3).sum(1)


def patch_merge(x):
    return x.reshape(x.shape[0], x.shape[1] // 4, 4 * x.shape[2]).mean(1)


def unflatten_rows(x):
    return x.unflatten(0, (-1, 3)).sum(1)


@pytest.mark.parametrize("fn, dynamic, make, first, sizes", [
    (view_pairs, {"x": {0: "n"}}, lambda n: torch.randn(n, 3), 8, [3, 6, 5, 8]),
    (patch_merge, {"x": {1: "t"}}, lambda n: torch.randn(2, n, 3), 8, [5, 6, 12, 7]),
    (unflatten_rows, {"x": {0: "n"}}, lambda n: torch.randn(n, 2), 6, [4, 9, 5]),
])
def test_a_size_written_as_a_number_holds_at_every_call(fn, dynamic, make, first, sizes):
    """torch writes the 2 of view(-1, 2, 3) as floor(n / floor(n / 2)): at n = 3 that is 3,
    and cleave returned a (1, 3) tensor where eager raises."""
    f = cleave.compile(fn, dynamic=dynamic, verbose=False)
    x = make(first)
    torch.testing.assert_close(f(x), fn(x))
    for n in sizes:
        x = make(n)
        try:
            want = fn(x)
        except RuntimeError as err:
            with pytest.raises(RuntimeError, match=re.escape(str(err)[:40])):
                f(x)
            continue
        torch.testing.assert_close(f(x), want)


def first_half_at_least_one(x):
    return x[..., :max(1, x.shape[-1] // 2)] * 2.0


def rolled_by_half_at_least_one(x):
    return x.roll(max(1, x.shape[0] // 2), 0) + 1.0


@pytest.mark.parametrize("fn", [first_half_at_least_one, rolled_by_half_at_least_one])
def test_a_size_through_max_compiles_at_every_size(fn):
    """max(1, n // 2) is Max(1, floor(n/2)) in the kernels' index expressions: it ran
    eagerly ("cannot print index expression"). It prints as arithmetic that the kernels'
    index tensors, their scalar arguments and the host's grid all compute."""
    from cleave.runtime import backend

    ctx = backend.reset()
    torch._dynamo.reset()
    f = torch.compile(fn, backend="cleave", dynamic=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for shape in ((3, 5), (4, 8), (5, 3), (2, 2), (7, 9)):  # Max takes 1 at 2 and 3
            x = torch.randn(*shape)
            assert torch.equal(f(x), fn(x)), shape
    assert ctx.eager_regions == 0 and ctx.stats()["failed"] == 0, ctx.stats()


def test_max_and_min_print_as_the_integers_they_are():
    import sympy

    from cleave.scheduler.exprs import code, evaluate, value

    n, m = sympy.Symbol("n", positive=True, integer=True), sympy.Symbol("m", positive=True, integer=True)
    for e in (sympy.Max(1, sympy.floor(n / 2)), sympy.Min(n, m, 4), sympy.Max(n - 3, 0) + 2 * m):
        for nv in range(1, 8):
            env = {"n": nv, "m": 3}
            want = int(e.subs({n: nv, m: 3}))
            assert evaluate(code(e), env) == want and value(e, env) == want, (e, nv)


def last_half(x):
    return x[-(x.shape[0] // 2):] * 2


def test_a_guard_from_the_end_reads_back_and_binds_every_candidate():
    """`x[-(n // 2):]` holds for n >= 2 only (at n = 1, x[-0:] is every row): torch
    guards it as `-floor(n/2) <= -1`. Its text form did not read back (a negative dim),
    so a plan of the graph failed to launch at any n, and the search's candidates,
    rebuilt from the e-graph without the graph's constraints, served n = 1 with no rows."""
    from cleave.runtime.launch import launch

    g = cleave.capture(last_half, torch.randn(6, 3), dynamic={"x": {0: "n"}})
    assert cleave.parse_graph(g.text()).text() == g.text()
    x = torch.randn(7, 3)
    (got,) = launch(cleave.schedule(g, {"n": 6}, dynamic={"n"})[0], {"x": x})
    torch.testing.assert_close(got, last_half(x))
    best = cleave.search(g, progress=False).best
    assert {str(c) for c in g.constraints} <= {str(c) for c in best.graph.constraints}
    plan = cleave.schedule(best, {"n": 6}, dynamic={"n"})[0]
    with pytest.raises(BindingError, match="fails for n=1"):
        launch(plan, {"x": torch.randn(1, 3)})

