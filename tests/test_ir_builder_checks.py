"""The IR builder refuses what torch refuses instead of building another graph: axes out
of range, dim symbols and buffer names the kernels cannot take, dims it cannot read;
slices count from the end as Python's do; the interpreter keeps each node's integer type."""
import pytest
import sympy
import torch

import cleave
from cleave.frontends import CaptureError
from cleave.interpreter import interpret
from cleave.ir import Graph, ShapeError, parse_graph
from cleave.ir import dims as D
from cleave.runtime.launch import launch


def _node(shape=(3, 4), dtype="f32", name="a"):
    return Graph("g").input(name, shape, dtype)


# -- axes: torch's ranges, never wrapped modulo the rank -------------------------
@pytest.mark.parametrize("build, message", [
    (lambda a: a.sum(2), r"sum: axis 2 is out of range for operand 0 of rank 2 \(shape \[3, 4\]; expected -2..1\)"),
    (lambda a: a.max(-3), r"max: axis -3 is out of range .* rank 2"),
    (lambda a: a.min(2), r"min: axis 2 is out of range"),
    (lambda a: a.mean(5), r"mean: axis 5 is out of range"),
    (lambda a: a.transpose(0, 2), r"transpose: axis 2 is out of range"),
    (lambda a: a.unsqueeze(3), r"unsqueeze: axis 3 is out of range .* rank 2 .*expected -3..2"),
    (lambda a: a.unsqueeze(-4), r"unsqueeze: axis -4 is out of range"),
    (lambda a: a.split(2, "s"), r"split: axis 2 is out of range"),
    (lambda a: a.slice(-3, 0, 1), r"slice: axis -3 is out of range"),
    (lambda a: a.permute(2, 0), r"permute: axis 2 is out of range"),
    (lambda a: a[:, :, :], r"slice: 3 indices for operand 0 of rank 2"),
    (lambda a: a.sum(1.0), r"sum: axis 1.0 is not an int"),
])
def test_builder_axis_out_of_range_is_a_shape_error(build, message):
    with pytest.raises(ShapeError, match=message):
        build(_node())


def test_builder_axes_in_range_count_from_the_end_as_torch():
    a = _node()
    assert a.sum(-2).shape == (4,)
    assert [D.fmt(d) for d in a.unsqueeze(2).shape] == ["3", "4", "1"]
    assert [D.fmt(d) for d in a.unsqueeze(-3).shape] == ["1", "3", "4"]
    assert a.transpose(-1, 0).attrs["perm"] == (1, 0)


def test_a_rank_0_node_has_no_axis_to_reduce():
    with pytest.raises(ShapeError, match="sum: axis -1 is out of range .* a rank-0 node has no axis"):
        _node(()).sum()


# -- symbols and buffer names the kernels cannot take ----------------------------
@pytest.mark.parametrize("symbol, why", [("pid", "a name the generated kernels use"), ("tid0", "kernels use"),
                                         ("idx0", "kernels use"), ("v0", "kernels use"), ("x_ptr", "kernels use"),
                                         ("tl", "kernels use"), ("s_n", "kernels use"), ("if", "a Python keyword"),
                                         ("len", "a Python builtin")])
def test_a_dim_symbol_the_kernels_use_is_refused_where_the_input_is_declared(symbol, why):
    with pytest.raises(ShapeError, match=f"input 'x' dim 1: symbol '{symbol}' is .*{why}.*rename it"):
        Graph("g").input("x", ("m", symbol), "f32")


def test_a_kernel_name_inside_a_dim_expression_is_refused():
    with pytest.raises(ShapeError, match="input 'x' dim 0: symbol 'pid' is a name the generated kernels use"):
        Graph("g").input("x", ("2*pid",), "f32")


def test_parse_graph_refuses_a_kernel_name_as_a_symbol_naming_the_line():
    text = 'graph g {\n  %0 = input(name="x", shape=[pid,n], dtype=f32) : f32[pid,n]\n  return o=%0\n}\n'
    with pytest.raises(ShapeError, match="line 2: input 'x' dim 0: symbol 'pid' is a name the generated kernels use"):
        parse_graph(text)


def test_a_buffer_named_like_a_symbol_is_refused():
    # the launcher passes kernel arguments by name: input n of shape [m, n] got the int n
    g = Graph("g")
    a = g.input("n", ("m", "n"), "f32")
    with pytest.raises(ShapeError, match="input 'n' has the name of a dim symbol of the graph"):
        g.output(a.sum(-1), names=["o"])
    g = Graph("g")
    a = g.input("x", ("m", "n"), "f32")
    with pytest.raises(ShapeError, match="output 'm' has the name of a dim symbol of the graph"):
        g.output(a.sum(-1), names=["m"])


def test_an_unread_input_may_carry_its_own_symbol():
    # the torch.compile backend's int arguments: a [n] input named n that only binds n
    g = Graph("g")
    x = g.input("x", ("m",), "f32")
    g.input("m", ("m",), "bool")
    g.output(x.exp(), names=["o"])


def test_capture_all_axes_names_around_a_symbol_the_kernels_use():
    # an argument `s`: its axis is not `s_0`, which reads as a split count
    g = cleave.capture(lambda s, x: s, torch.randn(3), torch.randn(3), dynamic="all")
    assert g.inputs["s"].shape == (sympy.Symbol("dim_s_0", integer=True, positive=True),)


def test_an_argument_named_s_compiles_under_dynamic_all():
    """It went to dynamo's graphs for good, without a word: the capture refused `s_0`."""
    def f(x, s):
        return x * 2 + s

    compiled = cleave.compile(f, dynamic="all")
    for n in (5, 7, 5):
        a, b = torch.randn(3, n), torch.randn(3, n)
        torch.testing.assert_close(compiled(a, b), f(a, b))
    assert compiled.capture_error is None and len(compiled.operators) == 1


# -- the interpreter keeps each node's integer type ------------------------------
def test_interpreter_wraps_an_integer_sum_in_the_nodes_type():
    g = Graph("io")
    x = g.input("x", ("m", "n"), "i32")
    flags = g.input("flags", ("m", "n"), "bool")
    g.output(x.sum(-1), flags.sum(-1), x.cast("f32").sum(-1), names=["o", "count", "f"])
    values = torch.full((5, 7), 2**30, dtype=torch.int32)
    inputs = {"x": values, "flags": torch.ones(5, 7, dtype=torch.bool)}
    wrapped = torch.full((5,), 7 * 2**30 - 2**33, dtype=torch.int32)  # 7 * 2^30 in int32
    for compute in (None, torch.float64):  # f64 reference mode widens floats only
        o, count, f = interpret(g, inputs, compute_dtype=compute)
        assert o.dtype == torch.int32 and torch.equal(o, wrapped)
        assert count.dtype == torch.int64 and torch.equal(count, torch.full((5,), 7))
        assert f.dtype == (compute or torch.float32)
    kernel_graph = Graph("k")
    kernel_graph.output(kernel_graph.input("x", ("m", "n"), "i32").sum(-1), names=["o"])
    (kernel,) = launch(cleave.schedule(kernel_graph, {"m": 5, "n": 7})[0], {"x": values})
    assert torch.equal(kernel, wrapped)  # the reference agrees with the kernels


# -- capture: one symbol is one size ---------------------------------------------
def test_capture_refuses_one_symbol_on_axes_of_different_sizes():
    def f(q, k):
        return (q @ k.transpose(-1, -2)).softmax(-1)

    with pytest.raises(CaptureError, match=r"symbol 's' names input 'q' axis 1 \(size 5\) and input 'k' axis 1 "
                                           r"\(size 7\)"):
        cleave.capture(f, torch.randn(2, 5, 4), torch.randn(2, 7, 4), dynamic={"q": {1: "s"}, "k": {-2: "s"}})


# -- builder arguments ------------------------------------------------------------
@pytest.mark.parametrize("dim, message", [("3x", "input 'x' dim 0: cannot read a dimension from '3x'"),
                                          ("n m", "cannot read a dimension from 'n m'"),
                                          ("2.5", "cannot read a dimension from '2.5'"),
                                          ("-3", r"input 'x' dim 0: a dimension cannot be negative \('-3'\)"),
                                          (-3, r"a dimension cannot be negative \(-3\)")])
def test_an_unreadable_dim_is_a_shape_error_naming_it(dim, message):
    with pytest.raises(ShapeError, match=message):
        Graph("g").input("x", (dim,), "f32")


def test_input_shape_must_be_a_sequence():
    with pytest.raises(ShapeError, match="input 'x': shape must be a sequence of dims, not 'n'"):
        Graph("g").input("x", "n", "f32")


def test_output_with_more_names_than_nodes_says_how_many():
    g = Graph("g")
    x = g.input("x", (3,), "f32")
    with pytest.raises(ShapeError, match=r"output: 1 node\(s\) but 2 name\(s\) \(o, p\)"):
        g.output(x, names=["o", "p"])


@pytest.mark.parametrize("perm", [((1, 0),), ([1, 0],), (1, 0), (-1, 0)])
def test_permute_takes_a_tuple_or_varargs_as_torch(perm):
    assert [D.fmt(d) for d in _node().permute(*perm).shape] == ["4", "3"]


@pytest.mark.parametrize("index", [slice(-3, None), slice(-30, None), slice(1, -1), slice(-5, -2, 2), slice(5, 2),
                                   slice(2, 100), slice(10, None), slice(None, -8), slice(None, None, 3)])
@pytest.mark.parametrize("extent", [2, 7])
def test_slices_of_a_numeric_extent_follow_python(index, extent):
    g = Graph("g")
    x = torch.arange(extent, dtype=torch.float32)
    g.output(g.input("x", (extent,), "f32")[index], names=["o"])
    assert torch.equal(interpret(g, {"x": x})[0], x[index])


def test_a_negative_index_on_a_symbolic_extent_says_what_to_write():
    with pytest.raises(ShapeError, match=r"slice: start -3 counts from the end of axis 0, whose extent n is "
                                         r"symbolic; write it as an expression of the extent \(start='n-3', which "
                                         r"needs n >= 3\)"):
        _node(("n",))[-3:]
    g = Graph("g")
    g.output(g.input("x", ("n",), "f32")["n-3":], names=["o"])
    x = torch.arange(7.0)
    assert torch.equal(interpret(g, {"x": x})[0], x[-3:])


# -- input dims that are no size at some or every binding --------------------------
def test_an_input_dim_negative_at_every_binding_is_refused_naming_the_line():
    text = 'graph t {\n  %0 = input(name="x", shape=[-s,8], dtype=f32) : f32[-s,8]\n  return y=%0\n}'
    with pytest.raises(ShapeError, match=r"line 2: input 'x' dim 0: -s is negative at every binding"):
        parse_graph(text)


def test_an_input_dim_negative_at_some_bindings_is_a_constraint():
    """`s - 100` parsed and reached torch.randn with -96 rows in the candidate check."""
    g = Graph("g")
    g.output(g.input("x", ("s - 100", 8)).exp(), names=["y"])
    assert any("input 'x' dim 0" in str(c) for c in g.constraints)
    with pytest.raises(cleave.ir.BindingError, match="input 'x' dim 0"):
        g.check({"s": 4})
    assert g.bind({"x": (3, 8)}) == {"s": 103}


@pytest.mark.parametrize("dim", ["Mod(s,0)", "s % 0"])
def test_a_dim_dividing_by_zero_is_a_shape_error_naming_the_line(dim):
    text = f'graph t {{\n  %0 = input(name="x", shape=[{dim},8], dtype=f32) : f32[{dim},8]\n  return y=%0\n}}'
    with pytest.raises(cleave.CleaveError, match="line 2"):
        parse_graph(text)


# -- reshapes no binding satisfies, and text that defines a graph twice ---------------
@pytest.mark.parametrize("target, message", [
    (("s", 3), r"8\*s elements\), target \[s, 3\] has 3\*s: equal only where both are empty"),
    (("s+1", 8), r"target \[s\+1, 8\] has 8\*s\+8: never equal"),
])
def test_a_reshape_no_binding_satisfies_is_refused(target, message):
    with pytest.raises(ShapeError, match=message):
        _node(("s", 8)).reshape(target)


def test_a_reshape_some_bindings_satisfy_is_a_constraint():
    x = _node(("s", 8))
    x.reshape(("t", 4))
    assert any(c.kind == "eq" and "reshape" in c.origin for c in x.graph.constraints)


@pytest.mark.parametrize("lines, message", [
    (['%0 = input(name="y", shape=[4], dtype=f32) : f32[4]', "return o=%0"], r"line 3: %0 is defined twice"),
    (["return o=%0", "return p=%0"], r"line 4: 'return p=%0' follows the 'return' line"),
    (["return o=%0", "%1 = exp(%0) : f32[4]"], r"line 4: .* follows the 'return' line"),
])
def test_parse_graph_refuses_a_graph_defined_twice(lines, message):
    body = "\n  ".join(['%0 = input(name="x", shape=[4], dtype=f32) : f32[4]', *lines])
    with pytest.raises(cleave.ir.ParseError, match=message):
        parse_graph(f"graph t {{\n  {body}\n}}")


# -- found by the session-37 probe of the researcher-facing API -------------------
def test_a_float_function_of_an_integer_is_a_float_in_the_interpreter_and_the_kernels():
    """exp of an i32 node was typed i32: the interpreter gave exp(1) = 2.718, the kernel 2.
    It is f32, as torch.exp of an int32 tensor is."""
    g = Graph("int_exp")
    x = g.input("x", ("n",), "i32")
    g.output(x.exp(), names=["e"])
    g.output(x.sigmoid(), names=["s"])
    xs = torch.tensor([1, 2, 3], dtype=torch.int32)
    ref = interpret(g, {"x": xs})
    out = launch(cleave.schedule(g, {"n": 3})[0], {"x": xs})
    assert [r.dtype for r in ref] == [o.dtype for o in out] == [torch.float32] * 2
    for r, o, want in zip(ref, out, (xs.exp(), xs.sigmoid())):
        torch.testing.assert_close(r, want)
        torch.testing.assert_close(o, want)


def test_the_builders_slash_of_integers_divides_exactly_as_torch():
    """x / y of i32 nodes truncated (7 / 2 = 3) where torch's `/` gives 3.5; the IR's div
    of integers is torch's rounding_mode="trunc", which `g.add("div", ...)` still builds."""
    g = Graph("int_div")
    x, y = g.input("x", ("n",), "i32"), g.input("y", ("n",), "i32")
    g.output(x / y, names=["q"])
    g.output(7 / x, names=["r"])
    g.output(g.add("div", x, y), names=["t"])
    xs, ys = torch.tensor([7, -7, 9], dtype=torch.int32), torch.tensor([2, 2, -4], dtype=torch.int32)
    want = (xs / ys, 7 / xs, torch.div(xs, ys, rounding_mode="trunc"))
    ref = interpret(g, {"x": xs, "y": ys})
    out = launch(cleave.schedule(g, {"n": 3})[0], {"x": xs, "y": ys})
    assert [o.dtype for o in out] == [torch.float32, torch.float32, torch.int32]
    for r, o, w in zip(ref, out, want):
        torch.testing.assert_close(r, w)
        torch.testing.assert_close(o, w)


@pytest.mark.parametrize("start, stop", [("m", 0), ("m", 2)])
def test_a_slice_whose_start_may_pass_its_stop_is_refused_or_constrained(start, stop):
    """x["m":0] built a dim of -m (and schedule died in half_swap with an AttributeError);
    x["m":2] recorded no m <= 2."""
    g = Graph("neg_slice")
    x = g.input("x", ("m", "k"), "f32")
    if stop == 0:
        with pytest.raises(ShapeError, match="slice: stop 0 is before start m"):
            x[start:stop]
        return
    g.output(x[start:stop], names=["o"])
    with pytest.raises(cleave.ir.BindingError):
        g.check({"m": 3, "k": 2})
    g.check({"m": 2, "k": 2})


def test_a_symbolic_start_that_may_be_negative_is_constrained():
    """x["n-3":] recorded no n >= 3: at n = 2 the interpreter sliced from Python's -1 (one
    row) and a launched plan read a row before the input (three), where the graph says 3."""
    g = Graph("tail")
    x = g.input("x", ("n", 4), "f32")
    g.output(x["n-3":] * 2, names=["o"])
    plan = cleave.schedule(g, {"n": 5}, dynamic={"n"})[0]
    x5 = torch.randn(5, 4)
    torch.testing.assert_close(launch(plan, {"x": x5})[0], x5[2:] * 2)
    for n in (2, 1):
        with pytest.raises(cleave.ir.BindingError, match="0 <= n-3"):
            interpret(g, {"x": torch.randn(n, 4)})
        with pytest.raises(cleave.ir.BindingError, match="0 <= n-3"):
            launch(plan, {"x": torch.randn(n, 4)})


@pytest.mark.parametrize("build, message", [
    (lambda x: x.split(-1, 0, pad=0.0), r"split: count 0 must be >= 1"),
    (lambda x: x.reshape(("m", -1)), r"reshape: attribute shape="),
    (lambda x: x.split(-1, -2), r"split: attribute count=-2"),
    (lambda x: x.graph.add("topk", x, k="q", axis=1, which="values"), r"topk: attribute k='q'"),
])
def test_an_attribute_the_builder_cannot_read_names_the_op(build, message):
    """split by 0 built a dim of sympy's complex infinity (the interpreter then divided by
    zero); other unreadable attributes raised bare ValueErrors naming no op."""
    g = Graph("attrs")
    with pytest.raises(ShapeError, match=message):
        build(g.input("x", ("m", "k"), "f32"))


@pytest.mark.parametrize("value, dtype", [(1000, "i8"), (float("nan"), "i32"), (2.5, "i32"), (-1, "u8")])
def test_an_integer_const_its_type_cannot_hold_is_refused(value, dtype):
    """The interpreter (and so the search's candidate check) raised torch's overflow error
    naming no node, or truncated 2.5 to 2."""
    with pytest.raises(ShapeError, match="const: .* is not a value of"):
        Graph("c").const(value, dtype)


def test_integer_pow_is_refused_in_the_builder():
    """pow of i32 nodes built and scheduled, then failed inside Triton at launch."""
    g = Graph("int_pow")
    with pytest.raises(ShapeError, match="pow: of i32 operands is not supported"):
        g.add("pow", g.input("x", ("n",), "i32"), g.input("y", ("n",), "i32"))


@pytest.mark.parametrize("name", ["my graph", "attn-v2"])
def test_a_graph_name_of_several_words_reads_back_and_schedules(name):
    """The text form's header took one word: schedule (which reads the text back) failed
    with "a graph starts with 'graph NAME {'"."""
    g = Graph(name)
    g.output(g.input("x", ("m",), "f32").exp(), names=["o"])
    assert parse_graph(g.text()).name == name
    assert cleave.schedule(g, {"m": 4})


def test_a_dim_that_divides_is_whole_only_where_its_divisor_divides():
    """b.reshape(2, 'n/2') recorded no 2 | n: launched at n = 7 it evaluated n/2 as 3 and
    dropped an element (eager's reshape raises); an input of 'n/3' rows bound n = 8 beside
    2 rows."""
    g = Graph("halves")
    b = g.input("b", ("n",), "f32")
    g.output(b.reshape(2, "n/2").sum(0), names=["o"])
    assert "2 | n" in g.text()
    plan = cleave.schedule(g, {"n": 8}, dynamic={"n"})[0]
    torch.testing.assert_close(launch(plan, {"b": torch.arange(8.)})[0], torch.arange(8.).reshape(2, 4).sum(0))
    with pytest.raises(cleave.BindingError, match=r"constraint 2 \| n .*reshape.*fails for n=7"):
        launch(plan, {"b": torch.arange(7.)})
    thirds = Graph("thirds")
    a, c = thirds.input("a", ("n/3",), "f32"), thirds.input("c", ("n",), "f32")
    thirds.output(a.exp(), c.exp(), names=["o", "p"])
    with pytest.raises(cleave.BindingError, match=r"constraint 3 \| n  \(from input 'a''s dim n/3\) fails for n=8"):
        thirds.bind({"a": (2,), "c": (8,)})
    assert thirds.bind({"a": (3,), "c": (9,)}) == {"n": 9}


def test_a_static_dim_that_differs_says_what_it_expected():
    g = Graph("g")
    g.output(g.input("a", (4,), "f32").exp(), names=["o"])
    with pytest.raises(cleave.BindingError, match=r"^input 'a' dim 0: expected 4, got 5$"):
        interpret(g, {"a": torch.randn(5)})


def test_a_refused_output_leaves_the_graph_as_it_was():
    g = Graph("g")
    a = g.input("n", ("n",), "f32")
    with pytest.raises(ShapeError, match="has the name of a dim symbol"):
        g.output(a.exp(), names=["o"])
    assert g.output_names == [] and g.outputs == []
    g2 = Graph("g2")
    x = g2.input("x", (3,), "f32")
    with pytest.raises(ShapeError, match="declared twice"):
        g2.output(x.exp(), x.sin(), names=["o", "o"])
    assert g2.output_names == []


def test_a_dropped_nodes_constraint_binds_nothing():
    """A reshape built and never used left `require d*n == 0` in the graph, and every
    non-empty input was refused; a dropped split's `c | d` came through a rebuild."""
    g = cleave.Graph("dead")
    a = g.input("a", ("n", "d"), "f32")
    _ = a.reshape(0)
    _ = a.split(1, "c")
    g.output(a.exp().sum(-1), names=["o"])
    assert "require" not in g.text() and not cleave.ir.rebuild(g).constraints
    x = torch.randn(2, 3)
    torch.testing.assert_close(cleave.interpret(g, {"a": x})[0], x.exp().sum(-1))
    kept = cleave.Graph("kept")  # a live node's constraint still binds
    y = kept.input("a", ("n", "d"), "f32")
    kept.output(y.split(1, "c").sum(-1), names=["o"])
    with pytest.raises(cleave.ir.BindingError, match=r"c \| d"):
        cleave.interpret(kept, {"a": x}, env={"c": 2})
