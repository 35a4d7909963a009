"""Fixtures: the mock OpenAI-compatible server, started on a free loopback port."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

MockFactory = Callable[..., str]


@pytest.fixture
def mock_server() -> Iterator[MockFactory]:
    """Start ``python -m headway.bench.mock_server`` with extra flags; returns its URL."""
    procs: list[subprocess.Popen[str]] = []

    def start(*flags: str) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-m", "headway.bench.mock_server", "--port", "0", *flags],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        port = json.loads(proc.stdout.readline())["port"]
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.communicate(timeout=10)
