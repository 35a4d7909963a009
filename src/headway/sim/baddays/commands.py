"""``headway simulate WORKLOAD --bad-days``: its flags, the matrix with a progress bar, one
table (or ``--json``) and ``bad-days.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from headway import executors
from headway.core.errors import ConfigError
from headway.core.trace_data import TraceData
from headway.core.workload.spec import WorkloadSpec
from headway.files.jsonout import to_json
from headway.files.output import write_text_atomic
from headway.sim.baddays.catalogue import DEFAULT_SCENARIOS, get_scenario
from headway.sim.baddays.cell import BadDayCell
from headway.sim.baddays.matrix import PRESETS, check_presets, run_bad_days
from headway.sim.baddays.table import matrix_notes, matrix_table
from headway.sim.cluster import ClusterSpec
from headway.sim.simulator import SimOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--bad-days`` flags of ``headway simulate``."""
    parser.add_argument(
        "--bad-days",
        action="store_true",
        help="run the bad-day matrix (gateway presets × scenarios) and print one table",
    )
    parser.add_argument(
        "--scenarios",
        default=None,
        help=f"with --bad-days: comma-separated scenarios, a+b composes (default: all: "
        f"{','.join(DEFAULT_SCENARIOS)})",
    )
    parser.add_argument(
        "--presets",
        default=None,
        help=f"with --bad-days: comma-separated gateway presets (default: {','.join(PRESETS)})",
    )
    parser.add_argument(
        "--jobs", type=int, default=None, help="with --bad-days: worker processes (default: CPUs)"
    )
    executors.add_arguments(parser, "the matrix's cells", only_with="--bad-days")


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse the ``--bad-days`` flags without ``--bad-days``."""
    given = [
        flag
        for flag, value in (
            ("--scenarios", args.scenarios),
            ("--presets", args.presets),
            ("--jobs", args.jobs),
            ("--executor", args.executor),
            ("--ray-address", args.ray_address),
        )
        if value is not None
    ]
    if given and not args.bad_days:
        raise ConfigError(f"{', '.join(given)} only apply to the matrix; add --bad-days")


def _names(text: str | None, flag: str, default: Iterable[str]) -> list[str]:
    if text is None:
        return list(default)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"{flag} is empty (got {text!r}); give comma-separated names")
    return names


def command(
    args: argparse.Namespace,
    spec: WorkloadSpec,
    cluster: ClusterSpec,
    traces: Mapping[str, TraceData] | None,
) -> int:
    """``headway simulate WORKLOAD --bad-days``: run the matrix, print one table (or
    ``--json``), write ``bad-days.json`` under ``--out``."""
    scenarios = _names(args.scenarios, "--scenarios", DEFAULT_SCENARIOS)
    presets = _names(args.presets, "--presets", PRESETS)
    for name in scenarios:  # unknown names fail before any simulation starts
        get_scenario(name)
    check_presets(presets)
    jobs = executors.jobs_or_cpus(args.jobs)
    progress = Progress(
        TextColumn("bad days"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    cells = len(scenarios) * len(presets)
    executor = executors.from_arguments(args, jobs=min(jobs, cells))
    try:
        with progress:
            task = progress.add_task("", total=cells)

            def advance(cell: BadDayCell) -> None:
                progress.update(task, advance=1, description=f"{cell.scenario} / {cell.preset}")

            matrix = run_bad_days(
                spec,
                cluster,
                presets=presets,
                scenarios=scenarios,
                load=args.load,
                duration_s=args.duration_s,
                seed=args.seed,
                traces=traces,
                options=SimOptions(skip_decode=not args.no_skip),
                on_cell=advance,
                executor=executor,
            )
    finally:
        executor.close()
    text = to_json(matrix)
    if args.out is not None:
        write_text_atomic(Path(args.out) / "bad-days.json", text)
    if args.json:
        sys.stdout.write(text)
        return 0
    console = Console()
    table = matrix_table(matrix)
    if not console.is_terminal:  # piped or captured: keep each row on one line
        natural = Console(width=1000).measure(table).maximum
        console = Console(width=max(console.width, natural))
    console.print(table)
    for line in matrix_notes(matrix):
        console.print(line, highlight=False)
    if args.out is not None:
        console.print(f"wrote {Path(args.out) / 'bad-days.json'}", highlight=False)
    return 0
