"""The ``headway plan`` verb.

``headway plan WORKLOAD [--analytic-only] [--json] [--out DIR]`` prints the plan (a table,
or JSON with ``--json``) and writes ``plan.json`` and ``report.html`` to ``--out``
(default ``headway-out/<workload name>``; with ``--json`` files are written only when
``--out`` is given).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from headway.files.output import write_text_atomic
from headway.files.workload import load_workload
from headway.planner.analytic import plan_analytic
from headway.planner.render import plan_to_builtins, plan_to_json, render_terminal
from headway.report.html import render_plan_html


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``plan`` verb."""
    parser = subparsers.add_parser(
        "plan",
        help="how many replicas, where is the knee, what does a burst do",
        description="Plan capacity for a workload: demand, sizing, queueing, bursts.",
    )
    parser.add_argument("workload", metavar="WORKLOAD", help="the workload file (YAML)")
    parser.add_argument(
        "--analytic-only",
        action="store_true",
        help="only the analytic plan (no simulation); today the only kind there is",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for plan.json and report.html"
    )
    parser.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    loaded = load_workload(args.workload)
    plan = plan_analytic(loaded.spec)
    out: Path | None = args.out
    if out is None and not args.json:
        out = Path("headway-out") / loaded.spec.name
    if out is not None:
        write_text_atomic(out / "plan.json", plan_to_json(plan))
        write_text_atomic(out / "report.html", render_plan_html(plan_to_builtins(plan)))
    if args.json:
        sys.stdout.write(plan_to_json(plan))
    else:
        console = Console()
        render_terminal(plan, console)
        if out is not None:
            console.print(f"wrote {out / 'plan.json'} and {out / 'report.html'}")
    return 0
