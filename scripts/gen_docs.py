"""Regenerate the generated parts of the docs: the workload key reference and JSON Schema,
the drill catalog in ``docs/drills.md``, and the metric tables of ``docs/gateway.md`` and
``docs/emulate.md`` (from ``headway.metrics_catalog``).

Run ``python scripts/gen_docs.py``; ``tests/unit/test_docs.py`` fails when they are stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from headway.drill.describe import catalog_markdown
from headway.files.reference import reference_markdown, workload_json_schema
from headway.metrics_catalog import (
    EMULATOR,
    GATEWAY,
    GATEWAY_AUTOSCALER,
    GATEWAY_POOL,
    GATEWAY_RECEIPTS,
    GATEWAY_SHARED_BUDGETS,
    GATEWAY_STATIC_UPSTREAMS,
    GATEWAY_TICKETS,
    MetricSpec,
)

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- BEGIN GENERATED REFERENCE (scripts/gen_docs.py) -->"
END = "<!-- END GENERATED REFERENCE -->"


def expected_workload_md(current: str) -> str:
    """``docs/workload.md`` with its generated section brought up to date."""
    head, _, rest = current.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n\n{reference_markdown()}\n{END}{tail}"


DRILLS_BEGIN = "<!-- BEGIN GENERATED DRILLS (scripts/gen_docs.py) -->"
DRILLS_END = "<!-- END GENERATED DRILLS -->"


def expected_drills_md(current: str) -> str:
    """``docs/drills.md`` with its drill catalog brought up to date."""
    head, _, rest = current.partition(DRILLS_BEGIN)
    _, _, tail = rest.partition(DRILLS_END)
    return f"{head}{DRILLS_BEGIN}\n\n{catalog_markdown()}\n{DRILLS_END}{tail}"


METRICS_BEGIN = "<!-- BEGIN GENERATED METRICS (scripts/gen_docs.py) -->"
METRICS_END = "<!-- END GENERATED METRICS -->"


def metrics_table(groups: list[tuple[str, tuple[MetricSpec, ...]]]) -> str:
    """A Markdown table of the metrics of ``groups`` (``(when, specs)``)."""
    lines = ["| Metric | Kind | Labels | Help |", "| --- | --- | --- | --- |"]
    for when, specs in groups:
        for spec in specs:
            labels = ", ".join(f"`{k}`" for k in spec.labels)
            help_text = spec.help.replace("|", "\\|") + (f" ({when})" if when else "")
            lines.append(f"| `{spec.name}` | {spec.kind} | {labels} | {help_text} |")
    return "\n".join(lines) + "\n"


def expected_metrics_md(current: str, table: str) -> str:
    """A doc with its generated metric table brought up to date."""
    head, _, rest = current.partition(METRICS_BEGIN)
    _, _, tail = rest.partition(METRICS_END)
    return f"{head}{METRICS_BEGIN}\n\n{table}\n{METRICS_END}{tail}"


METRIC_TABLES = {
    "gateway.md": [
        ("", GATEWAY),
        ("without `pool:`", GATEWAY_STATIC_UPSTREAMS),
        ("with `--redis`", GATEWAY_SHARED_BUDGETS),
        ("", GATEWAY_TICKETS),
        ("with `receipts:`", GATEWAY_RECEIPTS),
        ("with `pool:`", GATEWAY_POOL),
        ("with `autoscaler:`", GATEWAY_AUTOSCALER),
    ],
    "emulate.md": [("", EMULATOR)],
}
"""The docs with a metric table, and what each lists."""


def expected_schema() -> str:
    """The text of ``docs/workload.schema.json``."""
    return json.dumps(workload_json_schema(), indent=2) + "\n"


def main() -> int:
    """Write the generated docs."""
    md = ROOT / "docs" / "workload.md"
    md.write_text(expected_workload_md(md.read_text(encoding="utf-8")), encoding="utf-8")
    (ROOT / "docs" / "workload.schema.json").write_text(expected_schema(), encoding="utf-8")
    drills = ROOT / "docs" / "drills.md"
    drills.write_text(expected_drills_md(drills.read_text(encoding="utf-8")), encoding="utf-8")
    for name, groups in METRIC_TABLES.items():
        doc = ROOT / "docs" / name
        text = expected_metrics_md(doc.read_text(encoding="utf-8"), metrics_table(groups))
        doc.write_text(text, encoding="utf-8")
    print("updated docs/workload.md, docs/workload.schema.json, docs/drills.md and the metric")
    print("tables of docs/gateway.md and docs/emulate.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
