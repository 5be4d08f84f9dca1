"""Where cleave keeps files between runs, and how it writes them.

Compiled operators (runtime/cache.py) and rule verdicts (verify/verdict.py) share one
directory: the user cache dir (platformdirs) unless `CLEAVE_CACHE_DIR` is set. Every
write goes to a temporary file that is then renamed over the target: a reader sees
the old file or the new one, never half of one, and two processes writing the same
file at once both succeed (the last rename wins, both are whole).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    env = os.environ.get("CLEAVE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("cleave"))


_UNWRITABLE: dict[Path, str | None] = {}


def unwritable(root: Path) -> str | None:
    """Why files cannot be written under `root` (None where they can), asked once per
    process: a cache dir under a file, or a read-only one."""
    if root not in _UNWRITABLE:
        try:
            root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=root):
                pass
            _UNWRITABLE[root] = None
        except OSError as err:
            _UNWRITABLE[root] = f"{type(err).__name__}: {err.strerror or err}"
    return _UNWRITABLE[root]


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
