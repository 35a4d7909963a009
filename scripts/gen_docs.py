"""Regenerate the generated parts of the docs: the workload key reference and JSON Schema,
and the drill catalog in ``docs/drills.md``.

Run ``python scripts/gen_docs.py``; ``tests/unit/test_docs.py`` fails when they are stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from headway.drill.describe import catalog_markdown
from headway.files.reference import reference_markdown, workload_json_schema

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
    print("updated docs/workload.md, docs/workload.schema.json and docs/drills.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
