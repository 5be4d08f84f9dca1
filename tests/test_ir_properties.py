"""Property tests over random small graphs: the symbolic shape (and dtype) each node
infers is what the interpreter produces at a binding, and the text form round-trips."""
import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from cleave.interpreter import TORCH_DTYPES, interpret
from cleave.ir import BindingError, Graph, parse_graph
from cleave.ir.ops import BINARY, BITWISE, COMPARE, UNARY

SYMBOLS = ("a", "b", "c")


class Builder:
    """Draws ops one at a time onto a growing graph."""

    def __init__(self, data):
        self.data = data
        self.g = Graph("prop")
        self.nodes = []
        self.count = 0

    def draw(self, strategy):
        return self.data.draw(strategy)

    def dim(self):
        return self.draw(st.sampled_from(SYMBOLS + (1, 2, 3, 4)))

    def new_input(self, shape, dtype="f32"):
        self.count += 1
        return self.g.input(f"x{self.count}", tuple(shape), dtype)

    def pick(self, min_rank=0):
        choices = [n for n in self.nodes if n.rank >= min_rank and n.dtype.is_float]
        return self.draw(st.sampled_from(choices)) if choices else None

    def step(self):
        op = self.draw(st.sampled_from(["unary", "binary", "compare_where", "reduce", "permute", "reshape",
                                        "slice", "concat", "split", "matmul", "cast"]))
        x = self.pick(min_rank=2 if op == "matmul" else 1 if op in ("reduce", "permute", "slice", "concat",
                                                                     "split", "reshape") else 0)
        if x is None:
            return
        event(op)  # `pytest --hypothesis-show-statistics` shows how often each op was drawn
        out = getattr(self, "_" + op)(x)
        self.nodes.append(out)

    def _unary(self, x):  # nan from log(-x) is fine: only shapes and dtypes are checked
        return self.g.add(self.draw(st.sampled_from([u for u in UNARY if u not in BITWISE])), x)  # floats here

    def _partner(self, x):
        """A new input that broadcasts against x: some dims replaced by 1, maybe fewer of them."""
        drop = self.draw(st.integers(0, x.rank))
        shape = [d if self.draw(st.booleans()) else 1 for d in x.shape[drop:]]
        return self.new_input(shape)

    def _binary(self, x):
        y = self._partner(x)
        op = self.draw(st.sampled_from([b for b in BINARY if b not in ("pow", "idiv", *BITWISE)]))  # integer ops
        return self.g.add(op, *((x, y) if self.draw(st.booleans()) else (y, x)))

    def _compare_where(self, x):
        cond = self.g.add(self.draw(st.sampled_from(COMPARE)), x, self.g.const(0.0))
        return self.g.add("where", cond, x, self._partner(x))

    def _cast(self, x):
        return x.cast(self.draw(st.sampled_from(["f64", "f16", "bf16"]))).cast("f32")

    def _reduce(self, x):
        return self.g.add("reduce", x, op=self.draw(st.sampled_from(["sum", "max", "min"])),
                          axis=self.draw(st.integers(0, x.rank - 1)), keepdim=self.draw(st.booleans()))

    def _permute(self, x):
        return x.permute(*self.draw(st.permutations(range(x.rank))))

    def _reshape(self, x):
        kind = self.draw(st.sampled_from(["merge", "unsqueeze", "split"]))
        if kind == "merge" and x.rank >= 2:
            i = self.draw(st.integers(0, x.rank - 2))
            return x.reshape(x.shape[:i] + (x.shape[i] * x.shape[i + 1],) + x.shape[i + 2:])
        if kind == "split":
            evens = [i for i, d in enumerate(x.shape) if d.is_number and int(d) % 2 == 0]
            if evens:
                i = self.draw(st.sampled_from(evens))
                return x.reshape(x.shape[:i] + (2, x.shape[i] / 2) + x.shape[i + 1:])
        return x.unsqueeze(self.draw(st.integers(0, x.rank)))

    def _slice(self, x):
        axis = self.draw(st.integers(0, x.rank - 1))
        n = x.shape[axis]
        if n.is_number:
            start = self.draw(st.integers(0, int(n)))
            stop = self.draw(st.integers(start, int(n)))
        else:  # symbols are bound to >= 2
            start, stop = self.draw(st.sampled_from([(0, 1), (1, 2), (0, 2), (1, n), (0, n)]))
        return x.slice(axis, start, stop)

    def _concat(self, x):
        axis = self.draw(st.integers(0, x.rank - 1))
        shape = list(x.shape)
        shape[axis] = self.dim()
        parts = [x, self.new_input(shape)]
        return self.g.add("concat", *(parts if self.draw(st.booleans()) else parts[::-1]), axis=axis)

    def _split(self, x):
        axis = self.draw(st.integers(0, x.rank - 1))
        count = self.draw(st.sampled_from(["c", 2, 3]))
        return x.split(axis, count, pad=self.draw(st.sampled_from([0.0, float("-inf")])))

    def _matmul(self, x):
        w = self.new_input((x.shape[-1], self.dim()))
        return x @ w


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_inferred_shapes_match_the_interpreter_and_text_round_trips(data):
    b = Builder(data)
    for _ in range(data.draw(st.integers(1, 2))):
        b.nodes.append(b.new_input([b.dim() for _ in range(data.draw(st.integers(1, 3)))]))
    for _ in range(data.draw(st.integers(1, 6))):
        b.step()
    g = b.g
    outs = [n for n in b.nodes if n.op != "input"] or b.nodes
    g.output(*outs)
    env = {s: data.draw(st.integers(2, 5), label=s) for s in SYMBOLS}
    try:  # slices of slices need longer extents: bindings that break a constraint are refused
        g.check(env)
    except BindingError:
        assume(False)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16), label="seed"))
    inputs = {name: torch.randn(g.concrete_shape(node, env), generator=gen) for name, node in g.inputs.items()}
    results = interpret(g, inputs, env={"c": env["c"]})
    for node, value in zip(g.outputs, results):
        assert tuple(value.shape) == g.concrete_shape(node, env), node
        assert value.dtype == TORCH_DTYPES[node.dtype], node
    back = parse_graph(g.text())
    assert back.key() == g.key()
    assert back.text() == g.text()
