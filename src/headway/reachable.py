"""Is anything listening there? A TCP connect with a timeout, asked before a command that
would otherwise hang or fail at every step on an address nothing answers (``drill
--target``, ``plan --ray-address``)."""

from __future__ import annotations

import socket

__all__ = ["connect_error"]


def connect_error(host: str, port: int, timeout_s: float = 5.0) -> str | None:
    """Why a TCP connection to ``host:port`` fails (``Connection refused``, ``timed out``),
    or None when something accepts it."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__
