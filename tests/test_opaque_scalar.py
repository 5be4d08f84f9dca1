"""A float computed from a size through math.log2 (Bloom's ALiBi slopes from the head
count) has no IR form: the op reading it is a graph break named with its scalar, where
the whole frame failed to translate and ran eagerly. A float through math.sqrt (Bloom's
`alpha=1 / math.sqrt(head_dim)`) has one: sqrt of the size, in the op's type."""
import math
import warnings

import torch

import cleave  # noqa: F401  (registers the backend)


def alibi_scores(q, k):
    heads = q.shape[1]
    closest = 2 ** math.floor(math.log2(heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    return (q @ k.transpose(-1, -2) + slopes[:, None, None]).softmax(-1)


def test_opaque_scalar_is_a_graph_break_at_its_op():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    f = torch.compile(alibi_scores, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in (5, 9):
            q, k = torch.randn(2, 4, t, 8, generator=g), torch.randn(2, 4, t, 8, generator=g)
            torch.testing.assert_close(f(q, k), alibi_scores(q, k))
    said = [str(w.message) for w in caught]
    assert any("aten.scalar_tensor" in m and "has no IR form" in m for m in said), said
    assert not any("capture of alibi_scores (" in m for m in said), said


def bloom_scores(q, k, alibi):
    s = alibi.baddbmm(batch1=q, batch2=k, beta=1.0, alpha=1.0 / math.sqrt(q.shape[-1]))
    return torch.softmax(s, dim=-1, dtype=torch.float32)


def test_a_square_root_of_a_size_compiles():
    """It was a graph break: "FloatTrueDiv(1.0, OpaqueUnaryFn_sqrt(ToFloat(s75))) has no IR form"."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    f = torch.compile(bloom_scores, backend="cleave", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for b, t, d in ((4, 3, 4), (6, 5, 7), (4, 3, 4)):
            q, k, al = (torch.randn(*s, generator=g) for s in ((b, t, d), (b, d, t + 2), (b, 1, t + 2)))
            torch.testing.assert_close(f(q, k, al), bloom_scores(q, k, al))
    said = [str(w.message) for w in caught if "cleave" in str(w.message)]
    assert not said, said
