"""`cleave rules list|test|verify`: the rule library (name, family, phases, reason), its
examples run through the search, its proofs."""
from __future__ import annotations

import sys

from ..ir import CleaveError


def register(sub) -> None:
    p = sub.add_parser("rules", help="list, test and verify the rewrite rules", description="Inspect the rule library.")
    rsub = p.add_subparsers(dest="rules_command", metavar="SUBCOMMAND")
    lp = rsub.add_parser("list", help="list rules: name, family, phases, reason")
    lp.add_argument("files", nargs="*", help="rule files to list instead of the library")
    lp.set_defaults(func=_list)
    tp = rsub.add_parser("test", help="run each rule's examples through the search",
                         description="Each rule must fire on its 'rewrites:' examples and must not on its "
                                     "'keeps:' examples; a rule needs at least one of each.")
    tp.add_argument("files", nargs="*", help="rule files to test instead of the library")
    tp.set_defaults(func=_test)
    from ..verify.cli import add_verify_parser

    add_verify_parser(rsub)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _rules(files: list[str]) -> list:
    from cleave import rules

    found = [r for f in files for r in rules.load_file(f)] if files else rules.all_rules()
    if not found:
        raise CleaveError(f"no rules in {', '.join(files)}")
    return found


def _list(args) -> int:
    from cleave.rules import phases_of

    found = _rules(args.files)
    width = max(len(r.name) for r in found)
    for r in found:
        print(f"{r.name:<{width}}  {r.family:<13}  {','.join(phases_of(r)):<15}  {r.reason}")
    return 0


def _test(args) -> int:
    from ..search.examples import failures

    found = _rules(args.files)
    width = max(len(r.name) for r in found)
    print(f"{'rule':<{width}}  examples  verdict")
    problems, failing = [], 0
    for r in found:
        wrong = failures(r)
        print(f"{r.name:<{width}}  {len(r.examples):>8}  {'FAILED' if wrong else 'ok'}", flush=True)
        problems += wrong
        failing += bool(wrong)
    print(f"{len(found) - failing}/{len(found)} rules pass their examples")
    for line in problems:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if problems else 0
