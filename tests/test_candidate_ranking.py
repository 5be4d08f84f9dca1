"""An operator asked to (`candidates=`, as `cleave trace build` asks for
operator.RANKED_CANDIDATES) ranks the search's first candidates by their scheduled cost,
not only by the search's order: the search's cost is blind to tiling, and it put the MLA
decode's FlashDecoding form third."""
import functools

import torch

import cleave
from cleave import workloads as W
from cleave.ir import rebuild
from cleave.ir.contracts import Candidate
from cleave.runtime.operator import RANKED_CANDIDATES, CompiledOperator


W_ROWSUM = W.get("matmul_rowsum")


@functools.lru_cache(maxsize=None)
def _searched():
    return cleave.search(W_ROWSUM.graph).candidates


def test_a_cheaper_later_candidate_serves_the_operator(tmp_path):
    """MatMul -> row sum as written (a GEMM, then its rows summed) listed first, the
    search's X·(W·1) second: the operator serves the second, which the cost model ranks
    cheaper, and its result matches fp64."""
    w = W_ROWSUM
    rewritten = _searched()[0]
    op = CompiledOperator(w.graph, dynamic=set(), entry=tmp_path / "op", candidates=2)
    op.candidates = [Candidate(rebuild(w.graph)), rewritten]
    inputs = w.inputs({"s": 300, "k": 256, "n": 512}, seed=1)
    got = op(inputs)
    (spec,) = op.specs.values()
    assert spec.candidate is rewritten
    (want,) = w.run_reference({k: v.double() for k, v in inputs.items()})
    torch.testing.assert_close(got[0].double(), want.double(), rtol=1e-3, atol=1e-3)


def test_an_operator_keeping_one_plan_still_ranks_several_candidates(tmp_path):
    """The number of plans kept (top_k) does not cap the candidates searched: with
    `--top-k 2` the MLA decode's serving operator searched two and never saw its
    FlashDecoding form, the third."""
    op = CompiledOperator(W_ROWSUM.graph, dynamic=set(), top_k=1, entry=tmp_path / "op", candidates=RANKED_CANDIDATES)
    assert len(_searched()) >= RANKED_CANDIDATES  # the search has them to give
    assert len(op._candidates()) >= RANKED_CANDIDATES
