"""On-disk artifacts: plain JSON plus the generated Triton `.py` files, never pickle.

Layout of one cached operator (a directory named by its key, see cache.py):

    operator.json          the graph, the search's candidates (text form), search stats
    spec-<hash>/plans.json the top-k plans for one binding of the static symbols, and the
                           candidate they schedule (a cache hit reads no operator.json)
    spec-<hash>/kernels/<sha>.py   each kernel's Triton source, named by its hash
    spec-<hash>/tuning.json        per-shape-bucket plan rankings (GPU autotuning)

Every JSON file carries the sha256 of its body and every kernel file is listed
with its sha256, so a truncated or tampered entry is detected on read. Every
write is atomic (storage.write_atomic).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
import warnings
from pathlib import Path

from ..ir import CleaveError
from ..storage import write_atomic

FORMAT = 2  # 2: plans.json holds the candidate it schedules


class ArtifactError(CleaveError):
    """A cache entry is missing, truncated, or does not match its checksum."""


class ArtifactMissing(ArtifactError):
    """No entry yet: the normal cold path, not damage."""


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(body) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def write_json(path: Path, body: dict) -> None:
    write_atomic(path, json.dumps({"format": FORMAT, "sha256": sha256(_canonical(body)), "body": body},
                                  indent=1, sort_keys=True))


def read_json(path: Path) -> dict:
    try:
        wrapper = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactMissing(f"{path} is missing") from None
    except (OSError, ValueError) as err:
        raise ArtifactError(f"{path} is unreadable ({err.__class__.__name__}: {err})") from None
    if not isinstance(wrapper, dict) or wrapper.get("format") != FORMAT or "body" not in wrapper:
        raise ArtifactError(f"{path} is not a cleave artifact of format {FORMAT}")
    if sha256(_canonical(wrapper["body"])) != wrapper.get("sha256"):
        raise ArtifactError(f"{path} does not match its checksum")
    return wrapper["body"]


def write_kernel(spec_dir: Path, source: str) -> dict:
    digest = sha256(source)
    path = spec_dir / "kernels" / f"{digest[:24]}.py"
    existing = _text(path)
    if existing is None or sha256(existing) != digest:
        write_atomic(path, source)
    return {"file": f"kernels/{path.name}", "sha256": digest}


def read_kernel(spec_dir: Path, entry: dict) -> str:
    path = spec_dir / entry["file"]
    source = _text(path)
    if source is None:
        raise ArtifactError(f"{path} is missing or not text")
    if sha256(source) != entry["sha256"]:
        raise ArtifactError(f"{path} does not match its checksum")
    return source


def _text(path: Path) -> str | None:
    """A kernel file's source; None where it is missing or its bytes are not UTF-8 (damage
    that a rebuild rewrites)."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def spec_name(static: dict[str, int]) -> str:
    return "spec-" + sha256(_canonical(static))[:16]


def save_spec(entry: Path, static: dict[str, int], body: dict, sources: list[list[str]]) -> None:
    """Kernel files first, plans.json last: plans.json is the commit record."""
    spec_dir = entry / spec_name(static)
    kernels = [[write_kernel(spec_dir, src) for src in plan_sources] for plan_sources in sources]
    write_json(spec_dir / "plans.json", {**body, "static": static, "kernels": kernels})


def load_spec(entry: Path, static: dict[str, int]) -> tuple[dict, list[list[str]]]:
    spec_dir = entry / spec_name(static)
    body = read_json(spec_dir / "plans.json")
    if body.get("static") != static:
        raise ArtifactError(f"{spec_dir} holds plans for another binding")
    sources = [[read_kernel(spec_dir, k) for k in plan] for plan in body["kernels"]]
    return body, sources


def _tuning_item(item):
    """A ranking's plan index, or a kernel's pick: an index or [index, warps, stages]."""
    return int(item) if not isinstance(item, list) else [int(i) for i in item]


def load_tuning(entry: Path, static: dict[str, int]) -> dict[str, list]:
    """Per shape bucket, plan indices fastest first (an older entry's single choice
    reads as a ranking of one), and per bucket with a mix its per-kernel picks
    (cleave.runtime.mix)."""
    try:
        buckets = read_json(entry / spec_name(static) / "tuning.json")["buckets"]
        return {k: [v] if isinstance(v, int) else [_tuning_item(i) for i in v] for k, v in buckets.items()}
    except (ArtifactError, KeyError, TypeError, ValueError):
        return {}  # no choices yet, or a damaged file: re-tuning rebuilds it


def save_tuning(entry: Path, static: dict[str, int], buckets: dict[str, list]) -> None:
    path = entry / spec_name(static) / "tuning.json"
    merged = {**load_tuning(entry, static), **buckets}  # keep choices another process made
    write_json(path, {"buckets": merged})


# The key fields an artifact entry must share with an operator to serve it, as a
# mismatch names them. The others (device, versions, cleave's source hash) need not
# match: the candidates are device-independent and the plans target the GPU model.
MATCHED = {"graph": "graph", "dynamic": "dynamic axes", "rules": "rules", "f32_matmul": "f32 MatMul precision"}
# What an entry without the field was built at: the key leaves f32_matmul out at torch's
# default, "highest" (CompiledOperator), and entries from before the field existed ran
# their f32 dots in IEEE f32, which is "highest" too.
BUILT_AT = {"f32_matmul": "highest"}
_NEW: set[Path] = set()  # entries find_operator placed in this process: no mismatch to report


class ArtifactMismatch(ArtifactError):
    """An artifact directory holds no operator for this program (graph, dynamic axes,
    rules, f32 MatMul precision), and the search that would build one is not installed."""


def _matched(fields: dict) -> dict:
    return {k: fields.get(k, BUILT_AT.get(k)) for k in MATCHED}


def find_operator(root: Path, fields: dict) -> Path:
    """The entry of an artifact directory (built elsewhere, e.g. on a CPU box by
    `cleave trace build`) holding this graph with these dynamic axes, rules and f32
    MatMul precision, whatever device and versions built it: the candidates are
    device-independent and the plans target the GPU model, not the build machine. A
    different triton version is warned about (the kernels are Triton source, compiled
    here). No match: a new entry under root, which the search fills, with a warning
    naming what the nearest entry differs in; where the search (egglog, z3) is not
    installed, ArtifactMismatch says so in one line instead."""
    from .cache import operator_key

    root = Path(root)
    want, others = _matched(fields), []
    for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        try:
            body = read_json(d / "operator.json")
            built = body["fields"]
            have = _matched(built)
        except (ArtifactError, KeyError, TypeError, AttributeError):
            continue
        if have == want:
            if built.get("triton") != fields["triton"]:
                warnings.warn(f"cleave: artifact {d} was built with triton {built.get('triton')}, "
                              f"this is triton {fields['triton']}", stacklevel=_outside_cleave())
            return d
        if d.resolve() not in _NEW:
            others.append((d, body, have))
    entry = root / operator_key(fields)
    what = _mismatch(root, want, others)
    missing = _search_missing()
    if missing and not entry.is_dir():
        raise ArtifactMismatch(f"{what}, and the search that would build one needs {' and '.join(missing)}, "
                               f"not installed here: build the artifact again where they are (`cleave trace "
                               f"build`, or compiled.prepare) with this program's shapes and settings")
    if others:
        warnings.warn(f"cleave: {what}; searching, and writing a new entry into {root}",
                      stacklevel=_outside_cleave())
    _NEW.add(entry.resolve())
    return entry


def _mismatch(root: Path, want: dict, others: list) -> str:
    """What the artifact holds against what was asked: the entry differing in the
    fewest of the MATCHED fields, and in what."""
    if not others:
        return f"artifact {root} holds no operator"
    d, body, have = min(others, key=lambda o: sum(o[2][k] != want[k] for k in MATCHED))
    parts = []
    for k, label in MATCHED.items():
        if have[k] == want[k]:
            continue
        if k == "graph":
            parts.append(f"graph (it holds {body.get('name', '?')} of {_inputs(body.get('graph', ''))})")
        elif k == "rules":
            parts.append("rules (" + " vs ".join("the library" if v is None else f"rules {str(v)[:12]}"
                                                 for v in (have[k], want[k])) + " asked)")
        else:
            parts.append(f"{label} ({_shown(have[k])} there, {_shown(want[k])} here)")
    return (f"artifact {root} holds no operator for this program: {len(others)} entr"
            f"{'y' if len(others) == 1 else 'ies'}, the nearest ({d.name}) differing in " + "; ".join(parts))


def _shown(value) -> str:
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list) else str(value)


def _inputs(text: str) -> str:
    """The inputs of a graph's text form, as `q bf16[b,4,1,16]`."""
    found = re.findall(r'input\(name="([^"]+)".*?:\s*(\S+)\s*$', text, flags=re.M)
    return "inputs " + ", ".join(f"{name} {ty}" for name, ty in found) if found else "another graph"


def _search_missing() -> list[str]:
    """The search's packages that are not installed here (a serving box has torch and
    triton only); found without importing them."""
    out = []
    for name in ("egglog", "z3"):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def _outside_cleave() -> int:
    """The stacklevel of the first frame outside cleave: the user's line (or the cleave
    command's entry point) rather than cleave's internals."""
    package = str(Path(__file__).resolve().parents[1]) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(package):
        frame, level = frame.f_back, level + 1
    return level
