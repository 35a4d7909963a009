"""Shared fixtures: paths to the repository, its examples and the shared traces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SHARED = ROOT.parent / "shared"
TRACES = SHARED / "traces"

settings.register_profile("ci", max_examples=60, deadline=None)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")


def require_shared(path: Path) -> Path:
    """Return ``path``; fail under CI when it is missing, skip otherwise."""
    if not path.exists():
        message = f"{path} is missing (the shared data sits beside the repository)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def traces_dir() -> Path:
    """The shared traces folder."""
    return require_shared(TRACES)
