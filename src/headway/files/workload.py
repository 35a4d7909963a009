"""Read and write workload files (YAML), with errors that name the key path and the fix.

Loading also reads every trace file the workload refers to (replayed sources, empirical
distributions taken from a trace), relative to the workload file, so that the core never
touches a file.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import yaml

from headway.core.errors import WorkloadError
from headway.core.struct_paths import UNKNOWN_FIELD, fields_at
from headway.core.trace_data import TraceData
from headway.core.workload import spec as spec_types
from headway.core.workload.spec import (
    Empirical,
    JointTokens,
    TaskClass,
    Tenant,
    TraceReplay,
    WorkloadSpec,
)
from headway.core.workload.validate import validate_workload
from headway.trace.readers import read_trace


@dataclass(frozen=True, slots=True)
class LoadedWorkload:
    """A workload spec with the trace files it refers to, already read."""

    spec: WorkloadSpec
    path: Path | None
    traces: dict[str, TraceData] = field(default_factory=dict)


def _all_field_names() -> set[str]:
    names: set[str] = set()
    for name, obj in vars(spec_types).items():
        if name.startswith("_"):
            continue  # the families' private base (its tag is its class name)
        if isinstance(obj, type) and issubclass(obj, msgspec.Struct):
            names.update(obj.__struct_fields__)
    return names


_MISSING = re.compile(r"Object missing required field `(?P<key>[^`]+)`")
_AT = re.compile(r"^(?P<msg>.*?)(?: - at `(?P<path>[^`]+)`)?$", re.S)


def explain_validation_error(
    error: msgspec.ValidationError, source: str, data: Any = None
) -> WorkloadError:
    """Turn a msgspec error into a :class:`WorkloadError` with the path first and a fix."""
    match = _AT.match(str(error))
    message = match.group("msg") if match else str(error)
    path = (match.group("path") if match else None) or "$"
    hint = ""
    unknown = UNKNOWN_FIELD.search(message)
    if unknown:
        key = unknown.group("key")
        known = fields_at(WorkloadSpec, path, data) or _all_field_names()
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.5)
        message = f"unknown key `{key}`"
        hint = f"did you mean `{close[0]}`? " if close else ""
        hint += "See docs/workload.md for the keys each section accepts."
        path = f"{path}.{key}" if path != "$" else f"$.{key}"
    elif _MISSING.search(message):
        key = _MISSING.search(message).group("key")  # type: ignore[union-attr]
        message = f"required key `{key}` is missing"
        hint = "Add it (see docs/workload.md)."
    elif message.startswith("Invalid value") and path.endswith((".dist", ".process")):
        kind = "dist" if path.endswith(".dist") else "process"
        options = _tag_options(kind)
        hint = f"Use one of: {', '.join(options)}."
    elif message.startswith("Expected"):
        hint = "Fix the value's type (numbers without quotes; see docs/workload.md)."
        value = _value_at(path, data)
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            hint = f"{value!r} is text here (quoted?): write the number without quotes"
    text = _one_line(f"{source}: {path}: {message}" + (f". {hint}" if hint else ""))
    return WorkloadError(text, path=path)


_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _value_at(path: str, data: Any) -> Any:
    """The value at a ``$.a.b[0]`` path in ``data``, or ``None``."""
    node = data
    for key, index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path[1:]):
        if key and isinstance(node, dict):
            node = node.get(key)
        elif index and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        else:
            return None
    return node


def _tag_options(kind: str) -> list[str]:
    field_name = "dist" if kind == "dist" else "process"
    out = []
    for name, obj in vars(spec_types).items():
        if name.startswith("_"):
            continue  # the families' private base (its tag is its class name)
        if isinstance(obj, type) and issubclass(obj, msgspec.Struct):
            cfg = obj.__struct_config__
            if cfg.tag_field == field_name and isinstance(cfg.tag, str):
                out.append(cfg.tag)
    return sorted(set(out))


def parse_workload(data: Any, source: str = "<workload>") -> WorkloadSpec:
    """Validate already-parsed data (a dict) as a workload; raises :class:`WorkloadError`."""
    if not isinstance(data, dict):
        raise WorkloadError(
            f"{source}: $: a workload must be a mapping with keys such as `name`, `classes` "
            f"and `sources` (got {type(data).__name__})"
        )
    _check_named_sections(data, source)
    try:
        spec = msgspec.convert(data, WorkloadSpec)
    except msgspec.ValidationError as error:
        raise explain_validation_error(_name_dict_keys(error, data), source, data) from None
    try:
        return validate_workload(spec)
    except WorkloadError as error:
        raise WorkloadError(_one_line(f"{source}: {error}"), path=error.path) from None


def _one_line(text: str) -> str:
    """``text`` with control characters (from a key such as ``"a\\nb"``) escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


_NAMED_SECTIONS: dict[str, type[msgspec.Struct]] = {
    "classes": TaskClass,
    "tenants": spec_types.Tenant,
    "routes": spec_types.Route,
    "services": spec_types.Service,
}


def _check_named_sections(data: dict[str, Any], source: str) -> None:
    """Validate each entry of the name-keyed sections on its own, so errors name the entry.

    msgspec reports a path inside a dict value as ``$.classes[...]``; checking entries one
    by one lets the message say ``$.classes.chat`` instead.
    """
    for section, kind in _NAMED_SECTIONS.items():
        entries = data.get(section)
        if not isinstance(entries, dict):
            continue
        for key, value in entries.items():
            try:
                msgspec.convert(value, kind)
            except msgspec.ValidationError as error:
                # A backtick in the key would end msgspec's `...` path early: shown escaped.
                shown = str(key).replace("`", "\\x60")
                prefix = f"$.{section}.{shown}"
                text = str(error).replace(" - at `$", f" - at `{prefix}", 1)
                if " - at `" not in text:
                    text = f"{text} - at `{prefix}`"
                raise explain_validation_error(
                    msgspec.ValidationError(text), source, data
                ) from None


def _name_dict_keys(error: msgspec.ValidationError, data: Any) -> msgspec.ValidationError:
    """Replace ``[...]`` (a dict key msgspec does not name) with the offending key."""
    match = _AT.match(str(error))
    path = match.group("path") if match else None
    if not path or "[...]" not in path:
        return error
    node: Any = data
    resolved = "$"
    for part in re.findall(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]", path[1:]):
        key, index = part
        if key:
            node = node.get(key) if isinstance(node, dict) else None
            resolved += f".{key}"
        elif index == "...":
            bad = (
                next(
                    (k for k, v in (node or {}).items() if not isinstance(v, int | float) or v < 0),
                    None,
                )
                if isinstance(node, dict)
                else None
            )
            if bad is None:
                return error
            node = node[bad]
            resolved += f".{bad}"
        else:
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
            resolved += f"[{index}]"
    return msgspec.ValidationError(f"{match.group('msg') if match else error} - at `{resolved}`")


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; syntax errors name the line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: no such file; check the path") from None
    except UnicodeDecodeError as error:
        line = error.object[: error.start].count(b"\n") + 1
        raise WorkloadError(
            f"{path}: not UTF-8 text (line {line}, byte {error.start}); save the file as UTF-8"
        ) from None
    except OSError as error:  # a directory, no permission
        raise WorkloadError(f"{path}: cannot be read ({error.strerror or error})") from None
    try:
        loader = _SafeLoader(text)
    except yaml.reader.ReaderError as error:  # a control character
        line = text[: error.position].count("\n") + 1
        raise WorkloadError(
            f"{path}: line {line}: character {chr(error.character)!r} is not allowed in YAML; "
            "remove it"
        ) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node_graph(node, path)
        return loader.construct_document(node)
    except RecursionError:
        raise WorkloadError(
            f"{path}: the YAML is nested too deeply to read (over {MAX_YAML_DEPTH} levels)"
        ) from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        raise WorkloadError(f"{path}: YAML syntax error at {where}: {error.problem}") from None
    except yaml.YAMLError as error:
        one_line = " ".join(str(error).split())
        raise WorkloadError(f"{path}: YAML error: {one_line}") from None
    finally:
        loader.dispose()


MAX_YAML_DEPTH = 64
"""Deepest nesting of mappings and sequences read from a YAML file."""
MAX_YAML_EXPANDED_NODES = 1_000_000
"""Most nodes a YAML file may expand to through aliases (a "billion laughs" is refused)."""


class _SafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose unreadable scalars (``!!int ''``, ``2023-13-45``, an
    integer of 5000 digits) fail as YAML errors that name the line, not as ``ValueError``,
    and that reads YAML 1.2's floats too: PyYAML follows YAML 1.1, where ``1e8``,
    ``1.0e8`` and ``2.5E-3`` (no dot, or no sign in the exponent) are text, so a number
    written the way every other tool writes it was refused as "not a number"."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, IndexError, KeyError, TypeError, OverflowError) as error:
            shown = repr(node.value)[:40] if isinstance(node, yaml.ScalarNode) else "the value"
            raise yaml.constructor.ConstructorError(
                None, None, f"{shown} ({node.tag}) cannot be read ({error})", node.start_mark
            ) from None


_YAML12_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
"""YAML 1.2 floats with an exponent that YAML 1.1's pattern misses (those with a dot and a
signed exponent, and those without an exponent, it reads already)."""
_SafeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))


def _check_node_graph(root: yaml.Node, path: Path) -> None:
    """Refuse alias cycles, alias bombs and deep nesting before anything is constructed.

    Walks the composed node graph once per distinct node (iteratively), computing each
    node's depth and expanded size as if every alias were copied.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = _children(node)
        if children_done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if depth[key] > MAX_YAML_DEPTH:
                raise WorkloadError(
                    f"{path}: the YAML at line {node.start_mark.line + 1} is nested more than "
                    f"{MAX_YAML_DEPTH} levels deep; a workload needs a few"
                )
            if size[key] > MAX_YAML_EXPANDED_NODES:
                raise WorkloadError(
                    f"{path}: the YAML at line {node.start_mark.line + 1} expands through "
                    f"aliases to over {MAX_YAML_EXPANDED_NODES} values (an alias bomb?); "
                    "write the values out or use fewer aliases"
                )
            continue
        if key in size:
            continue
        if key in on_path:
            raise WorkloadError(
                f"{path}: the YAML at line {node.start_mark.line + 1} refers to itself through "
                "an alias; a workload cannot be recursive"
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_workload(path: str | Path) -> LoadedWorkload:
    """Read a workload file and the traces it refers to."""
    path = Path(path)
    spec = parse_workload(read_yaml(path), str(path))
    return resolve_traces(spec, path.parent, str(path))


def resolve_traces(spec: WorkloadSpec, base_dir: Path, source: str) -> LoadedWorkload:
    """Read the traces ``spec`` refers to (relative to ``base_dir``) and inline the
    empirical distributions taken from traces."""
    cache: dict[str, TraceData] = {}

    def get(rel: str, fmt: str = "auto", columns: dict[str, str] | None = None) -> TraceData:
        if rel not in cache:
            target = Path(rel) if Path(rel).is_absolute() else base_dir / rel
            if not target.exists():
                raise WorkloadError(
                    f"{source}: trace file {rel!r} not found (looked in {target}); paths are "
                    "relative to the workload file"
                )
            cache[rel] = read_trace(target, fmt, columns)
        return cache[rel]

    traces: dict[str, TraceData] = {}
    for src in spec.sources:
        if isinstance(src.arrivals, TraceReplay):
            replay = src.arrivals
            traces[replay.path] = get(replay.path, replay.format, replay.columns)
    spec = _with_trace_tenants(spec, traces)
    classes = {name: _inline_class(cls, get) for name, cls in spec.classes.items()}
    if classes != spec.classes:
        spec = msgspec.structs.replace(spec, classes=classes)
    return LoadedWorkload(
        spec=spec, path=None if source.startswith("<") else Path(source), traces=traces
    )


def _inline_class(cls: TaskClass, get: Any) -> TaskClass:
    changes: dict[str, Any] = {}
    for name in ("input_tokens", "output_tokens"):
        dist = getattr(cls, name)
        if isinstance(dist, Empirical) and dist.trace is not None:
            trace = get(dist.trace)
            values = getattr(trace, dist.field).astype(np.float64).tolist()
            changes[name] = msgspec.structs.replace(dist, trace=None, values=values)
    joint = cls.joint_tokens
    if isinstance(joint, JointTokens) and joint.trace is not None:
        trace = get(joint.trace)
        pairs = list(zip(trace.input_tokens.tolist(), trace.output_tokens.tolist(), strict=True))
        changes["joint_tokens"] = msgspec.structs.replace(joint, trace=None, pairs=pairs)
    return msgspec.structs.replace(cls, **changes) if changes else cls


class _CompactDumper(yaml.SafeDumper):
    """Writes lists of plain numbers or strings on one line (``[374, 44]``)."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any] | tuple[Any, ...]) -> yaml.Node:
    scalar = all(isinstance(x, int | float | str | bool) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", list(data), flow_style=scalar)


def _represent_dict(dumper: yaml.SafeDumper, data: dict[Any, Any]) -> yaml.Node:
    scalar = len(data) <= 4 and all(isinstance(v, int | float | str | bool) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=scalar or None)


_CompactDumper.add_representer(list, _represent_list)
_CompactDumper.add_representer(dict, _represent_dict)
_CompactDumper.add_representer(tuple, _represent_list)


def dump_workload(spec: WorkloadSpec) -> str:
    """The YAML text of a workload (defaults left out, so files stay short)."""
    data = msgspec.to_builtins(spec, order="deterministic")
    text: str = yaml.dump(
        _drop_defaults(spec, data), Dumper=_CompactDumper, sort_keys=False, width=100
    )
    return text


def _drop_defaults(obj: Any, data: Any) -> Any:
    """Recursively remove keys whose value equals the field default."""
    if isinstance(obj, msgspec.Struct) and isinstance(data, dict):
        out = {}
        info = msgspec.inspect.type_info(type(obj))
        defaults = {
            f.encode_name: f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
            for f in getattr(info, "fields", ())
            if f.default is not msgspec.NODEFAULT or f.default_factory is not msgspec.NODEFAULT
        }
        for key, value in data.items():
            attr = getattr(obj, key, None)
            if key in defaults and attr == defaults[key]:
                continue
            out[key] = _drop_defaults(attr, value)
        return out
    if isinstance(obj, dict) and isinstance(data, dict):
        return {k: _drop_defaults(obj.get(k), v) for k, v in data.items()}
    if isinstance(obj, list) and isinstance(data, list):
        return [_drop_defaults(o, d) for o, d in zip(obj, data, strict=True)]
    return data


def _with_trace_tenants(spec: WorkloadSpec, traces: Mapping[str, TraceData]) -> WorkloadSpec:
    """``spec`` with the tenants its replayed traces name and ``tenants`` does not list,
    each with a ``share`` of its token work in those traces (as ``trace fit`` gives them),
    so that a trace of fifty tenants replays without listing them by hand. When the file
    lists no tenants at all, the implicit ``default`` tenant gives way to them."""
    work: dict[str, float] = {}
    for src in spec.sources:
        if not isinstance(src.arrivals, TraceReplay):
            continue
        trace = traces.get(src.arrivals.path)
        if trace is None or trace.tenant is None:
            continue
        names, _, _, tokens = trace.tenant_work()
        for name, amount in zip(names, tokens.tolist(), strict=True):
            if name not in spec.tenants:
                work[name] = work.get(name, 0.0) + amount
    if not work:
        return spec
    total = sum(work.values())
    added = {
        name: Tenant(share=round(amount / total, 6) if total > 0 else 1.0)
        for name, amount in sorted(work.items())
    }
    implicit = list(spec.tenants) == ["default"] and spec.tenants["default"] == Tenant()
    unused = implicit and all(
        isinstance(s.arrivals, TraceReplay) or (s.tenants and "default" not in s.tenants)
        for s in spec.sources
    )
    tenants = dict(added) if unused else {**spec.tenants, **added}
    return msgspec.structs.replace(spec, tenants=tenants)
