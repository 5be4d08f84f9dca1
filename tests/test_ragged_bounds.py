"""Ragged prefill's kv loop is bounded per q tile (scheduler/bounds.py, program_values.py,
monotone.py): a tile of query rows that spans several requests loops from the least
start over its rows to the greatest end, each reduced over the rows' own values (not
max(kv_end) - min(q_end), which reaches into the next request), whether the mask reads
each row's request bounds through its segment id (FlashInfer's definition), or compares
segment ids on both sides (`seg_q[:, None] == seg_kv[None, :]`: the kv loop searches the
never-decreasing ids for the request's first and last token). Each kernel runs under
TRITON_INTERPRET=1 against the fp64 interpreter, on random layouts with empty requests,
requests longer than a tile and tiles spanning several, into NaN-poisoned outputs; and
the tiles each program visits are counted and must be exactly the tight bound's.
"""
import math
import os
import re

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import cleave
from cleave.interpreter import interpret
from cleave.scheduler import schedule
from cleave.scheduler.monotone import nondecreasing
from kernel_check import LOOPS, check_outputs, tiles_visited

H, D = 2, 16
KV_EXTENTS = ("nkv", "n")  # the kv loops' extent, as the kernels' loop records print it


def segments(indptr, count: int):
    """Each position's request: how many interior boundaries lie at or before it."""
    pos = torch.arange(count, device=indptr.device)
    return (pos[:, None] >= indptr[None, 1:-1]).sum(1)


def attend(q, k, v, keep):
    """Softmax attention over the kept positions, an empty row giving 0."""
    s = torch.einsum("ihd,jhd->hij", q.float(), k.float()) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep[None], float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = m.masked_fill(m == float("-inf"), 0.0)
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    out = torch.einsum("hij,jhd->ihd", e, v.float()) / total.masked_fill(total == 0, 1.0).permute(1, 0, 2)
    return out.to(q.dtype)


def _positions(q, k):
    return (torch.arange(q.shape[0], device=q.device)[:, None], torch.arange(k.shape[0], device=q.device)[None, :])


def gathered(q, k, v, qo_indptr, kv_indptr):
    """FlashInfer's causal mask: query i of request r sees kv_start[r] <= j <= i + kv_end[r]
    - q_end[r], each bound gathered through i's segment id."""
    seg = segments(qo_indptr, q.shape[0])
    i, j = _positions(q, k)
    keep = (j >= kv_indptr[:-1][seg][:, None]) & (j <= i + (kv_indptr[1:][seg] - qo_indptr[1:][seg])[:, None])
    return attend(q, k, v, keep)


def segment_ids(q, k, v, qo_indptr, kv_indptr):
    """The same mask with segment ids on both sides for the request."""
    seg_q, seg_kv = segments(qo_indptr, q.shape[0]), segments(kv_indptr, k.shape[0])
    i, j = _positions(q, k)
    keep = (seg_q[:, None] == seg_kv[None, :]) & (j <= i + (kv_indptr[1:][seg_q] - qo_indptr[1:][seg_q])[:, None])
    return attend(q, k, v, keep)


def documents(q, k, v, indptr):
    """Packed self-attention: causal within each document of the indptr."""
    seg = segments(indptr, q.shape[0])
    i, j = _positions(q, k)
    return attend(q, k, v, (seg[:, None] == seg[None, :]) & (j <= i))


def _indptr(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


# (q lens, kv lens): empty requests (first and last too), one longer than a 128 tile, runs
# of short ones that share a q tile, odd totals; kv at least q (queries at the end of kv).
LAYOUTS = (([3, 0, 21, 1, 9, 40, 130, 7], [5, 0, 37, 6, 9, 70, 131, 7]),
           ([0, 2, 1, 1, 77, 3, 0, 150, 60], [0, 9, 1, 4, 200, 3, 5, 150, 61]))


def _run(fn, q_lens, kv_lens, seed: int, kv_indptr=None):
    """Capture fn at this layout, schedule it (dynamic sizes, every reduction a loop), run
    it into poisoned outputs against the fp64 interpreter; (plan, inputs)."""
    gen = torch.Generator().manual_seed(seed)
    nq, nkv = sum(q_lens), sum(kv_lens)
    q, k, v = (torch.randn(n, H, D, generator=gen).to(torch.bfloat16) for n in (nq, nkv, nkv))
    if fn is documents:
        names, args = ["q", "k", "v", "indptr"], [q, k, v, _indptr(q_lens) if kv_indptr is None else kv_indptr]
        dynamic = {"q": {0: "n"}, "k": {0: "n"}, "v": {0: "n"}, "indptr": {0: "r1"}}
    else:
        names, args = ["q", "k", "v", "qo_indptr", "kv_indptr"], [q, k, v, _indptr(q_lens), _indptr(kv_lens)]
        dynamic = {"q": {0: "nq"}, "k": {0: "nkv"}, "v": {0: "nkv"}, "qo_indptr": {0: "r1"}, "kv_indptr": {0: "r1"}}
    g = cleave.capture(fn, *args, dynamic=dynamic)
    inputs = dict(zip(names, args))
    env = {sym: inputs[name].shape[a] for name, axes in dynamic.items() for a, sym in axes.items()}
    plan = schedule(g, env, dynamic=set(env), target=LOOPS, top_k=1)[0]
    poisoned = [torch.full(tuple(o.shape), float("nan"), dtype=o.dtype) for o in interpret(g, inputs)]
    visits = tiles_visited(plan, inputs, KV_EXTENTS, out=poisoned)
    check_outputs(poisoned, interpret(g, inputs, compute_dtype=torch.float64), f"{fn.__name__} {q_lens} {kv_lens}")
    return plan, visits


def _first_at_least(ids, t: int) -> int:
    return int((ids < t).sum())  # the ids never decrease


def _row_bounds(fn, q_lens, kv_lens):
    """Per query row, each conjunct's bounds on the kv index as the kernel derives them:
    ([starts], [ends]) with the row kept on max(starts) <= j < min(ends)."""
    qo, kv = _indptr(q_lens), _indptr(kv_lens)
    nq, nkv = sum(q_lens), sum(kv_lens)
    seg_q, seg_kv = segments(qo, nq), segments(kv, nkv)
    rows = []
    for i in range(nq):
        r = int(seg_q[i])
        causal = i + 1 + int(kv[r + 1]) - int(qo[r + 1])
        if fn is gathered:
            rows.append(([int(kv[r])], [causal]))
        elif fn is segment_ids:
            rows.append(([_first_at_least(seg_kv, r)], [_first_at_least(seg_kv, r + 1), causal]))
        else:
            rows.append(([_first_at_least(seg_q, r)], [_first_at_least(seg_q, r + 1), i + 1]))
    return rows


def _labels(source: str) -> dict:
    """label -> (extent, role, block), from a kernel's header comments."""
    return {m[0]: (m[1], m[2], int(m[3])) for m in re.findall(r"# (X\d+): extent (.*), (\w+), block (\d+)", source)}


def expected_visits(plan, fn, q_lens, kv_lens) -> dict:
    """kernel -> the sorted tiles each program visits over the kv loops with tight bounds:
    per q tile, from the least start of its rows (down to a whole kv tile) to the greatest
    end, for each conjunct, and the whole kv extent's tiles in the same loops."""
    rows = _row_bounds(fn, q_lens, kv_lens)
    nq, nkv = sum(q_lens), sum(kv_lens)
    out = {}
    for k in plan.kernels:
        kv_loops = [loop for loop in k.loops if loop["extent"] in KV_EXTENTS]
        if not kv_loops:
            continue
        labels = _labels(k.source)
        (bk,) = {labels[loop["label"]][2] for loop in kv_loops}
        (bm,) = [b for ext, role, b in labels.values() if role == "grid" and ext in ("nq", "n")]
        programs = 1
        for ext, role, b in labels.values():
            if role == "grid" and ext not in ("nq", "n"):
                programs *= -(-int(ext) // b)
        counts = []
        for t in range(-(-nq // bm)):
            tile = rows[t * bm:(t + 1) * bm]
            lo = max(min(r[0][c] for r in tile) for c in range(len(tile[0][0])))
            hi = min(nkv, min(max(r[1][c] for r in tile) for c in range(len(tile[0][1]))))
            start = max(lo, 0) // bk * bk
            counts += [len(kv_loops) * max(0, -(-(hi - start) // bk))] * programs
        out[k.name] = (sorted(counts), len(kv_loops) * -(-nkv // bk) * len(counts))
    return out


@pytest.mark.parametrize("fn", [gathered, segment_ids, documents])
@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_kv_loop_runs_each_q_tiles_own_requests(fn, layout):
    """Correct against the fp64 interpreter, and each program visits exactly the kv tiles
    between its rows' least start and greatest end: a loop over the whole packed extent,
    or bounds that mix one request's end with another's start, fail the count."""
    q_lens, kv_lens = LAYOUTS[layout]
    if fn is documents:
        kv_lens = q_lens
    seed = torch.seed() % 10_000
    plan, visits = _run(fn, q_lens, kv_lens, seed)
    want = expected_visits(plan, fn, q_lens, kv_lens)
    assert want, [k.loops for k in plan.kernels]
    for name, (counts, whole) in want.items():
        got = sorted(n for (kernel, _), n in visits.items() if kernel == name)
        assert got == counts, (name, fn.__name__, seed, got, counts)
        assert sum(counts) < whole, (name, sum(counts), whole)


def test_segment_ids_need_no_sorted_indptr():
    """Ids counted from an unsorted indptr still never decrease: the search reads the ids,
    not the indptr, so the kernel matches the interpreter there too."""
    lens = [30, 0, 41, 9]
    unsorted = torch.tensor([0, 50, 20, 75, 80], dtype=torch.int32)
    _run(documents, lens, lens, seed=5, kv_indptr=unsorted)


def test_a_count_of_steps_up_never_decreases():
    """monotone.nondecreasing: a segment id (a sum of pos >= indptr[k]) never decreases
    along pos; a count of pos < indptr[k] never increases, so it bounds no loop."""
    def up(indptr):
        return segments(indptr, 9)

    def down(indptr):
        pos = torch.arange(9)
        return (pos[:, None] < indptr[None, 1:-1]).sum(1)

    for fn, want in ((up, True), (down, False)):
        g = cleave.capture(fn, _indptr([3, 4, 2]), dynamic={"indptr": {0: "r1"}})
        assert nondecreasing(g, g.outputs[0]) is want, fn.__name__
