"""Tests that need a program on the machine (``redis-server``), and a throwaway Redis.

:func:`require_binary` finds the program: under ``CI=true`` a missing one fails the test
(CI installs it), elsewhere the test skips. :class:`RedisServer` runs one
``redis-server`` on a free loopback port, without persistence, for one test; it can be
killed and started again on the same port.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from headway.loopback import free_port
from headway.redis_process import RedisServer as _RedisServer

__all__ = ["RedisServer", "free_port", "require_binary"]


def require_binary(name: str) -> str:
    """The path of program ``name``; fail under CI when it is missing, skip otherwise."""
    found = shutil.which(name) or next(
        (str(p) for d in ("/usr/bin", "/usr/local/bin") if (p := Path(d) / name).is_file()),
        None,
    )
    if found is None:
        message = f"{name} is not installed (CI installs it: see .ci/run)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


class RedisServer(_RedisServer):
    """:class:`headway.redis_process.RedisServer`, failing under CI (skipping elsewhere)
    when ``redis-server`` is missing."""

    def __init__(self, port: int | None = None) -> None:
        super().__init__(port, binary=require_binary("redis-server"))
