"""The ``headway report`` verb: re-render ``report.html`` from a ``plan.json``.

``headway report PLAN.json [--out report.html]`` (default: ``report.html`` beside the
plan). Nothing is re-run: the page is drawn from the file alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from headway.core.errors import ConfigError
from headway.files.output import output_file, write_text_atomic
from headway.report.html import render_plan_html
from headway.verbs import VERBS

SCHEMAS = ("headway.plan/1", "headway.plan.analytic/1")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``report`` verb."""
    parser = subparsers.add_parser(
        "report",
        help=VERBS["report"].help,
        description="Render the self-contained HTML report of a plan.json.",
    )
    parser.add_argument("plan", metavar="PLAN_JSON", type=Path, help="a plan.json file")
    parser.add_argument(
        "--out",
        type=output_file,
        default=None,
        help="the HTML file (default: report.html beside it)",
    )
    parser.set_defaults(handler=_report)


def read_plan(path: Path) -> dict[str, Any]:
    """A plan.json file as data; errors name the file, what is wrong and the fix."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such file; give the plan.json `headway plan` wrote"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"{path}: not JSON ({error}); give the plan.json `headway plan` wrote"
        ) from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema not in SCHEMAS:
        raise ConfigError(
            f"{path}: $.schema is {schema!r}, not a plan ({' or '.join(SCHEMAS)}); give the "
            "plan.json `headway plan` wrote, or re-run `headway plan` to write a new one",
            path="$.schema",
        )
    assert isinstance(data, dict)
    return data


def _report(args: argparse.Namespace) -> int:
    data = read_plan(args.plan)
    out: Path = args.out or args.plan.with_name("report.html")
    write_text_atomic(out, render_plan_html(data))
    Console().print(f"wrote {out}")
    return 0
