"""An older commit's ``src`` tree, for the benchmarks that measure against it in one run."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository (this file is benchmarks/support/old_source.py)."""


def export_src(rev: str, folder: Path) -> Path:
    """``rev``'s ``src`` under ``folder`` (``git archive``), its path returned."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder / "src"
