"""Where cleave's warnings point: the user's line, past cleave's and torch's frames."""
from __future__ import annotations

import os
import sys

import torch

import cleave

# cleave's own files (its rules and scheduler are installed from folders of their own) and torch's
_INTERNAL = tuple(os.path.realpath(os.path.dirname(path)) + os.sep for path in (cleave.__file__, torch.__file__))


def _user_level() -> int:
    """warnings.warn's stacklevel, called from the function that warns, that names the
    first frame outside cleave and torch (the user's call of the compiled function or
    model), where it named a line of cleave's runtime."""
    from cleave import rules, scheduler

    internal = _INTERNAL + tuple(os.path.realpath(os.path.dirname(m.__file__)) + os.sep for m in (rules, scheduler))
    frame, level = sys._getframe(2), 2  # level 1 is the function that warns
    while frame.f_back is not None and _internal(frame.f_code.co_filename, internal):
        frame, level = frame.f_back, level + 1
    return level


def _internal(filename: str, internal: tuple[str, ...]) -> bool:
    """A file of cleave's or torch's, or the code torch.fx generates for a graph
    (`<eval_with_key>.1`: a split graph's regions are called from it)."""
    return filename.startswith("<eval_with_key>") or os.path.realpath(filename).startswith(internal)
