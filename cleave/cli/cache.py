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
    from ..runtime import cache

    if args.action == "clear":
        n = cache.clear()
        print(f"removed {n} cached operator(s) from {cache.cache_dir()}")
        return 0
    rows = cache.entries()
    print(f"cache: {cache.cache_dir()} ({len(rows)} operator(s))")
    for r in rows:
        state = "" if r["ok"] else "  DAMAGED (rebuilt on next use)"
        dyn = ",".join(r["dynamic"]) or "-"
        print(f"  {r['key']}  {r['name']:<24} dynamic={dyn:<10} specs={r['specs']} device={r['device']} "
              f"{r['bytes'] / 1024:.1f} KiB{state}")
    return 0
