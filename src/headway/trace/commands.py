"""The ``headway trace`` verbs: ``stats FILE [--format F] [--json]`` and
``fit FILE -o WORKLOAD.yaml [--bin-s S] [--max-pairs N] [--seed N]``.

Each sub-verb is one ``_add_<verb>(verbs)`` function that adds its parser and sets
``handler`` (``args -> exit code``) with ``set_defaults``; :func:`register` calls them in
turn. A :class:`~headway.core.errors.TraceError` is left to propagate: the main CLI prints
it and exits with 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headway.core.errors import ConfigError
from headway.trace.readers import FORMATS, read_trace
from headway.trace.stats import trace_stats


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``trace`` verb and its sub-verbs to the main CLI's ``subparsers``."""
    parser = subparsers.add_parser(
        "trace",
        help="read and describe request traces",
        description="Read request traces (Azure CSV, Mooncake JSONL, generic CSV/JSONL).",
    )
    verbs = parser.add_subparsers(dest="trace_verb", metavar="SUBVERB", required=True)
    _add_stats(verbs)
    _add_fit(verbs)


def _add_format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        dest="trace_format",
        choices=FORMATS,
        default="auto",
        help="trace format (default: detect from the file)",
    )


def _add_stats(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = verbs.add_parser(
        "stats",
        help="summary statistics of a trace (rates, burstiness, token lengths, prefix reuse)",
        description="Print the summary statistics of a trace file (.gz is fine).",
    )
    parser.add_argument("file", metavar="FILE", help="the trace file")
    _add_format_option(parser)
    parser.add_argument(
        "--json", action="store_true", help="print the statistics as JSON instead of a table"
    )
    parser.set_defaults(handler=_stats)


def _stats(args: argparse.Namespace) -> int:
    """``headway trace stats``: print the statistics as a table or as JSON; exit code 0."""
    trace = read_trace(args.file, args.trace_format)
    stats = trace_stats(trace)
    if args.json:
        sys.stdout.write(json.dumps(stats, indent=1) + "\n")
        return 0
    from rich.console import Console  # only the table needs rich; keep --json light
    from rich.table import Table

    caption = None
    if trace.tick_s is not None:
        caption = (
            f"timestamps are quantised to ~{trace.tick_s:.3g} s ticks: the 1 s peak and the "
            "IAT CV describe the rounding, not sub-second burstiness"
        )
    table = Table(title=f"{trace.name} ({trace.kind})", caption=caption)
    table.add_column("statistic", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for key, value in stats.items():
        if key in ("name", "kind"):
            continue
        if isinstance(value, dict):
            for name, item in value.items():
                table.add_row(f"{key}.{name}", _format_value(item))
        else:
            table.add_row(key, _format_value(value))
    Console().print(table)
    return 0


def _format_value(value: object) -> str:
    """A statistic for the table: thousands separators, at most 6 significant digits."""
    if value is None:
        return "n/a"
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:,.6g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def _add_fit(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = verbs.add_parser(
        "fit",
        help="write a workload that reproduces a trace's rate profile and token lengths",
        description=(
            "Fit a workload file to a trace: a rate schedule per --bin-s window with the "
            "trace's burstiness, and its joint (input, output) token distribution."
        ),
    )
    parser.add_argument("file", metavar="FILE", help="the trace file")
    _add_format_option(parser)
    parser.add_argument(
        "-o", "--output", type=Path, required=True, help="the workload file to write (YAML)"
    )
    parser.add_argument("--bin-s", type=float, default=10.0, help="schedule step (default 10 s)")
    parser.add_argument(
        "--max-pairs", type=int, default=4000, help="token pairs kept (default 4000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fitted workload")
    parser.set_defaults(handler=_fit)


def _fit(args: argparse.Namespace) -> int:
    """``headway trace fit``: write the fitted workload; exit code 0."""
    from headway.files.output import write_text_atomic
    from headway.files.workload import dump_workload
    from headway.trace.fit import fit_workload

    if args.bin_s <= 0:
        raise ConfigError(f"--bin-s must be > 0 (got {args.bin_s}); try 60")
    if args.max_pairs < 1:
        raise ConfigError(f"--max-pairs must be >= 1 (got {args.max_pairs}); try 4000")
    trace = read_trace(args.file, args.trace_format)
    spec = fit_workload(trace, bin_s=args.bin_s, max_pairs=args.max_pairs, seed=args.seed)
    header = f"# {spec.description}\n# headway trace fit {args.file} -o {args.output}\n"
    write_text_atomic(args.output, header + dump_workload(spec))
    sys.stdout.write(f"wrote {args.output}\n")
    return 0
