"""`cleave rules list`: the rule library (name, family, reason)."""
from __future__ import annotations

from ..ir import CleaveError


def register(sub) -> None:
    p = sub.add_parser("rules", help="list the rewrite rules", description="Inspect the rule library.")
    rsub = p.add_subparsers(dest="rules_command", metavar="SUBCOMMAND")
    lp = rsub.add_parser("list", help="list rules: name, family, reason")
    lp.add_argument("files", nargs="*", help="rule files to list instead of the library")
    lp.set_defaults(func=_list)
    from ..verify.cli import add_verify_parser

    add_verify_parser(rsub)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _list(args) -> int:
    from cleave import rules

    found = [r for f in args.files for r in rules.load_file(f)] if args.files else rules.all_rules()
    if not found:
        raise CleaveError(f"no rules in {', '.join(args.files)}")
    width = max(len(r.name) for r in found)
    for r in found:
        print(f"{r.name:<{width}}  {r.family:<13}  {r.reason}")
    return 0
