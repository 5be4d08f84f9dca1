"""`cleave cache ls|clear`: the on-disk cache of compiled operators."""
from __future__ import annotations

import argparse

EPILOG = """examples:
  cleave cache ls
  cleave cache clear
  CLEAVE_CACHE_DIR=/tmp/cleave-cache cleave cache ls
"""


def register(sub) -> None:
    p = sub.add_parser("cache", help="list or clear compiled operators on disk",
                       description="The cache holds one directory per compiled operator (JSON plus generated "
                                   "Triton .py files). Its location is the user cache dir, or CLEAVE_CACHE_DIR.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    p.add_argument("action", choices=("ls", "clear"))
    p.set_defaults(func=_cache)


def _cache(args) -> int:
    import sys

    from ..runtime import cache
    from ..storage import cache_dir

    root = cache_dir()
    found = next((p for p in (root, *root.parents) if p.exists()), None)
    if found is not None and not found.is_dir():  # it listed "0 operator(s)" there
        print(f"cache: {root} cannot be a directory: {found} is a file (set CLEAVE_CACHE_DIR to a directory)",
              file=sys.stderr)
        return 1
    if args.action == "clear":
        n = cache.clear()
        print(f"removed {n} cached operator(s) from {cache_dir()}")
        return 0
    rows = cache.entries()
    print(f"cache: {cache_dir()} ({len(rows)} operator(s))")
    for r in rows:
        dyn = ",".join(r["dynamic"]) or "-"
        print(f"  {r['key']}  {r['name']:<24} dynamic={dyn:<10} specs={r['specs']} device={r['device']} "
              f"{r['bytes'] / 1024:.1f} KiB")
        if r["damaged"]:
            print(f"    DAMAGED: {r['damaged']}; {_after_damage(r['specs'])}")
    return 0


def _after_damage(specs: int) -> str:
    """What the runtime does with a damaged operator.json (CompiledOperator): a binding
    already scheduled loads its spec without reading it; a new binding needs the
    candidates, so the search runs again and rewrites the file."""
    if not specs:
        return "the next use searches again and rewrites it"
    return f"its {specs} scheduled binding(s) still load; a new binding searches again, which rewrites it"
