"""``--port`` of the server verbs (``emulate``, ``gateway``): a TCP port, checked at parse.

Kept apart from the servers' modules so that parsing the command line imports no HTTP
stack (``headway --help`` stays fast).
"""

from __future__ import annotations

import argparse

__all__ = ["port_number"]


def port_number(text: str) -> int:
    """A TCP port, 0 to 65535 (0: a free one); otherwise a usage error (exit code 2). The
    socket layer took 99,999 modulo 65,536 and served on 34,463 without a word."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a port number; use 0 to 65535 (0: a free one)"
        ) from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"{port} is not a TCP port; use 0 to 65535 (0: a free one)"
        )
    return port
