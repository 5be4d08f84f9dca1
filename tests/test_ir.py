"""The IR: shape inference, errors that name the op and shapes, text round trip, hashing."""
import pytest

from cleave.ir import BindingError, Graph, ParseError, ShapeError, parse_graph
from cleave.ir import dims as D
from cleave.ir.graph import Constraint


def _attention():
    g = Graph("attn")
    q = g.input("q", ("b", "h", "s", "d"), "bf16")
    k = g.input("k", ("b", "h", "L", "d"), "bf16")
    v = g.input("v", ("b", "h", "L", "d"), "bf16")
    s = q @ k.T
    e = (s - s.max(-1, keepdim=True)).exp()
    return g.output((e @ v) / e.sum(-1, keepdim=True), names=["o"])


def test_shapes_are_symbolic():
    g = _attention()
    assert [str(d) for d in g.outputs[0].shape] == ["b", "h", "s", "d"]
    assert [s.name for s in g.symbols()] == ["L", "b", "d", "h", "s"]


def test_matmul_error_names_op_operands_and_dims():
    g = Graph()
    a = g.input("a", ("m", "k"))
    b = g.input("b", ("n", "k"))
    with pytest.raises(ShapeError, match=r"matmul: operand 0 has shape \[m, k\], operand 1 has shape \[n, k\]: "
                                         r"contracted dims k vs n"):
        a @ b


def test_broadcast_error_names_dim():
    g = Graph()
    a = g.input("a", ("b", "s"))
    c = g.input("c", ("b", "L"))
    with pytest.raises(ShapeError, match=r"add: .*\[b, s\].*\[b, L\]: dim 1 is s vs L"):
        a + c


def test_hash_consing_shares_equal_nodes():
    g = Graph()
    x = g.input("x", ("n",))
    assert x.exp() is x.exp()
    assert (x + 1.0) is not (x + 2.0)


def test_round_trip_and_structural_hash():
    g = _attention()
    back = parse_graph(g.text())
    assert back.text() == g.text()
    assert back.key() == g.key() == _attention().key()
    other = Graph("attn")
    q = other.input("q", ("b", "h", "s", "d"), "bf16")
    other.output(q.exp())
    assert other.key() != g.key()


def test_parse_rejects_wrong_annotation():
    text = _attention().text().replace(": bf16[b,h,s,L]", ": bf16[b,h,L,s]", 1)
    with pytest.raises(ParseError, match="annotated"):
        parse_graph(text)


def test_parse_accepts_another_form_of_the_same_dims():
    """sympy prints a product as built (3*(s+2)*(t+2), a convolution's flattened padded
    input) and rebuilds it as (3*s+6)*(t+2): the annotation matches by value, and the
    plan's graph, re-parsed at launch, no longer failed its first launch."""
    text = '''graph flat {
  %0 = input(name="x", shape=[3,s+2,t+2], dtype=f32) : f32[3,s+2,t+2]
  %1 = reshape(%0, shape=[3*(s+2)*(t+2)]) : f32[3*(s+2)*(t+2)]
  return y=%1
}'''
    assert parse_graph(text).outputs[0].shape[0].free_symbols
    with pytest.raises(ParseError, match="annotated"):
        parse_graph(text.replace(": f32[3*(s+2)*(t+2)]", ": f32[3*(s+2)*(t+3)]"))


def test_split_records_divisibility_only_without_pad():
    g = Graph()
    x = g.input("x", ("b", "L"))
    exact = x.split(1, "c")
    assert [str(d) for d in exact.shape] == ["b", "c", "L/c"]
    assert any(c.kind == "divides" for c in g.constraints)
    g2 = Graph()
    padded = g2.input("x", ("b", "L")).split(1, "c", pad=0.0)
    assert str(padded.shape[2]) == "ceiling(L/c)"
    assert not g2.constraints
    g.output(exact, names=["o"])  # a constraint binds while its node is live
    g.bind({"x": (2, 12)}, extra={"c": 4})
    with pytest.raises(BindingError, match=r"c \| L"):
        g.bind({"x": (2, 10)}, extra={"c": 4})


def test_bind_solves_product_dims_and_reports_mismatch():
    g = Graph()
    q = g.input("q", ("b", "hkv*g", "d"))
    k = g.input("k", ("b", "hkv", "d"))
    g.output(q.reshape("b", "hkv", "g", "d") + k.unsqueeze(2))
    assert g.bind({"q": (2, 12, 5), "k": (2, 3, 5)}) == {"b": 2, "hkv": 3, "d": 5, "g": 4}
    with pytest.raises(BindingError, match="input 'k' dim 0"):
        g.bind({"q": (2, 12, 5), "k": (3, 3, 5)})


def test_hash_ignores_build_order():
    def build(sum_first: bool):
        g = Graph("norm")
        x = g.input("x", ("t", "n"))
        if sum_first:
            total = x.sum(-1, keepdim=True)
            count = g.add("size", value="n", dtype="f32")
        else:
            count = g.add("size", value="n", dtype="f32")
            total = x.sum(-1, keepdim=True)
        return g.output(x - total / count)

    assert build(True).key() == build(False).key()
    assert build(True).text() == build(False).text()


def test_a_sum_of_bools_counts_in_i64():
    """As torch.sum: typed bool, a count stored to a buffer between kernels kept only 0/1."""
    g = Graph()
    m = g.input("x", ("n", "k")) > 0.0
    assert str(m.sum(1).dtype) == "i64" and str(m.max(1).dtype) == "bool"


def test_the_text_form_keeps_the_constraints():
    """A constraint beyond the nodes' own checks (a split's "no empty chunk", a size a
    trace branched on) was dropped by the text form: a parsed candidate then served
    shapes the original refuses (a split of 9 keys into 4 chunks, NaN)."""
    g = Graph("split")
    x = g.input("x", ("L",))
    g.output(x * 2, names=["y"])
    g._constrain(Constraint("le", D.dim("(s_L - 1)*ceiling(L/s_L) + 1"), D.dim("L"), "no empty chunk (split-sum) %3"))
    text = g.text()
    assert 'require (s_L-1)*ceiling(L/s_L)+1 <= L from "no empty chunk (split-sum) %3"' in text
    back = parse_graph(text)
    assert back.text() == text and back.key() == g.key()
    assert back.constraints == g.constraints
    with pytest.raises(BindingError, match="no empty chunk"):
        back.bind({"x": (9,)}, {"s_L": 4})
    assert parse_graph(text.replace("  require", "  # require")).key() != g.key()


def test_a_graph_of_no_outputs_reads_back():
    g = Graph("empty")
    g.input("x", ("m",), "f32")
    assert parse_graph(g.text()).text() == g.text()
    with pytest.raises(ParseError, match="ends without a 'return' line"):
        parse_graph(g.text().replace("  return\n", ""))


def test_parse_graph_and_interpret_name_a_wrong_argument():
    import torch

    from cleave import interpret

    g = Graph("g")
    g.output(g.input("a", ("m",), "f32").exp(), names=["o"])
    with pytest.raises(TypeError, match="parse_graph: text must be a str"):
        parse_graph(None)
    with pytest.raises(TypeError, match="interpret: graph must be a cleave Graph"):
        interpret(g.text(), {"a": torch.ones(3)})
    with pytest.raises(TypeError, match="interpret: inputs must be a dict"):
        interpret(g, [torch.ones(3)])
    with pytest.raises(TypeError, match="interpret: input 'a' must be a torch.Tensor, got ndarray"):
        interpret(g, {"a": torch.ones(3).numpy()})
