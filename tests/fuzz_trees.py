"""Mutating parsed config documents for the file fuzzers: one value replaced, deleted or
added anywhere in the tree, drawn by Hypothesis (shared by the workload, trace and config
file fuzz tests)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

__all__ = ["mutate", "nasty", "paths"]

nasty = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, 0, -0.0, 1e308, 2**63, -(2**63) - 1]),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.none(),
    st.text(max_size=10),
    st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=4), max_size=3),
)
"""Values a config file should never hold: NaN, infinities, huge, negative, wrong types."""


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in ``node`` (the root's is ``()``)."""
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += paths(value, (*prefix, i))
    return out


def mutate(tree: Any, data: st.DataObject, action: str) -> tuple[Any, ...]:
    """Change ``tree`` in place at a drawn path: ``replace`` its value with a nasty one,
    ``delete`` it, or ``add`` a drawn key (or item) beside it. Returns the path."""
    where = data.draw(st.sampled_from([p for p in paths(tree) if p]), label="path")
    parent = tree
    for part in where[:-1]:
        parent = parent[part]
    last = where[-1]
    if action == "replace":
        parent[last] = data.draw(nasty, label="value")
    elif action == "delete":
        del parent[last]
    elif isinstance(parent, dict):
        parent[data.draw(st.text(min_size=1, max_size=12), label="key")] = data.draw(nasty)
    else:
        parent.append(data.draw(nasty, label="value"))
    return where
