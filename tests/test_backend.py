"""torch.compile(backend="cleave") on dynamo's own graph, lowered by AOTAutograd with
PyTorch's decompositions: modules with parameters under dynamic=True, ops covered
through decompositions, and autograd (the forward compiled, the backward eager)."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cleave

from backend_case import close as _close
from backend_case import grads_match_eager
from backend_case import ctx  # noqa: F401 (a fixture)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.norm, self.down = nn.Linear(8, 24), nn.LayerNorm(24), nn.Linear(24, 8)

    def forward(self, x):
        return x + self.down(F.gelu(self.norm(self.up(x))))


def test_module_with_dynamic_true_keeps_parameters_static(ctx):
    m = Mlp()
    f = torch.compile(m, backend="cleave", dynamic=True)
    with torch.no_grad():
        for b, s in ((2, 3), (3, 5), (4, 7)):  # not 1: dynamo specialises size 1
            x = torch.randn(b, s, 8)
            _close(f(x), m(x))
    st = ctx.stats()
    assert st["failed"] == 0 and st["graph_breaks"] == 0 and st["unsupported"] == [], st
    assert st["operators"] == 1 and st["searches"] + st["from_cache"] == 1, st  # searched, or from an earlier run
    (op,) = ctx.operators.values()
    weights = [n for n in op.graph.inputs.values() if n.rank == 2 and not n.shape[0].free_symbols]
    assert len(weights) == 2  # the two Linear weights: all dims static


# ops PyTorch decomposes into ops cleave maps, and the ones cleave maps itself
COVERED = {
    "normalize": lambda x: F.normalize(x, dim=-1),
    "gelu": F.gelu,
    "softplus": F.softplus,
    "hardswish": F.hardswish,
    "mish": F.mish,
    "elu": F.elu,
    "selu": F.selu,
    "logsigmoid": F.logsigmoid,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "var_mean": lambda x: torch.var_mean(x, -1)[0] + torch.var_mean(x, -1)[1],
    "std": lambda x: x.std(-1),
    "glu": lambda x: F.glu(x, -1),
    "lerp": lambda x: torch.lerp(x, x * 2, 0.3),
    "addcmul": lambda x: torch.addcmul(x, x, x, value=0.5),
    "log1p_expm1": lambda x: torch.log1p(x.abs()) + torch.expm1(x * 1e-3),
    "erf": torch.erf,
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "rms_norm": lambda x: F.rms_norm(x, x.shape[-1:]),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "relu6": F.relu6,
    "erfc": lambda x: torch.erfc(x * 3),
    "round_decimals": lambda x: torch.round(x * 50, decimals=1) + torch.round(x * 50, decimals=-1),
    "rrelu_eval": lambda x: F.rrelu(x, training=False),
    "empty": lambda x: x + torch.empty_like(x).fill_(2.5),
}


@pytest.mark.parametrize("name", sorted(COVERED))
def test_decomposed_ops_compile_without_graph_breaks(ctx, name):
    fn = COVERED[name]
    f = torch.compile(fn, backend="cleave")
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no graph break, no fallback
        _close(f(x), fn(x), 1e-5)
    st = ctx.stats()
    assert st["operators"] >= 1 and st["graph_breaks"] == 0 and st["failed"] == 0, st


@pytest.mark.parametrize("dynamic", [False, True])
def test_argmax_and_argmin_compile_exactly(ctx, dynamic):
    """Lowered as top-1: the k axis is a single index, not a label (it raised KeyError
    in the scheduler and ran eagerly)."""
    def fn(x):
        return torch.argmax(x, -1), torch.argmin(x, 0), x.max(-1).indices
    f = torch.compile(fn, backend="cleave", dynamic=dynamic)
    for n in (6, 9):
        x = torch.randn(n, 10, generator=torch.Generator().manual_seed(n))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for got, want in zip(f(x), fn(x)):
                assert torch.equal(got, want)
    assert ctx.stats()["failed"] == 0


def test_a_region_of_constants_between_graph_breaks_runs_eagerly(ctx):
    """`torch.arange(5)` alone between two breaks reads no tensor: nothing names its
    device, nothing fuses. It runs eagerly (its launch used to fail, with a warning)."""
    def fn(x, t):
        return x[torch.arange(5), t] * 2
    f = torch.compile(fn, backend="cleave")
    x, t = torch.randn(5, 8), torch.randint(0, 8, (5,), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(f(x, t), fn(x, t))
    assert not [w for w in caught if "could not compile" in str(w.message)]
    assert ctx.stats()["failed"] == 0


@pytest.mark.parametrize("fn", [
    lambda x: F.embedding(torch.tensor([1, 3, 5]), x) * 2,  # a tensor constant made in the code
    lambda x: torch.where(x > 0, x, torch.tensor(float("nan"))).nan_to_num(0.0).softmax(-1),
], ids=["tensor_constant", "scalar_tensor_constant"])
def test_tensor_constants_made_in_the_code_trace_and_run_correctly(ctx, fn):
    """PyTorch's wider decomposition table decomposes `lift_fresh`, which the tracer
    needs to see to turn the code's constant tensors into fake ones: the whole
    torch.compile call raised BackendCompilerFailed."""
    f = torch.compile(fn, backend="cleave")
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(2))
    _close(f(x), fn(x))


def _scaled_and_picked(x):
    return x * torch.tensor([0.5, -2.0, 3.0]) + x[:, [2, 0, 0]]


@pytest.mark.parametrize("through", ["backend", "cleave.compile"])
def test_tensor_constants_of_several_elements_run_in_the_kernels(ctx, through):
    """A constant tensor the code makes (a per-column scale, the index list of
    `x[:, [2, 0, 0]]`) ran eagerly ("pass it as an input"): it is now an input of the
    graph that the launcher passes itself, at every length of a dynamic axis."""
    f = (torch.compile(_scaled_and_picked, backend="cleave", dynamic=True) if through == "backend"
         else cleave.compile(_scaled_and_picked, dynamic={"x": {0: "n"}}))
    for n in (4, 7, 9):
        x = torch.randn(n, 3, generator=torch.Generator().manual_seed(n))
        assert torch.equal(f(x), _scaled_and_picked(x))
    st = f.stats if through == "cleave.compile" else ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st
    assert st["operators"] == 1


def _head_and_padded(x, n):
    return x[:n] * 2, torch.cat([x, x.new_zeros(n, x.shape[1])]) + 1


def test_a_length_passed_as_an_int_compiles(ctx):
    """`x[:n]` with n an argument: no tensor's dim carries n, so the operator had no
    value for its symbol and ran eagerly ("no value for symbol"). The launcher now
    passes n as the length of a one-element view, and one compile serves every n."""
    f = torch.compile(_head_and_padded, backend="cleave", dynamic=True)
    x = torch.randn(9, 5, generator=torch.Generator().manual_seed(0))
    for n in (3, 4, 6, 7):
        for got, want in zip(f(x, n), _head_and_padded(x, n)):
            assert torch.equal(got, want)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st
    assert st["operators"] == 1 and st["compiles"] <= 2, st


def _offset_and_scaled(x, pos, scale):
    return torch.sin(x + pos) * scale


def test_an_int_that_may_be_negative_compiles(ctx):
    """An int argument that changes between calls becomes symbolic (automatic dynamic
    shapes) without torch knowing its sign, so no length can carry it: the operator had
    no value for its symbol and ran eagerly from the second value on. It is read as the
    difference of two carried lengths, and one compile serves every value."""
    f = torch.compile(_offset_and_scaled, backend="cleave")
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    for pos, scale in ((0, 1), (3, -2), (-4, 5), (7, 0), (-1, -7)):
        assert torch.allclose(f(x, pos, scale), _offset_and_scaled(x, pos, scale), atol=1e-6)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st
    assert st["operators"] == 2 and st["compiles"] <= 3, st  # the ints static at the first call, then symbolic



def test_an_int_too_large_to_carry_runs_eagerly_with_a_warning(ctx):
    """x + k at k = 2**63 - 1: its carried length, k + 1, overflows int64, and torch's
    expand raised an overflow from inside the launcher."""
    f = torch.compile(lambda x, k: x + k, backend="cleave")
    x = torch.tensor([-3, -1, 0, 1])
    for k in (1, 7):
        assert torch.equal(f(x, k), x + k)
    with pytest.warns(UserWarning, match="integer argument k is too large to pass as a size"):
        assert torch.equal(f(x, 2 ** 63 - 1), x + (2 ** 63 - 1))
    assert torch.equal(f(x, -2 ** 63 + 1), x - (2 ** 63 - 1))  # warned once; its arguments remembered too

def _heads(x, h):
    b, s, d = x.shape
    return x.view(b, s, h, d // h).transpose(1, 2).softmax(-1), x.view(h, -1).sum(0)


def test_a_split_into_a_count_of_heads_passed_as_an_int_compiles(ctx):
    """`x.view(b, s, h, d // h)` with h an argument: the reshape's dims are h and
    floor(d/h). No small binding met the divisibility (the candidate check raised "no
    small binding"), and the scheduler could not pair d with h * floor(d/h); both ran
    eagerly. The pairing also returned no groups where it failed with every dim used,
    which would have indexed the operand at 0."""
    f = torch.compile(_heads, backend="cleave", dynamic=True)
    for shape, h in (((2, 5, 12), 4), ((2, 5, 12), 3), ((3, 7, 30), 5)):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(h))
        for got, want in zip(f(x, h), _heads(x, h)):
            assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st
    assert st["operators"] == 1, st


def test_reshape_dims_that_do_not_pair_are_refused():
    import types

    import sympy

    from cleave.ir import ShapeError
    from cleave.ir import dims as D
    from cleave.scheduler.views import reshape_groups

    a, b, c = (D.symbol(n) for n in "abc")
    node = types.SimpleNamespace(id=2)
    with pytest.raises(ShapeError, match="reshape %2 from .* does not split into groups"):
        reshape_groups((a, b), (c,), node)  # equal only where a constraint says a*b = c
    assert reshape_groups((a, b), (c, b * sympy.floor(a / c)), node) == [([0, 1], [0, 1])]


def test_an_index_into_an_axis_shorter_than_four_compiles(ctx):
    """The candidate check drew integer inputs from [0, 4): `x[:, idx]` of 3 columns
    failed in the reference interpreter (index 3 out of bounds) and ran eagerly."""
    def pick(x, idx):
        return x[:, idx] * 2

    f = torch.compile(pick, backend="cleave")
    x, idx = torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), torch.tensor([2, 0, 1, 1])
    assert torch.equal(f(x, idx), pick(x, idx))
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["operators"] == 1, st


@pytest.mark.parametrize("name, fn", [
    ("cross_entropy", lambda x, t: F.cross_entropy(x, t)),
    ("cross_entropy_none", lambda x, t: F.cross_entropy(x, t, reduction="none")),
    ("nll_loss", lambda x, t: F.nll_loss(F.log_softmax(x, -1), t)),
    ("gather", lambda x, t: torch.gather(x, 1, t[:, None].expand(-1, 3)) * 2),
])
def test_losses_and_gather_compile_through_their_decompositions(ctx, name, fn):
    """cross_entropy and nll_loss decompose to a gather of the target's logit, which
    the scheduler had no tiling rule for: they ran eagerly."""
    f = torch.compile(fn, backend="cleave", dynamic=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # no graph break, no fallback
        for n in (5, 9):
            g = torch.Generator().manual_seed(n)
            x, t = torch.randn(n, 8, generator=g), torch.randint(0, 8, (n,), generator=g)
            _close(f(x, t), fn(x, t))
    st = ctx.stats()
    assert st["failed"] == 0 and st["graph_breaks"] == 0, st


@pytest.mark.parametrize("fn", [lambda x: torch.logsumexp(x, -1), lambda x: F.log_softmax(x, -1),
                                lambda x: torch.logsumexp(x, (0, 1)), lambda x: torch.logsumexp(x, (0, 1), keepdim=True)],
                         ids=["logsumexp", "log_softmax", "logsumexp_two_axes", "logsumexp_two_axes_kept"])
@pytest.mark.parametrize("fill", [float("-inf"), float("inf")])
def test_infinite_rows_give_what_torch_gives(ctx, fn, fill):
    """logsumexp reads an infinite max as 0 (a row of -inf gives -inf, not NaN);
    log_softmax does not (NaN there, as in torch). Over two axes logsumexp compiles too
    (it ran eagerly: one axis only)."""
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(3))
    x[2], x[4, 3] = fill, fill
    got, want = torch.compile(fn, backend="cleave")(x), fn(x)
    torch.testing.assert_close(got, want, equal_nan=True)
    st = ctx.stats()
    assert st["graph_breaks"] == 0 and st["failed"] == 0, st


@pytest.mark.parametrize("fn", [lambda x: x.amax(-1), lambda x: x.min(0).values,
                                lambda x: torch.maximum(x, x * 0.5), torch.relu, lambda x: x.clamp(max=0.3)],
                         ids=["amax", "min", "maximum", "relu", "clamp"])
def test_max_and_min_propagate_nan_as_torch_does(ctx, fn):
    """Triton's max and min drop NaN (fmax); torch's propagate it."""
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(4))
    x[1, 3] = float("nan")
    got, want = torch.compile(fn, backend="cleave")(x), fn(x)
    torch.testing.assert_close(got, want, equal_nan=True)


def test_autograd_runs_the_forward_compiled_and_the_backward_eagerly(ctx):
    m = Mlp()
    x = torch.randn(2, 3, 8, requires_grad=True)
    grads_match_eager(torch.compile(m, backend="cleave")(x), m, x)
    st = ctx.stats()
    assert st["operators"] >= 1 and st["graph_breaks"] == 0 and st["failed"] == 0, st


def test_autograd_with_dynamic_shapes_compiles_the_forward_with_its_size_outputs(ctx):
    """With dynamic shapes AOTAutograd's forward graph also returns the symbolic sizes
    its backward needs; a size output made the whole forward run eagerly. The sizes
    are now computed from the arguments beside the compiled tensors, in order."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.proj = nn.RMSNorm(10), nn.Linear(10, 10)

        def forward(self, x):
            return self.proj(self.norm(x)) + x

    m = Block()
    f = torch.compile(m, backend="cleave", dynamic=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # no graph break, no fallback
        for rows in (6, 9):
            x = torch.randn(rows, 10, generator=torch.Generator().manual_seed(rows), requires_grad=True)
            grads_match_eager(f(x), m, x)
    st = ctx.stats()
    assert st["operators"] >= 1 and st["graph_breaks"] == 0 and st["failed"] == 0, st


def test_naive_attention_keeps_its_batch_axes_and_fuses_online(ctx):
    """aten lowers a 4-D `q @ k.T` to a bmm over merged (batch, head) axes; the capture
    keeps the axes, so the softmax between the two products stays in one layout, its
    normalisation moves after P@V (the online form) and the kv heads repeated for GQA
    are read per kv head."""
    def attention(q, k, v):
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        s = (q @ k.transpose(-2, -1)) / 4.0
        return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v

    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, h, 7, 16, generator=gen) for h in (4, 2, 2))
    out = torch.full_like(q, float("nan"))
    with torch.no_grad():
        out.copy_(torch.compile(attention, backend="cleave")(q, k, v))
    _close(out, attention(q.double(), k.double(), v.double()).float())
    (op,) = ctx.operators.values()
    assert all(n.rank >= 4 for n in op.graph.live_nodes() if n.op == "matmul")
    assert not any(n.op == "broadcast" for n in op.graph.live_nodes())  # K/V regrouped per kv head
    (spec,) = op.specs.values()
    assert "normalize-after-matmul" in spec.candidate.derivation, spec.candidate.derivation


SPECIALS = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5, -1.5, 1e8 + 0.5]


@pytest.mark.parametrize("name, fn", [
    ("floor", lambda x, y: torch.floor(x)),
    ("ceil", lambda x, y: torch.ceil(x)),
    ("trunc", lambda x, y: torch.trunc(x)),
    ("round", lambda x, y: torch.round(x)),  # halves to even
    ("sign", lambda x, y: torch.sign(x)),  # 0 for NaN and for either zero
    ("frac", lambda x, y: torch.frac(x)),
    ("isnan", lambda x, y: torch.where(torch.isnan(x), y, x)),
    ("clamp_tensor_bounds", lambda x, y: torch.clamp(x, min=-y.abs(), max=y.abs())),
    ("clamp_min_tensor", lambda x, y: torch.clamp_min(x, y)),
    ("log2_log10", lambda x, y: torch.log2(y.abs() + 1) + torch.log10(y.abs() + 1)),
    ("xlogy", lambda x, y: torch.xlogy(y.abs(), y.abs() + 0.5)),  # a NaN constant in the kernel
])
def test_elementwise_prims_of_decompositions_compile_exactly(ctx, name, fn):
    """Ops whose decompositions leave prims (floor, round, sign, ne for isnan...) or
    take tensor bounds (clamp) ran eagerly; they compile, with torch's values at the
    specials: NaN, the infinities, signed zeros and halves."""
    f = torch.compile(fn, backend="cleave")
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(6, 13, generator=g) * 4, torch.randn(6, 13, generator=g)
    x[0] = torch.tensor(SPECIALS)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")  # no graph break, no fallback
        got = f(x, y)
    want = fn(x, y)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=1e-6)
    number = ~want.isnan()
    assert torch.equal(torch.signbit(got[number]), torch.signbit(want[number])), "a zero of the wrong sign"
    st = ctx.stats()
    assert st["failed"] == 0 and st["graph_breaks"] == 0, st


@pytest.mark.parametrize("pad, value", [((1, 2), 0.0), ((2, 0, 1, 3), -1.5), ((-1, 2, 0, -2), 0.0)])
def test_constant_pad_compiles(ctx, pad, value):
    """F.pad's constant mode (negative pads crop): the wider decomposition table wrote
    into a new tensor (prims.copy_to), and AOTAutograd's functional check raised
    BackendCompilerFailed out of torch.compile."""
    fn = lambda x: F.pad(x, pad, value=value) * 2  # noqa: E731
    f = torch.compile(fn, backend="cleave")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for rows in (6, 9):
            x = torch.randn(rows, 10, generator=torch.Generator().manual_seed(rows))
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(f(x), fn(x), rtol=0, atol=0)
    st = ctx.stats()
    assert st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_a_lowering_that_fails_inside_torch_runs_eagerly_with_a_warning(ctx, monkeypatch):
    """A decomposition AOTAutograd rejects (here the wider table's constant_pad_nd, which
    writes with prims.copy_to) does not escape torch.compile: the frame runs as dynamo
    traced it, with one warning saying why."""
    from torch._decomp import decomposition_table

    from cleave.frontends import decompositions

    table = {**decompositions.table(), torch.ops.aten.constant_pad_nd.default:
             decomposition_table[torch.ops.aten.constant_pad_nd.default]}
    monkeypatch.setattr(decompositions, "table", lambda: table)
    fn = lambda x: F.pad(x, (1, 2)) + 1  # noqa: E731
    x = torch.randn(4, 5)
    with pytest.warns(UserWarning, match="lowering it through AOTAutograd failed"):
        got = torch.compile(fn, backend="cleave")(x)
    torch.testing.assert_close(got, fn(x))
    assert ctx.stats()["graph_breaks"] == 1


@pytest.mark.parametrize("fn", [lambda x: torch.diag(x[:, :6]) + 1, lambda x: torch.diagonal(x[:, 1:7]) * 2,
                                lambda x: torch.diag(x[1:, 2:]).exp()], ids=["diag", "diagonal", "diag_offset"])
def test_storage_dependent_ops_read_the_memory_eager_would(ctx, fn):
    """torch.diag lowers to as_strided over a slice of the input, with the input's
    strides: cleave's region for the slice wrote a contiguous copy, and the as_strided
    over it read past its end (a RuntimeError out of torch.compile). Whatever an
    as_strided reads is now produced eagerly."""
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(torch.compile(fn, backend="cleave")(x), fn(x))
    assert ctx.stats()["failed"] == 0


@pytest.mark.parametrize("fn, make", [
    (lambda x: F.pad(x[None], (2, 3), mode="reflect")[0], lambda g: torch.randn(6, 10, generator=g)),
    (lambda t: (t - 5).abs() * (t - 3).sign() - (-t).square(), lambda g: torch.randint(-9, 9, (5, 7), generator=g)),
    (lambda t: (t * 3_000_001).abs() + 1, lambda g: torch.randint(-9, 9, (5, 7), generator=g)),
], ids=["reflect_pad", "int_abs_sign", "int_abs_past_2_24"])
def test_integer_unary_ops_stay_integers(ctx, fn, make):
    """abs, neg, sign and square of integers are integers in torch: through f32 an
    index could not address a load (reflect padding failed its first launch and ran
    eagerly) and values past 2^24 would round."""
    f = torch.compile(fn, backend="cleave")
    x = make(torch.Generator().manual_seed(5))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        got = f(x)
    assert torch.equal(got, fn(x))
    assert ctx.stats()["failed"] == 0


def test_an_as_strided_over_a_transposed_elementwise_result_reads_eager_strides(ctx):
    """tanh of a transposed input keeps its strides in eager, so the diagonal's
    as_strided is traced with them: a region's contiguous tanh would be read wrongly.
    That tanh runs eagerly; over a contiguous result the region keeps it."""
    fn = lambda x: torch.tanh(x.t()).diagonal() + 1  # noqa: E731
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(torch.compile(fn, backend="cleave")(x), fn(x))


def test_a_first_call_with_an_empty_batch_compiles(ctx):
    """dynamo specialises a 0-row first call to a literal 0: the candidates' symbolic
    cost then divided 0 rows by a 0-wide tile ('The argument nan is not comparable')
    and the region ran eagerly."""
    m = nn.Sequential(nn.LayerNorm(12), nn.Linear(12, 12))
    fn = lambda x: m(x).sum(-1)  # noqa: E731
    f = torch.compile(fn, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for rows in (0, 5):
            x = torch.randn(rows, 12, generator=torch.Generator().manual_seed(rows))
            torch.testing.assert_close(f(x), fn(x), rtol=1e-5, atol=1e-5)
    assert ctx.stats()["failed"] == 0


def test_flip_over_static_and_dynamic_axes_compiles(ctx):
    """flip (aten.flip, prims.rev) reads each axis through n - 1 - iota(n): exact, with n
    a constant over a static axis and an integer size value over a dynamic one."""
    fn = lambda x, y: torch.tanh(x.flip(1)) + y.flip(0, -1) * 2  # noqa: E731
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        torch.testing.assert_close(torch.compile(fn, backend="cleave")(x, y), fn(x, y))
        torch._dynamo.reset()
        f = torch.compile(fn, backend="cleave", dynamic=True)
        for rows in (5, 9):
            x, y = torch.randn(rows, 7, generator=g), torch.randn(rows, 7, generator=g)
            torch.testing.assert_close(f(x, y), fn(x, y))
    st = ctx.stats()
    assert st["failed"] == 0 and st["graph_breaks"] == 0, st


def test_an_op_on_an_unsupported_dtype_says_which_dtype(ctx):
    """A complex multiply (RoPE written with view_as_complex) is aten.mul.Tensor, an op
    cleave maps, on complex64, a dtype it does not: the warning names the dtype, and the
    result is eager's."""
    def rope(x, freqs):
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * freqs).flatten(-2)

    x, freqs = torch.randn(2, 5, 8), torch.polar(torch.ones(5, 4), torch.randn(5, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(rope, backend="cleave")(x, freqs)
    _close(got, rope(x, freqs))
    messages = [str(w.message) for w in caught if "cleave" in str(w.message)]
    assert any("aten.mul.Tensor on complex64" in m and "is not supported" in m for m in messages), messages
    assert any("aten.view_as_complex.default (at" in m for m in messages), messages


def test_group_norm_compiles_its_row_major_as_strided(ctx):
    """group_norm's decomposition views its [n, g, c/g, 1] scale and shift as [n, c]
    through as_strided: over a contiguous input, in row-major order from offset 0, that
    is a reshape, and the norm compiles whole (static, then with a dynamic batch)."""
    fn = lambda x, w, b: F.group_norm(x, 4, w, b)  # noqa: E731
    f = torch.compile(fn, backend="cleave")
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(8, generator=g), torch.randn(8, generator=g)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for n in (2, 3, 5):
            x = torch.randn(n, 8, 5, 5, generator=g)
            if n > 2:
                torch._dynamo.mark_dynamic(x, 0)
            _close(f(x, w, b), fn(x, w, b))
    assert ctx.stats()["graph_breaks"] == 0 and ctx.stats()["failed"] == 0


@pytest.mark.parametrize("fn, shapes", [
    (lambda x: torch.diagonal(x, offset=1) * 2, [(5, 7), (9, 6), (4, 4), (1, 1)]),
    (lambda x: torch.trace(x), [(5, 7), (9, 6), (4, 4), (1, 3)]),
    (lambda x, w, b: F.group_norm(x, 2, w, b), [(2, 4, 5, 3), (3, 6, 7, 2)]),
], ids=["diagonal_offset", "trace", "group_norm"])
def test_strided_views_over_dynamic_extents_compile(ctx, fn, shapes):
    """A diagonal of a dynamic (n, m) reads Min(n, m - 1) elements, a group_norm's
    [n, g, C // g] statistics are viewed as [n, C]: that the last element read lies
    inside the input was not proven for every size, and the as_strided ran eagerly
    ("as_strided reading past its input"), its consumer then refused for a size
    Min(...) "no input dimension defines". The bound is a constraint of the graph now
    (a binding where it fails runs eagerly), and its size arithmetic (sym_min) no
    break."""
    f = torch.compile(fn, backend="cleave", dynamic=True)
    g = torch.Generator().manual_seed(7)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        for shape in shapes:
            x = torch.randn(*shape, generator=g)
            args = (x,) if len(shape) == 2 else (x, torch.randn(shape[1], generator=g), torch.randn(shape[1], generator=g))
            torch.testing.assert_close(f(*args), fn(*args), rtol=1e-5, atol=1e-5)  # (1, 1)'s diagonal is empty
    st = ctx.stats()
    assert st["graph_breaks"] == 0 and st["failed"] == 0 and st["operators"] >= 1, st


def test_a_strided_view_read_past_its_input_at_another_size_runs_eagerly(ctx):
    """x.as_strided((n // 2 + 1,), (2,)) reads inside x at odd n only: compiled there,
    and at even n the binding fails the graph's constraint and eager raises, as it
    does without cleave."""
    fn = lambda x: torch.as_strided(x, (x.shape[0] // 2 + 1,), (2,)) * 2  # noqa: E731
    f = torch.compile(fn, backend="cleave", dynamic=True)
    for n in (7, 9):
        x = torch.randn(n)
        assert torch.equal(f(x), fn(x))
    with pytest.raises(RuntimeError, match="out of bounds for storage|requiring a storage size"):
        f(torch.randn(8))
    assert ctx.stats()["failed"] == 0


def test_a_region_after_an_eager_diagonal_reads_its_min_size_as_a_size(ctx):
    """A diagonal of a transposed result runs eagerly (its input is not contiguous);
    the region after it took an input of size Min(m, n - 1) and refused it as a
    data-dependent size. That extent is a size symbol of its own now."""
    fn = lambda x: torch.tanh(x.t()).diagonal(offset=1) + 1  # noqa: E731
    f = torch.compile(fn, backend="cleave", dynamic=True)
    g = torch.Generator().manual_seed(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for shape in ((5, 7), (9, 6), (4, 4)):
            x = torch.randn(*shape, generator=g)
            _close(f(x), fn(x))
    messages = [str(w.message) for w in caught if "cleave" in str(w.message)]
    assert messages and all("non-contiguous" in m for m in messages), messages
    assert ctx.stats()["operators"] >= 1


@pytest.mark.parametrize("fn, make", [
    (lambda l, n: l[torch.arange(l.shape[0]), n - 1],
     lambda g: (torch.randn(4, 7, 11, generator=g), torch.tensor([3, 7, 1, 5]))),
    (lambda x, i, j: x[i, j] * 2, lambda g: (torch.randn(5, 6, generator=g), torch.tensor([0, 4, -1]),
                                             torch.tensor([5, 0, -2]))),
    (lambda x, i, j, k: x[:, i[:, None], j, k], lambda g: (torch.randn(2, 5, 6, 3, generator=g),
                                                           torch.tensor([0, 4, 3]), torch.tensor([5, 0]),
                                                           torch.tensor([2, -3]))),
    (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), lambda g: (torch.randn(1, 2, 3, 4, generator=g),)),
], ids=["last_token", "pairs_negative", "outer_three_axes", "nearest_interpolation"])
def test_index_tensors_on_adjacent_axes_compile(ctx, fn, make):
    """x[i, j]: index tensors on adjacent axes, broadcast together, take from those axes
    merged (a row's last token, logits[arange(b), lengths - 1]; nearest interpolation)."""
    args = make(torch.Generator().manual_seed(4))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        got = torch.compile(fn, backend="cleave")(*args)
    assert torch.equal(got, fn(*args))
    assert ctx.stats()["graph_breaks"] == 0 and ctx.stats()["failed"] == 0


def test_an_index_outside_its_axis_reads_zero_as_a_single_take_does(ctx):
    """torch raises on x[i, j] with i outside its axis; a kernel cannot, so the element
    reads 0, as one past a single take's axis does, and never another row's element."""
    x = torch.arange(1.0, 13.0).reshape(3, 4)
    got = torch.compile(lambda x, i, j: x[i, j], backend="cleave")(x, torch.tensor([1, 3]), torch.tensor([2, 1]))
    assert got.tolist() == [x[1, 2].item(), 0.0]


@pytest.mark.parametrize("fn, shape", [
    (lambda a: torch.einsum("ii->i", a) * 2, (5, 5)),
    (lambda a: torch.diag(a * 1.5) + 1, (5, 7)),
    (lambda a: torch.diagonal(a.exp(), offset=1) * 2, (5, 7)),
    (lambda a: (a * 2).unfold(-1, 3, 2).sum(-1), (2, 9)),
], ids=["einsum_diagonal", "diag", "diagonal_offset", "unfold_windows"])
def test_strided_views_of_a_contiguous_result_compile_as_takes(ctx, fn, shape):
    """as_strided over a contiguous result, reading inside it, is a take from the
    flattened values at offset + sum(i_k * stride_k): diagonals and sliding windows
    compile (over a slice or a transposed result it still runs eagerly, above)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(6))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cleave")
        got = torch.compile(fn, backend="cleave")(x)
    torch.testing.assert_close(got, fn(x))
    assert ctx.stats()["graph_breaks"] == 0


def test_attention_scaled_by_the_square_root_of_a_dynamic_head_dim_compiles(ctx):
    """`/ math.sqrt(q.shape[-1])` under dynamic=True: an f64 square root of a size,
    rounded to f32. The candidate computed the root in f32 and lost that rounding, the
    fp64 check saw a one-ulp difference (CandidateMismatch) and the frame ran eagerly;
    a kept rounding cast now rounds from its operand's precision in the input graph."""
    import math

    def attention(q, k, v, lens):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        keep = torch.arange(k.shape[2])[None, :] < lens[:, None]
        return s.masked_fill(~keep[:, None, None, :], float("-inf")).softmax(-1) @ v

    f = torch.compile(attention, backend="cleave", dynamic=True)
    g = torch.Generator().manual_seed(0)
    for b, h, L, S, d in [(2, 3, 7, 13, 16), (1, 2, 5, 9, 24)]:
        q, k, v = (torch.randn(b, h, n, d, generator=g) for n in (L, S, S))
        lens = torch.randint(1, S + 1, (b,), generator=g)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = f(q, k, v, lens)
        want = attention(q.double(), k.double(), v.double(), lens)
        _close(got, want.float(), 1e-5)
    st = ctx.stats()
    assert st["operators"] >= 1 and st["graph_breaks"] == 0 and st["failed"] == 0, st


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer_fast_path_compiles(ctx, norm_first):
    """nn.TransformerEncoderLayer in eval mode under no_grad runs PyTorch's fused
    `_transformer_encoder_layer_fwd`, which no table decomposed: the whole layer ran
    eagerly. It is written out in the ops of the layer's slow path (fused_layers.py)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", batch_first=True,
                                             norm_first=norm_first).eval()
    f = torch.compile(layer, backend="cleave")
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        torch.testing.assert_close(f(x), layer(x), atol=1e-5, rtol=1e-5)
    st = ctx.stats()
    assert st["unsupported"] == [] and st["failed"] == 0 and st["graph_breaks"] == 0, st
