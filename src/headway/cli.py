"""The ``headway`` command line: parse, call one library function, map errors to exit codes.

Exit codes: 0 success; 1 a check failed; 2 a usage or configuration error (one line that
names the key path, the value and the fix).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from headway import __version__
from headway.bench import commands as bench_commands
from headway.calibrate import commands as calibrate_commands
from headway.core.errors import HeadwayError
from headway.emulate import commands as emulate_commands
from headway.files import commands as workload_commands
from headway.planner import commands as plan_commands
from headway.report import commands as report_commands
from headway.sim import commands as sim_commands
from headway.trace import commands as trace_commands


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every verb."""
    parser = argparse.ArgumentParser(
        prog="headway",
        description="LLM serving capacity as a queue: plan, simulate, and read traces.",
        epilog="Exit codes: 0 success; 1 a check failed; 2 a usage or configuration error "
        "(one line naming the key path, the value and the fix). Docs: docs/ in the repository.",
    )
    parser.add_argument("--version", action="version", version=f"headway {__version__}")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    plan_commands.register(subparsers)
    report_commands.register(subparsers)
    sim_commands.register(subparsers)
    trace_commands.register(subparsers)
    workload_commands.register(subparsers)
    emulate_commands.register(subparsers)
    calibrate_commands.register(subparsers)
    bench_commands.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args))
    except HeadwayError as exc:
        print(f"headway: error: {exc}", file=sys.stderr)
        return 2
