"""Validation shared by the policy config types.

A policy config is a frozen ``msgspec.Struct``; its ``__post_init__`` raises
:class:`PolicyConfigError`, which is both a :class:`~headway.core.errors.ConfigError` (the
house hierarchy) and a ``ValueError`` (so that msgspec, when it decodes a config file,
turns it into a ``ValidationError`` with the key path attached).
"""

from __future__ import annotations

import math

from headway.core.errors import ConfigError


class PolicyConfigError(ConfigError, ValueError):
    """A policy config field is invalid; the message names the field, the value and a fix."""


def require(ok: bool, section: str, field: str, value: object, fix: str) -> None:
    """Raise :class:`PolicyConfigError` for ``section.field`` unless ``ok``."""
    if not ok:
        raise PolicyConfigError(
            f"{section}.{field} is invalid (got {value!r}): {fix}", path=f"$.{field}"
        )


def is_finite_at_least(value: float | None, low: float) -> bool:
    """True when ``value`` is None or a finite number >= ``low``."""
    return value is None or (math.isfinite(value) and value >= low)


def is_finite_above(value: float | None, low: float) -> bool:
    """True when ``value`` is None or a finite number > ``low``."""
    return value is None or (math.isfinite(value) and value > low)
