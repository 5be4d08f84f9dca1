"""Entry point of the `cleave` console script.

Each subcommand module exposes `register(subparsers)`; it adds its parser and
sets `func(args) -> int`. Errors that cleave raises on purpose, and OS errors on
the files a user names (missing, unreadable, unwritable), become one line on stderr
and exit code 2; warnings one line each, without the path and source line of the code
that raised them.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from .. import __version__
from ..ir import CleaveError

# Subcommand modules, in the order `cleave --help` lists them.
COMMANDS = ("workloads", "show", "explain", "trace", "cache", "bench", "optimize", "rules")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cleave", description="Derive fused GPU kernels from naive tensor programs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  cleave workloads\n  cleave show gqa_decode\n")
    parser.add_argument("--version", action="version", version=f"cleave {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"cleave.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    shown = warnings.formatwarning
    warnings.formatwarning = _one_line(args.command)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # the reader stopped early (`| head`): nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's exit flush would fail again
        return 0
    except (CleaveError, KeyError, ValueError, OSError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"cleave {args.command}: error: {message}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = shown


def _one_line(command: str):
    def formatted(message, category, *_, **__) -> str:
        return f"cleave {command}: {category.__name__}: {message}\n"
    return formatted


if __name__ == "__main__":
    sys.exit(main())
