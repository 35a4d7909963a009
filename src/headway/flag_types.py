"""argparse ``type`` functions for flags whose range the command line can judge: a bad
value is a usage error (one line, exit code 2) before anything starts.

Kept apart from the verbs' modules so that parsing the command line imports no HTTP stack
or engine model (``headway --help`` stays fast).
"""

from __future__ import annotations

import argparse
import math

__all__ = ["growth_factor", "port_number", "positive_int"]


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


def positive_int(text: str) -> int:
    """A whole number >= 1 (a count of GPUs, blocks, sequences)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; use 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a count; use 1 or more")
    return value


def growth_factor(text: str) -> float:
    """A traffic growth factor, a finite number > 0 (10: tenfold; 0.5: half)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number; use a growth factor > 0 (10 for tenfold traffic)"
        ) from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"{text} is not a finite number above 0; use a growth factor > 0 "
            "(10 for tenfold traffic)"
        )
    return value
