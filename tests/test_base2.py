"""exp in base 2 (rules/base2.py): the attention kernels fold log2(e) into the score
scale, so that their kv loop takes exp2 of a plain difference per score, as
FlashAttention's does, and still match the fp64 reference. Checked on the generated
code's structure, not on timing."""
import re

import pytest

import cleave
from cleave import workloads as W
from cleave.ir.ops import LOG2E
from kernel_check import LOOPS, run_and_check


def loop_bodies(source: str) -> list[list[str]]:
    """The statements of each loop over a label's tiles (`for startN in range(...)`)."""
    lines, out = source.splitlines(), []
    for i, line in enumerate(lines):
        if re.match(r"\s*for start\d+ in range", line):
            indent = len(line) - len(line.lstrip())
            body = []
            for nxt in lines[i + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt.strip())
            out.append(body)
    return out


@pytest.mark.parametrize("name", ["gqa_causal", "mha_softcap", "mha_alibi", "rope_attention_causal"])
def test_kv_loop_takes_exp2_of_a_difference(name):
    w = W.get(name)
    env = w.test_bindings[0]
    candidate = cleave.search(w.graph, progress=False).best
    plan = cleave.schedule(candidate, env, top_k=1, target=LOOPS)[0]  # LOOPS: the kv axis is a loop
    bodies = [body for k in plan.kernels for body in loop_bodies(k.source) if any("tl.exp2(" in s for s in body)]
    assert bodies, "no kv loop computes exp2"
    for body in bodies:
        assert not [s for s in body if repr(LOG2E) in s], f"log2(e) multiplied inside the loop: {body}"
        defs = dict(s.split(" = ", 1) for s in body if " = " in s)
        scores = re.findall(r"tl\.exp2\((\w+)\)", "\n".join(body))  # p = exp2(s' - m')
        assert scores and all(re.fullmatch(r"\w+ - \w+(\[[:, None]+\])?", defs[p]) for p in scores), body
    run_and_check(w.graph, plan, env, seed=0)
