"""`cleave rules verify [FILES]`: one line per rule (rule, method, time, verdict); exit 1
naming each failing rule with its counterexample."""
from __future__ import annotations

import argparse
import math
import sys


def add_verify_parser(rules_subparsers) -> argparse.ArgumentParser:
    p = rules_subparsers.add_parser(
        "verify", help="prove rules sound (z3, sympy, numeric gate)",
        description="Check every rule before saturation loads it: shapes in z3 for every binding, the "
                    "algebra in z3 (sympy where z3 is unsure) on small bindings covering exact splits, "
                    "ragged tails, empty chunks, count = N and count > N, and a randomized numeric gate "
                    "(fp64 with infinities and NaN in the data, then f32). "
                    "Unknown is never proven.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  cleave rules verify\n  cleave rules verify my_rules.txt\n"
               "  cleave rules verify --no-cache --timeout 30")
    p.add_argument("files", nargs="*", help="rule files in the DSL (default: the whole library)")
    p.add_argument("--timeout", type=_seconds, default=10.0, help="seconds per z3 query (default 10)")
    p.add_argument("--rule-timeout", type=_seconds, default=None,
                   help="seconds per rule, building its instances and proving them; past it the rule is "
                        "unknown (default: cleave.verify.check.RULE_SECONDS, 120)")
    p.add_argument("--no-cache", action="store_true", help="re-prove even if a verdict is cached")
    p.set_defaults(func=run_verify)
    return p


def _seconds(text: str) -> float:
    """A timeout: a positive, finite number of seconds (z3 takes whole milliseconds)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value * 1000 >= 1):
        raise argparse.ArgumentTypeError(f"a timeout is a positive number of seconds (at least 0.001), not {text!r}")
    return value


def run_verify(args) -> int:
    from cleave import rules as library

    from .check import check_rule

    # beside the library, as `optimize --rules` and `cleave.compile(rules=)` load them: a
    # name the library has is refused here, not first there
    found = library.with_files(args.files)[1] if args.files else library.all_rules()
    if not found:
        print("no rules to verify", file=sys.stderr)
        return 1
    width = max(len(r.name) for r in found)
    print(f"{'rule':<{width}} {'method':<10} {'time':>8}  verdict")
    failed = []  # (rule, why)
    for r in found:
        limit = {} if args.rule_timeout is None else {"seconds": args.rule_timeout}
        try:
            verdict = check_rule(r, timeout_ms=int(args.timeout * 1000), use_cache=not args.no_cache, **limit)
        except library.RuleError as err:  # this rule does not build: the others are still checked
            print(f"{r.name:<{width}} {'':<10} {'':>8}  error", flush=True)
            failed.append((r, str(err).removeprefix(f"{r.source}: ")))
            continue
        suffix = "  (cached)" if verdict.cached else ""
        print(verdict.line(width) + suffix, flush=True)
        if not verdict.ok:
            failed.append((r, verdict.explain()))
    proven = len(found) - len(failed)
    print(f"{proven}/{len(found)} rules proven")
    for r, why in failed:
        print(f"FAILED {r.source}: {why}", file=sys.stderr)
    return 1 if failed else 0
