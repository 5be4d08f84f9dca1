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
import json
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
    if not (path.exists() and sha256(path.read_text()) == digest):
        write_atomic(path, source)
    return {"file": f"kernels/{path.name}", "sha256": digest}


def read_kernel(spec_dir: Path, entry: dict) -> str:
    path = spec_dir / entry["file"]
    try:
        source = path.read_text()
    except OSError:
        raise ArtifactError(f"{path} is missing") from None
    if sha256(source) != entry["sha256"]:
        raise ArtifactError(f"{path} does not match its checksum")
    return source


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


def find_operator(root: Path, fields: dict) -> Path:
    """The entry of an artifact directory (built elsewhere, e.g. on a CPU box by
    `cleave trace build`) holding this graph with these dynamic axes and rules, whatever device
    and versions built it: the candidates are device-independent and the plans target
    the GPU model, not the build machine. A different triton version is warned about
    (the kernels are Triton source, compiled here). No match: a new entry under root."""
    from .cache import operator_key

    root = Path(root)
    for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        try:
            built = read_json(d / "operator.json")["fields"]
        except (ArtifactError, KeyError, TypeError):
            continue
        if all(built.get(k) == fields.get(k) for k in ("graph", "dynamic", "rules")):
            if built.get("triton") != fields["triton"]:
                import warnings

                warnings.warn(f"cleave: artifact {d} was built with triton {built.get('triton')}, "
                              f"this is triton {fields['triton']}", stacklevel=2)
            return d
    return root / operator_key(fields)
