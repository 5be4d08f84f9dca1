"""Loads issued early (Target.early_loads): each load of a buffer the kernel only reads
moves up its block's straight-line code to just after what its address and mask read,
so that it is in flight while the code it passed computes.

Written where they are first read, a decode's V tile is loaded after its scores' MatMul
and softmax; the MatMul stages K through shared memory behind a barrier, which neither
LLVM nor ptxas moves a load across, so V's bytes were not requested until then. In a
pipelined loop Triton's pipeliner issues the next steps' loads itself; this matters
where a block runs once (a decode chunk held whole) or a loop is not pipelined. Timed
on an H100 (RESULTS.md, session 46), the held chunks at 8 warps ran 21-26% slower with
both tiles live at once, one at 4 warps 6% faster: the switch stays off.

The pass reads the lines the Emitter wrote: a block's statements, each nested block (a
loop) kept whole after the line that opens it. A load never moves past another load
(they stay in order), a nested block, an atomic, or a statement that assigns a name it
reads or reads the name it assigns (an index tile carried to the next step is loaded
again at the end of the step)."""
from __future__ import annotations

import re

_LOAD = re.compile(r"(\w+) = tl\.load\((\w+)_ptr\b")
_ASSIGNED = re.compile(r"^\s*(\w+) = |^\s*for (\w+) in ")
_NAME = re.compile(r"[A-Za-z_]\w*")
# Stores are passed: a kernel writes only buffers it does not read this way, and the
# launcher never binds an output to an input's memory. An atomic or a barrier orders
# this program against others.
_FENCES = ("tl.atomic_", "tl.debug_barrier(", ".load(")


def issued_early(lines: list[str], read_only: set[str]) -> list[str]:
    """`lines` (one block's, unindented) with each load of a buffer in `read_only`
    (names without `_ptr`) moved up as far as it may go."""
    placed: list[list[str]] = []
    for unit in _units(lines):
        load = _LOAD.match(unit[0]) if len(unit) == 1 else None
        if load is None or load.group(2) not in read_only:
            placed.append(unit)
            continue
        target, reads = load.group(1), set(_NAME.findall(unit[0].split("=", 1)[1]))
        at = len(placed)
        while at and _may_pass(placed[at - 1], target, reads):
            at -= 1
        placed.insert(at, unit)
    return [line for unit in placed for line in unit]


def _units(lines: list[str]) -> list[list[str]]:
    """Statements, a nested block's lines with the line that opens it."""
    units: list[list[str]] = []
    for line in lines:
        if units and line[:1].isspace():
            units[-1].append(line)
        else:
            units.append([line])
    return units


def _may_pass(unit: list[str], target: str, reads: set[str]) -> bool:
    first = unit[0]
    if len(unit) > 1 or first.rstrip().endswith(":") or any(f in first for f in _FENCES):
        return False
    assigned = {name for line in unit if (m := _ASSIGNED.match(line)) for name in m.groups() if name}
    return not (assigned & reads) and target not in _NAME.findall(first)
