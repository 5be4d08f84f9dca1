"""Where compiled operators live on disk, and the key that names one.

The directory is storage.cache_dir(). The key hashes everything that may change the
generated code: the graph's structural hash, its dynamic axes, the device, the
cleave/triton/torch versions and a hash of cleave's source (a development tree changes without a new version).
"""
from __future__ import annotations

import functools
import hashlib
import json
import shutil
from pathlib import Path

import torch

from ..storage import cache_dir


def device_name(device: torch.device | str | None = None) -> str:
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def versions() -> dict[str, str]:
    import triton

    from .. import __version__

    return {"cleave": __version__, "source": source_hash(), "triton": triton.__version__, "torch": torch.__version__}


@functools.cache
def source_hash() -> str:
    """A hash of cleave's own code (the package, its rules and its scheduler): an
    entry built by other code, even under the same version number, is not reused."""
    import cleave.rules
    import cleave.scheduler

    digest = hashlib.sha256()
    for package in (cleave, cleave.rules, cleave.scheduler):
        root = Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def key_fields(graph_key: str, dynamic: set[str], device: str, rules: str | None = None) -> dict:
    """`rules`: the digest of the rules searched with, when not the library alone."""
    fields = {"graph": graph_key, "dynamic": sorted(dynamic), "device": device, **versions()}
    return fields | ({"rules": rules} if rules else {})


def operator_key(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


def entry_dir(key: str) -> Path:
    return cache_dir() / key


def _operator_dirs(root: Path) -> list[Path]:
    """Operator entries only: the cache dir also holds other parts' files (the rule
    verifier keeps its verdicts in verify/), which ls and clear leave alone."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and len(p.name) == 32
                  and all(c in "0123456789abcdef" for c in p.name))


def entries() -> list[dict]:
    """One summary per cached operator (for `cleave cache ls`). `damaged` says why its
    operator.json cannot be read, else None; `specs` counts its scheduled bindings
    either way, since they load without operator.json."""
    from .artifact import ArtifactError, read_json

    out = []
    for d in _operator_dirs(cache_dir()):
        row = {"key": d.name, "name": "?", "device": "?", "dynamic": [], "specs": len(list(d.glob("spec-*"))),
               "bytes": sum(f.stat().st_size for f in d.rglob("*") if f.is_file()), "damaged": None}
        try:
            body = read_json(d / "operator.json")
            row.update(name=body["name"], device=body["fields"]["device"], dynamic=body["fields"]["dynamic"])
        except ArtifactError as err:
            row["damaged"] = str(err)
        except KeyError as err:
            row["damaged"] = f"{d / 'operator.json'} has no field {err}"
        out.append(row)
    return out


def clear() -> int:
    """Remove every cached operator; returns how many were removed. An entry that
    cannot be removed (permissions) raises CleaveError naming it, after the others
    were tried."""
    from ..ir import CleaveError

    found = _operator_dirs(cache_dir())
    failed = []
    for d in found:
        try:
            shutil.rmtree(d)
        except OSError as err:
            failed.append(f"{d} ({err})")
    if failed:
        raise CleaveError(f"removed {len(found) - len(failed)} of {len(found)} cached operator(s); "
                          f"could not remove {'; '.join(failed)}")
    return len(found)
