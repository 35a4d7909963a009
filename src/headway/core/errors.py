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

import difflib
from typing import Any

from headway.core.struct_paths import UNKNOWN_FIELD, fields_at


class HeadwayError(Exception):
    """Base class of every error headway raises on purpose."""


class ConfigError(HeadwayError, ValueError):
    """A configuration value is wrong.

    The message says where (a ``$.dotted[0].path``), what was found and how to fix it.
    It is a ``ValueError`` so that one raised by a config type's ``__post_init__`` while
    msgspec decodes a file comes back with the key path it happened at.
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


def config_error(
    error: Exception,
    source: str,
    *,
    hint: str = "",
    root: Any = None,
    data: Any = None,
    docs: str = "",
) -> ConfigError:
    """A msgspec validation or decode error as a :class:`ConfigError` that names the key
    path: ``SOURCE: $.key.path: message`` (msgspec says ``message - at `$.key.path```).
    Given the file's ``root`` type and its ``data``, an unknown key is named at its own
    path with the closest key that section accepts ("did you mean") and ``docs``."""
    message, path = str(error), "$"
    if " - at `" in message:
        message, _, rest = message.partition(" - at `")
        path = rest.rstrip("`")
    unknown = UNKNOWN_FIELD.fullmatch(message)
    if unknown and root is not None:
        key = unknown.group("key")
        close = difflib.get_close_matches(key, sorted(fields_at(root, path, data) or ()), n=1,
                                          cutoff=0.5)  # fmt: skip
        message = f"unknown key `{key}`"
        path = f"{path}.{key}" if path != "$" else f"$.{key}"
        hint = (f"; did you mean `{close[0]}`?" if close else "") + hint
    if docs and not hint.endswith(docs):
        hint += f" (see {docs})"
    # A key or value from the file may hold line breaks or control characters: the
    # message stays one line (they are shown escaped).
    message, path = _one_line(message), _one_line(path)
    return ConfigError(f"{source}: {path}: {message}{hint}", path=path)


def _one_line(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
