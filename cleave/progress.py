"""Progress lines of long work (rule proofs, saturation, compiling plans, tuning).

They go to the "cleave" logger at INFO, which writes them to stderr unless the
application configures it: `logging.getLogger("cleave").setLevel(logging.WARNING)`
silences them, a handler of its own redirects them. `verbose(True/False)` overrides
the level for the work done inside it (`cleave.compile(fn, verbose=...)`).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import sys

logger = logging.getLogger("cleave")
_VERBOSE: contextvars.ContextVar[bool | None] = contextvars.ContextVar("cleave_verbose", default=None)


class _Stderr(logging.StreamHandler):
    """Writes to sys.stderr as it is at each line (redirected, or captured by a test)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _default_handler() -> None:
    """stderr at INFO, unless the application already set up the "cleave" logger."""
    if logger.handlers or logger.level != logging.NOTSET:
        return
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


_default_handler()


def report(line: str) -> None:
    """One progress line, as the logger's level or the current `verbose` says."""
    forced = _VERBOSE.get()
    if forced is False:
        return
    if forced is True and not logger.isEnabledFor(logging.INFO):
        logger.handle(logger.makeRecord(logger.name, logging.INFO, "", 0, line, None, None))
        return
    logger.info(line)


@contextlib.contextmanager
def verbose(value: bool | None):
    token = _VERBOSE.set(value)
    try:
        yield
    finally:
        _VERBOSE.reset(token)
