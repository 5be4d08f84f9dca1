"""The workload suite: each DSL graph computes what its PyTorch reference computes,
prints and parses back to an equal graph, and binds at its preset shapes."""
import pytest
import torch

from cleave import workloads
from cleave.interpreter import interpret
from cleave.ir import dims as D
from cleave.ir import parse_graph


@pytest.mark.parametrize("name", workloads.names())
def test_interpreter_matches_reference_in_fp64(name):
    w = workloads.get(name)
    for k, env in enumerate(w.test_bindings):
        inputs = w.inputs(env, seed=17 + k, dtype=torch.float64)
        # the reference on fp64 inputs casts to fp64 (`.to(q.dtype)`): the graph's casts
        # are identities here, where the interpreter would round a cast to bf16
        casts = {n.id for n in w.graph.live_nodes() if n.op == "cast"}
        got = interpret(w.graph, inputs, compute_dtype=torch.float64, exact=casts)
        want = w.run_reference(inputs)
        assert len(got) == len(want) == len(w.graph.outputs)
        for out, ref, node in zip(got, want, w.graph.outputs):
            assert tuple(out.shape) == w.graph.concrete_shape(node, env)
            assert out.shape == ref.shape
            if ref.dtype.is_floating_point:
                # the references cast to float32 inside (.float()), which bounds the agreement
                torch.testing.assert_close(out, ref.double(), rtol=1e-5, atol=1e-5)
            else:
                assert torch.equal(out, ref)


@pytest.mark.parametrize("name", workloads.names())
def test_text_round_trips(name):
    g = workloads.get(name).graph
    back = parse_graph(g.text())
    assert back.key() == g.key()
    assert back.text() == g.text()


@pytest.mark.parametrize("name", workloads.names())
def test_presets_bind(name):
    w = workloads.get(name)
    g = w.graph
    assert w.presets
    for preset, env in w.presets.items():
        shapes = {n: tuple(D.evaluate(d, env) for d in node.shape) for n, node in g.inputs.items()}
        bound = g.bind(shapes)
        for sym in g.symbols():
            assert bound[sym.name] == env[sym.name], (preset, sym)
        for node in g.outputs:
            assert all(v > 0 for v in g.concrete_shape(node, bound))


@pytest.mark.parametrize("name", workloads.names())
def test_dynamic_axes_are_symbols_of_the_graph(name):
    """Each dynamic axis is its symbol, or one capture derived from another symbol
    (a CSR indptr's len_indptr is batch_size + 1): never a constant."""
    w = workloads.get(name)
    g = w.graph
    symbols = {s.name for s in g.symbols()}
    for pname, axes in w.dynamic.items():
        assert pname in g.inputs, pname
        for axis, sym in axes.items():
            dim = g.inputs[pname].shape[axis]
            assert dim == D.symbol(sym) or (sym not in symbols and dim.free_symbols), (pname, axis, dim)
