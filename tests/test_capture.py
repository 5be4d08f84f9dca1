"""cleave.capture: every workload's PyTorch reference captures to a graph that computes
what the DSL graph computes; the aten op table against torch eager; errors name the op
and the user's source line."""
import pytest
import torch
import torch.nn.functional as F

import cleave
from cleave import workloads
from cleave.frontends import CaptureError, UnsupportedOpError, is_supported
from cleave.interpreter import interpret
from cleave.ir import dims as D

F64 = torch.float64


def _close(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        if a.dtype.is_floating_point:
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-9, atol=1e-9)
        else:
            assert torch.equal(a, b)


def _check_capture(w, env, seed):
    """Capture at `env`; the graph must keep the workload's dynamic axes symbolic, the
    others static, and compute what the DSL graph computes at `env` and at a second
    binding that changes only the dynamic symbols."""
    inputs = w.inputs(env, seed=seed)
    g = cleave.capture(w.reference, *inputs.values(), dynamic=w.dynamic)
    assert list(g.inputs) == list(inputs)
    dynamic_syms = set()
    for pname, node in g.inputs.items():
        axes = w.dynamic.get(pname, {})
        for axis, d in enumerate(node.shape):
            if axis in axes:  # its symbol, or one capture derived (len_indptr = batch_size + 1)
                assert d == D.symbol(axes[axis]) or (d.free_symbols and not d.is_Symbol), (pname, axis, d)
                dynamic_syms |= {axes[axis]} | {x.name for x in d.free_symbols}
            else:
                assert d.is_Integer and int(d) == inputs[pname].shape[axis], (pname, axis, d)
    moved = {k: v + 6 if k in dynamic_syms else v for k, v in env.items()}
    other = ([b for b in w.test_bindings if b != env] or [None])[0]
    if other is not None and all(other[k] == v for k, v in env.items() if k not in dynamic_syms):
        moved = other  # the workload's own: its inputs may hold structure (page lists) sizes alone do not give
    for binding in (env, moved):
        fresh = w.inputs(binding, seed=seed + 1)
        _close(interpret(g, fresh, compute_dtype=F64), interpret(w.graph, fresh, compute_dtype=F64))


@pytest.mark.parametrize("name", workloads.names())
def test_workload_reference_captures_to_an_equivalent_graph(name):
    w = workloads.get(name)
    _check_capture(w, w.test_bindings[0], seed=100)


@pytest.mark.slow
@pytest.mark.parametrize("name", workloads.names())
def test_workload_reference_captures_at_every_test_binding(name):
    w = workloads.get(name)
    for k, env in enumerate(w.test_bindings):
        _check_capture(w, env, seed=200 + k)


def _same_structure(captured, dsl):
    dsl.output_names = list(captured.output_names)  # capture names outputs out/out0..; the DSL names them
    return captured.key() == dsl.key()


def test_reference_with_every_axis_named_equals_the_dsl_graph():
    ln = workloads.get("layernorm")
    g = cleave.capture(ln.reference, torch.randn(7, 37).bfloat16(), dynamic={"x": {0: "t", 1: "n"}})
    assert _same_structure(g, ln.graph)
    rms = workloads.get("rmsnorm_matmul")
    x, w = torch.randn(5, 19).bfloat16(), torch.randn(19, 11).bfloat16()
    g = cleave.capture(rms.reference, x, w, dynamic={"x": {0: "s", 1: "k"}, "w": {0: "k", 1: "n"}})
    assert _same_structure(g, rms.graph)


def test_sdpa_causal_decomposes_into_the_workloads_safe_softmax_attention():
    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(2, 3, 13, 16).bfloat16() for _ in range(3))
    dyn = {n: {0: "b", 1: "h", 2: "s", 3: "d"} for n in "qkv"}
    g = cleave.capture(attn, q, k, v, dynamic=dyn)
    assert _same_structure(g, workloads.get("mha_causal").graph)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_gqa_matches_the_gqa_workload(causal):
    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    w = workloads.get("gqa_causal" if causal else "gqa")
    env = {"b": 2, "hkv": 2, "g": 3, "s": 11, "d": 8}
    inputs = w.inputs(env, seed=7)
    g = cleave.capture(attn, *inputs.values(), dynamic={"q": {2: "s"}, "k": {2: "s"}, "v": {2: "s"}})
    _close(interpret(g, inputs, compute_dtype=F64), interpret(w.graph, inputs, compute_dtype=F64))


# -- the op table against torch eager, in fp64 -----------------------------------
def _norms(x, w):
    return (torch.log_softmax(x, -1), torch.logsumexp(x, dim=0), x.var(-1, keepdim=True), x.std(0),
            x.mean((0, 1)), F.linear(x, w, w[:, 0]), x.amax(0), torch.clamp(x, -0.5, 0.7), F.relu(x) ** 3,
            torch.addmm(w[:, 0][None], x, w.T), 2 - x, x.clamp_min(0.1),
            torch.baddbmm(x[None], x[None], x.T[None] @ x[None]), F.layer_norm(x, (5,), w[0], w[1], eps=1e-3),
            F.layer_norm(x[:, None], (1, 5)), F.rms_norm(x, (5,), w[2]), F.rms_norm(x, (5,), eps=0.1),
            F.gelu(x, approximate="tanh"), F.layer_norm(x * 1e-3, (5,), eps=0.0))  # eps 0 was taken as 1e-5


def _layout(x, w):
    a, b = x.chunk(2, dim=1)
    top = torch.stack([x[1:4, 2:], x[-3:, :-2]], dim=0)
    return (torch.cat([b, a[:, :1]], 1), top, x.select(0, 2), x.t().unsqueeze(0).expand(3, -1, -1),
            x.repeat(2, 3), x.repeat_interleave(3, dim=0), torch.einsum("ij,kj->ik", x, w),
            torch.einsum("bij,bjk->bik", x.view(1, *x.shape), x.T.reshape(1, x.shape[1], -1)),
            x.movedim(0, 1).flatten(), w @ x[0], x.narrow(1, 1, 3), x.unbind(1)[2],
            torch.tensor_split(x, 2, dim=1)[1])


def _index(x, idx, w):
    vals, where = torch.topk(x, 3, dim=-1, largest=False)
    return (torch.gather(x, 1, idx), torch.index_select(x, 0, idx[:, 0]), F.embedding(idx, w), x[idx[:, 1]],
            vals, where, torch.index_select(x, 1, idx[0, 0]))  # a 0-d index keeps the axis


def _extremes(x, w):
    top = x.max(dim=1)
    return (top.values, top.indices, x.min(0, keepdim=True).indices, x.argmax(), x.argmin(-1),
            torch.einsum("ij->j", x))


def _attention_masks(q, k, bias):
    keep = bias > 0
    return (F.scaled_dot_product_attention(q, k, k, attn_mask=keep),
            F.scaled_dot_product_attention(q, k, k, attn_mask=bias, scale=0.3))


def _masks(x, w):
    n = x.shape[-1]
    keep = torch.ones(n, n, dtype=torch.bool).triu(1)
    pos = torch.arange(n) + 2
    filled = x[:n].masked_fill(keep, 0.25)
    return (filled, torch.where(x > 0, x, -x * 2), x.tril(-1), pos * x, (x != 0.5) & (x < 1),
            torch.logical_or(x, x > 1), 1.0 - x / 3,
            # in the static case: torch 2.11 specializes a dynamic axis in a three-operand einsum
            torch.einsum("ij,kj,k->i", x, w, w[:, 1]))


def test_op_table_matches_torch_eager():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 5, generator=gen, dtype=F64)
    w = torch.randn(9, 5, generator=gen, dtype=F64)
    idx = torch.randint(0, 5, (7, 2), generator=gen)
    cases = [(_norms, (x, w), {"x": {0: "m"}}), (_layout, (x, w), {"x": {0: "m"}}),
             (_index, (x, idx, w), {"x": {0: "m"}, "idx": {0: "m"}}), (_masks, (x, w), {}),
             (_extremes, (x, w), {"x": {0: "m"}}),
             (_attention_masks, (x[None], w[None], torch.randn(7, 9, generator=gen, dtype=F64)),
              {"q": {1: "m"}, "k": {1: "n"}, "bias": {0: "m", 1: "n"}})]
    for fn, args, dyn in cases:
        g = cleave.capture(fn, *args, dynamic=dyn)
        names = list(g.inputs)
        _close(interpret(g, dict(zip(names, args)), compute_dtype=F64), list(fn(*args)))
    # the dynamic axis really is dynamic: the same graph at another size
    x2 = torch.randn(11, 5, generator=gen, dtype=F64)
    g = cleave.capture(_norms, x, w, dynamic={"x": {0: "m"}})
    _close(interpret(g, {"x": x2, "w": w}, compute_dtype=F64), list(_norms(x2, w)))


def test_dynamic_all_names_axes_by_parameter_and_merges_equal_ones():
    rms = workloads.get("rmsnorm_matmul")
    x, w = torch.randn(5, 19).bfloat16(), torch.randn(19, 11).bfloat16()
    g = cleave.capture(rms.reference, x, w, dynamic="all")
    assert [str(d) for d in g.inputs["x"].shape] == ["x_0", "x_1"]
    assert [str(d) for d in g.inputs["w"].shape] == ["x_1", "w_1"]


def test_symbolic_head_dim_scale_becomes_a_size_node():
    def attn(q, k):
        return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)

    q, k = torch.randn(3, 6, dtype=F64), torch.randn(4, 6, dtype=F64)
    g = cleave.capture(attn, q, k, dynamic={"q": {0: "s", 1: "d"}, "k": {0: "L", 1: "d"}})
    assert "size(value=d" in g.text()
    q2, k2 = torch.randn(5, 10, dtype=F64), torch.randn(2, 10, dtype=F64)
    _close(interpret(g, {"q": q2, "k": k2}, compute_dtype=F64), [attn(q2, k2)])


def test_module_parameters_become_inputs_and_scalar_constants_consts():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(5, 3)

        def forward(self, x):
            return F.silu(self.proj(x)) * torch.tensor(2.0)

    block = Block().double()
    x = torch.randn(4, 5, dtype=F64)
    g = cleave.capture(block, x, dynamic={"x": {0: "t"}})
    assert list(g.inputs) == ["proj_weight", "proj_bias", "x"]
    feeds = {"proj_weight": block.proj.weight.detach(), "proj_bias": block.proj.bias.detach(),
             "x": torch.randn(9, 5, dtype=F64)}
    _close(interpret(g, feeds, compute_dtype=F64), [block(feeds["x"]).detach()])


# -- errors ------------------------------------------------------------------------
def _sorts(x):
    return torch.sort(x, dim=-1).values * 2


def _medians(x):
    y = x.exp()
    return torch.median(y, dim=0).values


@pytest.mark.parametrize("fn, op, offset", [(_sorts, "aten.sort", 1), (_medians, "aten.median", 2)])
def test_unsupported_op_names_op_and_source_line(fn, op, offset):
    line = fn.__code__.co_firstlineno + offset
    with pytest.raises(UnsupportedOpError) as info:
        cleave.capture(fn, torch.randn(4, 6), dynamic={"x": {0: "n"}})
    err = info.value
    assert err.op.startswith(op)
    assert err.source.endswith(f"test_capture.py:{line}")
    assert op in str(err) and f"test_capture.py:{line}" in str(err)
    assert isinstance(err, cleave.CleaveError)


def test_is_supported_marks_the_nodes_capture_rejects():
    from torch.export import export

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.sort(x.exp(), dim=-1).values.sum(-1) + F.dropout(x, 0.5, training=True).sum()

    gm = export(M(), (torch.randn(4, 4),)).graph
    verdict = {n.name: is_supported(n) for n in gm.nodes}
    assert verdict["sort"] is False
    assert verdict["dropout"] is False  # in training: the op is known, the argument is not
    assert verdict["exp"] and verdict["sum_1"] and verdict["x"] and verdict["getitem"]


def test_unsupported_arguments_are_reported():
    with pytest.raises(UnsupportedOpError, match=r"aten.dropout.default.*training"):
        cleave.capture(lambda x: F.dropout(x, 0.5, training=True) + 1, torch.randn(6, 3))
    with pytest.raises(UnsupportedOpError, match=r"dropout_p"):
        cleave.capture(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=0.5), torch.randn(2, 4, 8))


def test_tensor_constant_made_inside_is_reported():
    def fn(x):
        return x * torch.tensor([1.0, 2.0, 3.0])

    with pytest.raises(UnsupportedOpError, match=r"constant tensor of shape \[3\].*pass it as an input"):
        cleave.capture(fn, torch.randn(4, 3))


def test_dynamic_spec_errors_are_one_clear_line():
    x = torch.randn(4, 5)
    with pytest.raises(CaptureError, match=r"dynamic names input 'y', but the function takes x"):
        cleave.capture(lambda x: x + 1, x, dynamic={"y": {0: "n"}})
    with pytest.raises(CaptureError, match=r"rank 2; dynamic axis 3 is out of range"):
        cleave.capture(lambda x: x + 1, x, dynamic={"x": {3: "n"}})


def test_nodes_carry_the_source_line():
    def fn(x):
        return x.exp()

    g = cleave.capture(fn, torch.randn(3))
    exp = next(n for n in g.nodes if n.op == "exp")
    assert exp.loc.endswith(f"test_capture.py:{fn.__code__.co_firstlineno + 1}")


def test_capture_without_an_example_for_each_argument_says_so():
    """torch.export's error was about its dynamic-shapes structure ("inputs has 0
    elements, but dynamic_shapes has 1")."""
    with pytest.raises(CaptureError, match=r"cannot take 0 example input\(s\) \(missing a required argument: 'x'\)"):
        cleave.capture(lambda x: x.exp())
    with pytest.raises(CaptureError, match="cannot take 2 example input"):
        cleave.capture(lambda x: x.exp(), torch.randn(3), torch.randn(3))


def _view_or_reshape(x):
    try:
        y = x.view(-1, 4)  # 9 elements: eager raises, the function catches it
    except RuntimeError:
        y = x.reshape(-1, 1)
    return y * 2


def test_an_op_whose_error_the_function_catches_is_left_out():
    """torch.export keeps the call that raised (no value, no user): translated, its
    missing shape was an AttributeError inside cleave."""
    x = torch.randn(3, 3)
    g = cleave.capture(_view_or_reshape, x)
    assert [n.op for n in g.live_nodes() if n.op == "reshape"] == ["reshape"]
    torch.testing.assert_close(cleave.compile(_view_or_reshape, verbose=False)(x), _view_or_reshape(x))
