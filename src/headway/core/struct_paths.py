"""Key paths into msgspec structs: which keys a section of a file accepts, for the
"did you mean" of an unknown key (workload, cluster and gateway files alike)."""

from __future__ import annotations

import re
from typing import Any

import msgspec

__all__ = ["UNKNOWN_FIELD", "fields_at"]

# Greedy: the unknown key may itself hold a backtick.
UNKNOWN_FIELD = re.compile(r"Object contains unknown field `(?P<key>.+)`", re.S)
"""msgspec's message for a key the struct does not have."""


def fields_at(root: Any, path: str, data: Any) -> set[str] | None:
    """The field names of the struct found at ``path`` (``$.a.b[0]``) in ``data`` decoded as
    ``root``, following the types (unions resolved against the data); None if none."""
    if data is None:
        return None
    node_type: Any = msgspec.inspect.type_info(root)
    node: Any = data
    parts = re.findall(r"\.([^.\[]+)|\[(\d+)\]", path[1:])
    for key, index in [*parts, ("", "")]:
        node_type = _pick_struct(node_type, node)
        if not key and not index:
            break
        if isinstance(node_type, msgspec.inspect.StructType) and key:
            fields = {f.encode_name: f.type for f in node_type.fields}
            if key not in fields:
                return None
            node_type, node = fields[key], node.get(key) if isinstance(node, dict) else None
        elif isinstance(node_type, msgspec.inspect.DictType) and key:
            node_type, node = (
                node_type.value_type,
                node.get(key) if isinstance(node, dict) else None,
            )
        elif isinstance(node_type, msgspec.inspect.ListType) and index:
            i = int(index)
            node_type = node_type.item_type
            node = node[i] if isinstance(node, list) and i < len(node) else None
        else:
            return None
    if isinstance(node_type, msgspec.inspect.StructType):
        return {f.encode_name for f in node_type.fields}
    return None


def _pick_struct(node_type: Any, node: Any) -> Any:
    """Resolve a union (``X | None`` or a tagged union) against the data found there."""
    if not isinstance(node_type, msgspec.inspect.UnionType):
        return node_type
    structs = [t for t in node_type.types if isinstance(t, msgspec.inspect.StructType)]
    for struct in structs:
        tag_field = struct.tag_field
        if tag_field is None or (isinstance(node, dict) and node.get(tag_field) == struct.tag):
            return struct
    return node_type
