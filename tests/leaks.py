"""A socket or file a test leaves open is reported in that test, not in whichever later
test the garbage collector happens to run in.

An unclosed socket's ``ResourceWarning`` is raised when the object is collected, and
pytest (warnings are errors here) fails the test during which that happened: on two CI
runs, tests that open no such socket. Collecting after each test that talks to servers
makes the report land where the leak is (``PYTHONTRACEMALLOC=20`` adds the line that
opened it).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

__all__ = ["collect_after_network_tests"]


@pytest.fixture(autouse=True)
def collect_after_network_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test under ``tests/e2e`` or a fuzz test, collect garbage, so that what it
    left open warns (and fails) in it."""
    yield
    path = str(request.node.path)
    if "/tests/e2e/" in path or "/tests/unit/fuzz/" in path:
        gc.collect()
