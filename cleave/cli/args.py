"""argparse types shared by the subcommands. A bad value fails while parsing, before
any work, with argparse's line naming the option:
`cleave optimize: error: argument --top-k: must be >= 1, got 0`."""
from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < math.inf:  # also false for nan
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def shape_binding(text: str) -> tuple[str, int]:
    """SYM=N, N >= 1: an extent of 0 is a legal tensor size, but there is nothing to
    tile at it, so a plan ranked there means nothing (and the cost model fails on it)."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected SYM=N, got {text!r}")
    try:
        extent = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}={value!r}: N must be an integer") from None
    if extent < 1:
        raise argparse.ArgumentTypeError(f"{name}={extent}: extents must be >= 1 to schedule at")
    return name, extent
