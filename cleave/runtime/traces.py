"""FlashInfer-Trace files: operator definitions (JSON) and workloads (JSONL).

A definition names its axes (`const` with a value, or `var`), its inputs and
outputs with shapes written in axis names and dtypes, and a `reference`: Python
source defining `run(...)`. Each workload line binds every var axis:
`{"definition": NAME, "workload": {"uuid": ..., "axes": {...}, "inputs": {...}}}`.
Definitions live in `definitions/NAME.json` beside the `workloads/` folder.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..ir import CleaveError
from ..ir.dtypes import dtype as ir_dtype


class TraceError(CleaveError):
    """A trace file does not follow the FlashInfer-Trace format."""


def validate_definition(d: dict) -> None:
    if not isinstance(d, dict):
        raise TraceError(f"a definition is a JSON object, not {type(d).__name__}")
    for key in ("name", "op_type", "axes", "inputs", "outputs", "reference"):
        if key not in d:
            raise TraceError(f"definition {d.get('name', '?')!r}: missing field {key!r}")
    _check_definition_objects(d)
    for axis, spec in d["axes"].items():
        kind = spec.get("type")
        if kind not in ("const", "var"):
            raise TraceError(f"definition {d['name']}: axis {axis!r} has type {kind!r} (const or var)")
        value = spec.get("value")
        if kind == "const" and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise TraceError(f"definition {d['name']}: const axis {axis!r} needs a positive int value")
    for part in ("inputs", "outputs"):
        for name, t in d[part].items():
            unknown = [a for a in t.get("shape") or [] if a not in d["axes"]]  # null: a scalar (sm_scale)
            if unknown:
                raise TraceError(f"definition {d['name']}: {part[:-1]} {name!r} uses undeclared axes {unknown}")
            try:
                ir_dtype(t.get("dtype"))
            except ValueError:
                raise TraceError(f"definition {d['name']}: {part[:-1]} {name!r} has dtype {t.get('dtype')!r}") from None
    if "def run(" not in d["reference"]:
        raise TraceError(f"definition {d['name']}: reference must define run(...)")
    try:
        compile(d["reference"], f"<reference of {d['name']}>", "exec")
    except SyntaxError as err:
        raise TraceError(f"definition {d['name']}: its reference does not parse ({err.msg}, line {err.lineno})") \
            from None


def _check_definition_objects(d: dict) -> None:
    """The parts of a definition that the checks read by key are JSON objects, and its
    reference is text."""
    for key in ("axes", "inputs", "outputs"):
        if not isinstance(d[key], dict):
            raise TraceError(f"definition {d['name']!r}: {key!r} is not a JSON object but {type(d[key]).__name__}")
        bad = [name for name, spec in d[key].items() if not isinstance(spec, dict)]
        if bad:
            raise TraceError(f"definition {d['name']!r}: {key} {bad} are not JSON objects")
    if not isinstance(d["reference"], str):
        raise TraceError(f"definition {d['name']!r}: reference is not a string but {type(d['reference']).__name__}")


def validate_workload(line: dict, definition: dict) -> None:
    if line.get("definition") != definition["name"]:
        raise TraceError(f"workload names definition {line.get('definition')!r}, not {definition['name']!r}")
    w = line.get("workload") or {}
    _check_objects(w)
    which = f"workload {w['uuid']}" if "uuid" in w else "a workload without a uuid"
    axes = w.get("axes", {})
    var = {a for a, s in definition["axes"].items() if s["type"] == "var"}
    if set(axes) != var:
        raise TraceError(f"{which}: binds {sorted(axes)}, the var axes are {sorted(var)}")
    # JSON's true is a Python bool, which is an int: it is no extent
    bad = [a for a, v in axes.items() if not (isinstance(v, int) and not isinstance(v, bool) and v > 0)]
    if bad:
        raise TraceError(f"{which}: axes {bad} are not positive ints")
    if set(w.get("inputs", {})) != set(definition["inputs"]):
        raise TraceError(f"{which}: inputs {sorted(w.get('inputs', {}))} do not match the definition")
    for name, how in w["inputs"].items():
        if how.get("type") in ("scalar", "inline"):
            given_numbers(f"{which}: input {name!r}", how)


def given_numbers(where: str, how: dict) -> int:
    """How many numbers a "scalar" or "inline" input holds: a number, or nested lists of
    numbers (replay checks the count against the shape at the axes it runs)."""
    if "value" not in how:
        raise TraceError(f"{where}: a {how['type']!r} input has no \"value\"")
    count, stack = 0, [how["value"]]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            count += 1
        else:
            raise TraceError(f"{where}: value holds {v!r:.40}, not a number")
    return count


def _check_objects(w) -> None:
    """The parts of a workload that the checks read by key are JSON objects."""
    if not isinstance(w, dict):
        raise TraceError(f"\"workload\" is not a JSON object but {type(w).__name__}")
    for key in ("axes", "inputs"):
        if not isinstance(w.get(key, {}), dict):
            raise TraceError(f"workload {w.get('uuid')}: {key!r} is not a JSON object")
    bad = [name for name, spec in w.get("inputs", {}).items() if not isinstance(spec, dict)]
    if bad:
        raise TraceError(f"workload {w.get('uuid')}: inputs {bad} are not JSON objects")


def load_definition(path: Path) -> dict:
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise TraceError(f"cannot read definition {path}: {err}") from None
    validate_definition(d)
    return d


def load_trace(path: str | Path) -> tuple[dict, list[dict]]:
    """(definition, workload lines) of a JSONL trace; the definition is found in
    ../definitions/NAME.json relative to the JSONL file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"no trace file {path}") from None
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not a text file (JSON lines in UTF-8): byte {err.start} is "
                         f"{err.object[err.start:err.start + 1]!r}") from None
    except IsADirectoryError:
        raise TraceError(f"{path} is a directory, not a trace file") from None
    numbered = []
    for i, t in enumerate(text.splitlines(), 1):
        if not t.strip():
            continue
        try:
            numbered.append((i, json.loads(t)))
        except ValueError as err:
            raise TraceError(f"{path}:{i}: the line is not JSON ({err.msg} at column {err.colno})") from None
    if not numbered:
        raise TraceError(f"{path} holds no workloads")
    for i, line in numbered:
        _check_line(line, f"{path}:{i}")
    lines = [line for _, line in numbered]
    definition = load_definition(path.parent.parent / "definitions" / f"{lines[0]['definition']}.json")
    for i, line in numbered:
        try:
            validate_workload(line, definition)
        except TraceError as err:
            raise TraceError(f"{path}:{i}: {err}") from None
    return definition, lines


def _check_line(line, where: str) -> None:
    """A workload line is an object naming its definition (the name finds the file)."""
    if not isinstance(line, dict):
        raise TraceError(f"{where}: the line is not a JSON object but {type(line).__name__} {line!r:.40}")
    if "definition" not in line:
        raise TraceError(f"{where}: the line has no \"definition\" key")
    if not isinstance(line["definition"], str):
        raise TraceError(f"{where}: \"definition\" is {line['definition']!r:.40}, not a definition's name")


def axis_values(definition: dict, binding: dict[str, int]) -> dict[str, int]:
    values = {a: s["value"] for a, s in definition["axes"].items() if s["type"] == "const"}
    return {**values, **binding}


def reference_fn(definition: dict):
    """The definition's `run` function (the trace's own reference code)."""
    scope: dict = {}
    exec(compile(definition["reference"], f"<reference of {definition['name']}>", "exec"), scope)
    return scope["run"]


# -- sampling for the trace simulators (traces/simulate*.py) --------------------------

def lognormal(rng, spec) -> int:
    """A length drawn log-normally: spec is (median, sigma, least, most)."""
    import math

    median, sigma, lo, hi = spec
    return int(min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma)))))


def poisson(rng, mean: float) -> int:
    """Arrivals in one step (Knuth's method: fine for the small means of a trace)."""
    import math

    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k

