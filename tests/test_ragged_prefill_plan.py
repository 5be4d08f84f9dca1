"""The ragged prefill's query rows are tiled (issue 14). Its program reshapes q to
[kv_heads, 4·total_q, d] (einsum merges each query with its group of 4 heads), so the
dot rows are 4i + g: tiling only g padded 4 heads to 16 rows, one program per query row
and kv head, each streaming its request's keys. The group can go to the grid instead,
each program tiling 64-128 queries of one head (strided by 4 rows), with the kv loop's
bounds reduced over the tile's rows."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from cleave import workloads as W
from cleave.ir.dtypes import DType
from cleave.runtime.launch import launch
from cleave.workloads import flashinfer as F
from cleave.search import search
from cleave.scheduler import schedule
import ragged_prefill as R

# a layout of 131 queries: two 128-row tiles, the second of 3 rows (the rest past the end)
LONG = ([0, 3, 70, 0, 1, 57], [4, 5, 90, 0, 6, 60])


def attention_kernel(plan):
    (kernel,) = [k for k in plan.kernels if R.kv_loops(k)]
    return kernel


def test_a_program_tiles_many_queries_of_one_head_and_matches_fp64():
    plan = R.schedule_at(R.searched(), LONG)
    kernel = attention_kernel(plan)
    assert R.rows_per_program(kernel, R.binding(LONG), R.SMALL["num_qo_heads"]) >= 64, kernel.grid
    assert len(R.kv_loops(kernel)) == 1, kernel.loops
    R.check(plan, LONG)


def test_the_plan_for_every_size_is_one_kernel_too():
    """Compiled for every size (the serving operator), the plan is the same one kernel:
    a max over the one chunk of a split at count 1 is no loop nested around the kv
    loop, so nothing is cut into kernels of its own (it was five: segment ids, max,
    P·V, sum and the combine). Checked at two layouts of one compile."""
    plan = R.schedule_at(R.searched(), LONG, dynamic=True)
    assert len(plan.kernels) == 1 and len(R.kv_loops(plan.kernels[0])) == 1, [k.grid for k in plan.kernels]
    R.check(plan, LONG, seeds=(0,))
    R.check(plan, R.LAYOUT, seeds=(1,))


def test_the_h200_plan_tiles_queries_in_one_pass():
    """The suite's shape (8 requests of 256 queries over 2048 keys, 32 heads over 8):
    the best plan is one kernel, one kv loop, 64+ query rows of one head per program."""
    w = W.get(R.NAME)
    env = w.presets["h200"]
    (plan,) = schedule(search(w.graph, progress=False).candidates[0], env, top_k=1)
    kernel = attention_kernel(plan)
    assert len(plan.kernels) == 1 and len(R.kv_loops(kernel)) == 1, [k.loops for k in plan.kernels]
    assert R.rows_per_program(kernel, env, 32) >= 64, kernel.grid


def _reads(node, name: str) -> bool:
    return (node.op == "input" and node.attrs["name"] == name) or any(_reads(x, name) for x in node.inputs)


def test_pv_takes_bf16_probabilities_within_bf16_of_the_definition():
    """The program casts its f32 probabilities to v's dtype for P·V (Hugging Face's
    attention, SDPA): the P·V MatMul's operands are bf16 in the captured graph, and
    the plan's output stays within 1e-2 of the definition's reference run in fp64."""
    (pv,) = [n for n in R.captured().live_nodes() if n.op == "matmul" and _reads(n, "v")]
    assert [x.dtype for x in pv.inputs] == [DType.bf16, DType.bf16], pv.inputs
    plan = R.schedule_at(R.searched(), LONG)
    named = R.inputs(LONG, seed=4)
    out = launch(plan, named)[0].double()
    want = F.kind_of(R.NAME).reference(*[x.double() if x.is_floating_point() else x for x in named.values()])[0]
    assert ((out - want).norm() / want.norm()).item() <= 1e-2
    assert ((out - want).abs().max() / want.abs().max()).item() <= 1e-2
