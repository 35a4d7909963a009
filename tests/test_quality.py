"""Lint, format and type checks run as part of the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    assert found, f"{name} is not installed; run the README's test set-up command"
    return found


# Every folder (and the build hook) of Python code in the repository that ruff checks.
CODE_DIRS = [d for d in ("src", "tests", "benchmarks", "scripts") if (ROOT / d).is_dir()]
CODE_DIRS += [f for f in ("hatch_build.py",) if (ROOT / f).is_file()]


def test_ruff_lint() -> None:
    result = _run(_tool("ruff"), "check", *CODE_DIRS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = _run(_tool("ruff"), "format", "--check", *CODE_DIRS)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_strict() -> None:
    result = _run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr
