"""The ``headway workload`` verbs: ``check`` a file, print its JSON ``schema``."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from headway.core.workload.compile import compile_workload
from headway.core.workload.validate import unbounded_classes
from headway.files.reference import workload_json_schema
from headway.files.workload import load_workload
from headway.verbs import VERBS


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``workload`` verb and its sub-verbs."""
    parser = subparsers.add_parser(
        "workload", help=VERBS["workload"].help, description="Work with workload files."
    )
    verbs = parser.add_subparsers(dest="workload_verb", metavar="SUBVERB", required=True)
    check = verbs.add_parser(
        "check",
        help="validate a workload and summarise one compiled run",
        description="Validate a workload file and compile one run to show what it asks "
        "for; warns about a class without a latency SLO.",
    )
    check.add_argument("workload", metavar="WORKLOAD")
    check.add_argument("--seed", type=int, default=None, help="run seed (default: the file's)")
    check.set_defaults(handler=_check)
    schema = verbs.add_parser("schema", help="print the JSON Schema of the workload format")
    schema.set_defaults(handler=_schema)


def _check(args: argparse.Namespace) -> int:
    loaded = load_workload(args.workload)
    run = compile_workload(loaded.spec, seed=args.seed, traces=loaded.traces)
    table = Table(title=f"{loaded.spec.name}: one run of {run.duration_s:g} s (seed {run.seed})")
    for col in ("source", "tasks", "tasks/s", "calls", "calls/task", "mean in", "mean out"):
        table.add_column(col, justify="left" if col == "source" else "right")
    for i, name in enumerate(run.source_names):
        tasks = run.task_source == i
        calls = tasks[run.call_task]
        n_tasks, n_calls = int(tasks.sum()), int(calls.sum())
        table.add_row(
            name,
            str(n_tasks),
            f"{n_tasks / run.duration_s:.3g}",
            str(n_calls),
            f"{n_calls / max(n_tasks, 1):.3g}",
            f"{run.call_input_tokens[calls].mean():.0f}" if n_calls else "—",
            f"{run.call_output_tokens[calls].mean():.0f}" if n_calls else "—",
        )
    Console().print(table)
    for name in unbounded_classes(loaded.spec):
        sys.stderr.write(
            f"headway: warning: classes.{name}.slo names no latency bound (ttft_s, tpot_s "
            "or e2e_s): every latency meets it, so `plan` and `sweep --search` refuse the "
            f"file until a class has one; add e.g. `classes.{name}.slo: {{ttft_s: 2.0, "
            "tpot_s: 0.1}`\n"
        )
    return 0


def _schema(args: argparse.Namespace) -> int:
    del args
    sys.stdout.write(json.dumps(workload_json_schema(), indent=2) + "\n")
    return 0
