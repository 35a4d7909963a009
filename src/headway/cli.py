"""The ``headway`` command line: parse, call one library function, map errors to exit codes.

Exit codes: 0 success; 1 a check failed; 2 a usage or configuration error (one line that
names the key path, the value and the fix).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from headway import __version__, native
from headway.core.errors import HeadwayError
from headway.verbs import VERBS


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line that names the verb that refused it (a
    subverb's unknown argument is its own error, not the top level's) and where to look:
    ``headway emulate: error: unrecognized arguments: --gpus x (did you mean --gpu?);
    see `headway emulate --help```. Verbs' parsers inherit it (``add_subparsers``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}{self._did_you_mean(extra)}")
        return parsed, extra

    def _did_you_mean(self, extra: list[str]) -> str:
        options = [o for action in self._actions for o in action.option_strings]
        for word in extra:
            name = word.split("=", 1)[0]
            if name.startswith("-"):
                close = difflib.get_close_matches(name, options, n=1)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of ``verb`` (None: of every verb)."""
    parser = _Parser(
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
    if verb in VERBS:  # only the verb's own module loads: a load generator must start fast
        importlib.import_module(VERBS[verb].module).register(subparsers)
    else:  # --help, no verb or an unknown one: list the verbs without importing them
        for name, known in VERBS.items():
            subparsers.add_parser(name, help=known.help, add_help=False)
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
