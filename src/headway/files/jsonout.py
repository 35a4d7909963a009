"""Result values as JSON: builtins with floats rounded to 10 significant digits.

Rounding keeps files readable (13.799999999999999 is written 13.8) and stable across
platforms; 10 digits is far below any figure's meaningful precision.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec


def round_floats(value: Any, digits: int = 10) -> Any:
    """Round every float in nested builtins to ``digits`` significant digits."""
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return value
        return round(value, digits - 1 - math.floor(math.log10(abs(value))))
    if isinstance(value, dict):
        return {k: round_floats(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [round_floats(v, digits) for v in value]
    return value


def to_builtins(value: Any) -> Any:
    """A result value as JSON-ready builtins, floats rounded."""
    return round_floats(msgspec.to_builtins(value))


def to_json(value: Any) -> str:
    """A result value as indented JSON text (infinities written as null)."""
    data = to_builtins(value)
    return msgspec.json.format(msgspec.json.encode(data), indent=2).decode() + "\n"
