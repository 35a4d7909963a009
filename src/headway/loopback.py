"""Loopback ports for the servers headway starts (Redis, vLLM, the drills' engines).

A server that a drill kills and starts again must get its port back. A port the kernel
handed out for ``bind(0)`` lies in its ephemeral range, where any outgoing connection may
take it as a source port meanwhile (a keep-alive connection can hold it for minutes: "address
already in use" on restart, seen in ``drill all`` on a loaded CI host). :func:`free_port`
picks a free port below that range instead, where only an explicit bind can land.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_LOWEST = 20_000
"""Below this lie the ports other software commonly takes on purpose."""


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii")
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A loopback TCP port that nothing uses now, outside the ephemeral range where the
    range allows (else one the kernel picks)."""
    low, high = _LOWEST, _ephemeral_low()
    candidates = random.sample(range(low, high), min(200, max(high - low, 0)))
    for port in [*candidates, 0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            found: int = s.getsockname()[1]
            return found
    raise OSError("no free loopback port")  # pragma: no cover - port 0 always binds
