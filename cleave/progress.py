"""Progress lines of long work (rule proofs, saturation, compiling plans, tuning).

They go to the "cleave" logger at INFO, which writes them to stderr unless the
application configures it: `logging.getLogger("cleave").setLevel(logging.WARNING)`
silences them, a handler of its own redirects them. `verbose(True/False)` overrides
the level for the work done inside it (`cleave.compile(fn, verbose=...)`), whatever
the order of the application's settings and cleave's imports: a line shown that no
handler would take goes to stderr.
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


def _reaches_a_handler() -> bool:
    """Whether an INFO record of the "cleave" logger reaches a handler that takes it, on
    "cleave" or an ancestor it propagates to. Where none does, logging's last resort
    drops it (it takes WARNING and up): so it did when the application set the logger's
    level before cleave.progress was first imported (at the first compile), and
    _default_handler then left the logger to the application."""
    current = logger
    while current is not None:
        if any(logging.INFO >= h.level for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


_FALLBACK = _Stderr()  # verbose lines that no handler of the application's would take
_FALLBACK.setFormatter(logging.Formatter("%(message)s"))


def report(line: str) -> None:
    """One progress line, as the logger's level or the current `verbose` says. A line
    shown (verbose=True, or the level lets INFO through) goes to the application's
    handlers where one takes it, else to stderr: never to both, never to neither."""
    forced = _VERBOSE.get()
    if forced is False:
        return
    enabled = logger.isEnabledFor(logging.INFO)
    if forced is None and not enabled:
        return
    if not _reaches_a_handler():
        _FALLBACK.handle(logger.makeRecord(logger.name, logging.INFO, "", 0, line, None, None))
    elif not enabled:  # forced past the level
        logger.handle(logger.makeRecord(logger.name, logging.INFO, "", 0, line, None, None))
    else:
        logger.info(line)


@contextlib.contextmanager
def verbose(value: bool | None):
    token = _VERBOSE.set(value)
    try:
        yield
    finally:
        _VERBOSE.reset(token)
