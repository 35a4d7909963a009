"""The ``headway`` command line: parse, call one library function, map errors to exit codes.

Exit codes: 0 success; 1 a check failed; 2 a usage or configuration error (one line that
names the key path, the value and the fix).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from headway import __version__, native
from headway.core.errors import HeadwayError

_VERB_MODULES: dict[str, str] = {
    "plan": "headway.planner.commands",
    "report": "headway.report.commands",
    "simulate": "headway.sim.commands",
    "sweep": "headway.sim.commands",
    "trace": "headway.trace.commands",
    "workload": "headway.files.commands",
    "emulate": "headway.emulate.commands",
    "calibrate": "headway.calibrate.commands",
    "bench": "headway.bench.commands",
    "gateway": "headway.gateway.commands",
    "drill": "headway.drill.commands",
}
"""Which module registers each verb. A command imports only its own verb's module (a
load generator must start fast); ``--help`` and unknown verbs import them all."""


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of ``verb`` (None: of every verb)."""
    parser = argparse.ArgumentParser(
        prog="headway",
        description="LLM serving capacity as a queue: plan, simulate, and read traces.",
        epilog="Exit codes: 0 success; 1 a check failed; 2 a usage or configuration error "
        "(one line naming the key path, the value and the fix). Docs: docs/ in the repository.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"headway {__version__} ({native.status().reason})",
    )
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    modules = [_VERB_MODULES[verb]] if verb in _VERB_MODULES else list(_VERB_MODULES.values())
    for name in dict.fromkeys(modules):
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list[0] if args_list else None)
    args = parser.parse_args(args_list)
    if args.verb is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args))
    except HeadwayError as exc:
        print(f"headway: error: {exc}", file=sys.stderr)
        return 2
