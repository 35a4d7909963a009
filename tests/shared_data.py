"""Where the shared data (traces, calibration timings) lives for tests, and how to need it.

The data sits beside the repository (``../shared``), in CI too. A test that needs it calls
:func:`require_shared`: under ``CI=true`` a missing path fails the test, elsewhere it skips.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TRACES = SHARED / "traces"
CALIBRATION = TRACES / "calibration"


def require_shared(path: Path) -> Path:
    """Return ``path``; fail under CI when it is missing, skip otherwise."""
    if not path.exists():
        message = f"{path} is missing (the shared data sits beside the repository)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path
