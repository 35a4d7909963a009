"""Pickling frozen dataclasses that mypyc compiled.

Compiled, a class unpickles (and copies) through mypyc's default ``__setstate__``, which
assigns its fields one by one; a frozen dataclass refuses that (``FrozenInstanceError``),
so a step-time profile could not reach a process pool's workers (``plan --jobs``,
``sweep --jobs``). A frozen dataclass of a compiled module therefore defines
``__reduce__`` as :func:`reduce_by_fields`: it is rebuilt by calling its class with its
fields, which also validates it again. So does a value whose ``__init__`` derives
private fields (the roofline: mypyc's unpickling calls ``__init__`` without arguments).
The sources pickle the same way.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

__all__ = ["reduce_by_fields"]


def reduce_by_fields(
    value: Any, names: tuple[str, ...] | None = None
) -> tuple[Callable[[], Any], tuple[()]]:
    """``value.__reduce__()`` for a dataclass: its class called with its fields as
    keywords (``names``: only these, for a class whose ``__init__`` takes fewer)."""
    cls: Callable[..., Any] = type(value)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(value))
    return functools.partial(cls, **{name: getattr(value, name) for name in names}), ()
