"""The exception hierarchy of headway.

::

    HeadwayError
    ├── ConfigError          a user's file or flag is wrong (names the key path, value, fix)
    │   └── WorkloadError    ... in a workload file
    ├── TraceError           a trace file cannot be read as the format it claims
    └── InvalidTransition    a request lifecycle move that the table forbids (a bug)

Overload outcomes (shed, cancelled, timed out) are values, never exceptions.
"""

from __future__ import annotations


class HeadwayError(Exception):
    """Base class of every error headway raises on purpose."""


class ConfigError(HeadwayError):
    """A configuration value is wrong.

    The message says where (a ``$.dotted[0].path``), what was found and how to fix it.
    """

    def __init__(self, message: str, *, path: str = "$") -> None:
        super().__init__(message)
        self.path = path


class WorkloadError(ConfigError):
    """A workload file is wrong."""


class TraceError(HeadwayError):
    """A trace file cannot be read."""


class InvalidTransition(HeadwayError):
    """A request lifecycle transition that the lifecycle table does not allow."""
