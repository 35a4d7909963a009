"""A pytest plugin: no server a test started may write a configured secret to its logs.

Every ``headway gateway`` or ``headway emulate`` started through the process helpers
(:class:`headway.server_process.ServerProcess`) keeps what it wrote to stdout and stderr.
After each test (and after each module and the session, for servers their fixtures stop),
the lines written since the last scan, and the server's log files, are searched for every
secret it was configured with (tenant API keys, the admin and metrics tokens, the
cache-salt key, upstream keys; :meth:`ServerProcess.leaks`): one found fails the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from headway.server_process import ServerProcess

_scanned: dict[int, int] = {}
"""Lines of each server's output already scanned, by ``id()``."""


def leaks() -> list[str]:
    """What new log lines of the servers started so far disclose (one line per find)."""
    found: list[str] = []
    for server in list(ServerProcess.started):
        start = _scanned.get(id(server), 0)
        end = len(server.output)
        found += server.leaks(start, end)
        _scanned[id(server)] = end
        if server.proc is not None and server.proc.poll() is not None:
            ServerProcess.started.remove(server)  # stopped, and all of it scanned
            _scanned.pop(id(server), None)
    return found


def _check() -> None:
    found = leaks()
    if found:
        pytest.fail("a server wrote a secret to its logs:\n" + "\n".join(found[:20]))


@pytest.fixture(autouse=True)
def no_secrets_in_server_logs() -> Iterator[None]:
    """After each test: its servers' new log lines hold no configured secret."""
    yield
    _check()


@pytest.fixture(autouse=True, scope="module")
def no_secrets_in_module_server_logs() -> Iterator[None]:
    """After each module (its servers stopped): their last lines hold none either."""
    yield
    _check()


@pytest.fixture(autouse=True, scope="session")
def no_secrets_in_session_server_logs() -> Iterator[None]:
    """After the session: the last lines of servers that session fixtures stopped."""
    yield
    _check()
