"""Read request traces from files into :class:`~headway.core.trace_data.TraceData`.

Three formats, plain or gzip-compressed (detected from the content, not only the name):

``azure``
    The Azure LLM inference trace 2023: CSV with header ``TIMESTAMP,ContextTokens,GeneratedTokens``
    and wall-clock timestamps such as ``2023-11-16 18:15:46.6805900`` (parsed exactly, to the
    nanosecond, without pandas).
``mooncake``
    The Mooncake FAST'25 traces: JSON Lines ``{"timestamp": ms, "input_length": int,
    "output_length": int, "hash_ids": [int, ...]}`` with 512-token prefix blocks.
``generic``
    headway's own format, CSV or JSON Lines with ``timestamp_s`` (seconds; ``timestamp`` is
    accepted as a synonym, also in seconds), ``input_tokens``, ``output_tokens`` and optional
    ``tenant``, ``priority``, ``session_id``, ``prefix_id``.

Rows are sorted by arrival (stably) when the file is not, and arrival times are shifted so
that the first request arrives at 0.0 s. Every problem raises
:class:`~headway.core.errors.TraceError` with the file, the line, the column or key, the bad
value and what was expected, e.g. ``trace.csv line 17: column `input_tokens` has 'abc';
expected a non-negative integer``.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import math
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from headway.core.errors import TraceError
from headway.core.trace_data import PRIORITIES, TraceData, detect_tick_s

FORMATS = ("auto", "azure", "mooncake", "generic")
"""Values of the ``fmt`` argument of :func:`read_trace` (and of ``--format``)."""

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in the Mooncake traces."""

GENERIC_LABEL_COLUMNS = ("tenant", "priority", "session_id", "prefix_id")
_GENERIC_TIME_COLUMNS = ("timestamp_s", "timestamp")
_MAX_TOKENS = 2**53
_MAX_SECONDS = 1e11
"""Largest magnitude of a timestamp in seconds (~3,000 years): keeps bin counts finite."""
_NS_PER_S = 1_000_000_000
_NS_PER_DAY = 86_400 * _NS_PER_S
_AZURE_TIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?",
    re.ASCII,
)
_AZURE_EXAMPLE = "a time like 2023-11-16 18:15:46.6805900"
_COUNT_EXPECTED = "expected a non-negative integer"
_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".json", ".txt")


COLUMN_FIELDS = ("arrival", "input_tokens", "output_tokens", *GENERIC_LABEL_COLUMNS)
"""What a ``columns`` mapping may name: the generic format's fields (``arrival`` is
``timestamp_s``, seconds)."""


def parse_columns(text: str) -> dict[str, str]:
    """``arrival=arrival_s,tenant=client_id`` as a mapping (field -> the file's column);
    a ``TraceError`` naming the fix for a malformed or unknown entry."""
    mapping: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        field, sep, column = part.partition("=")
        field, column = field.strip(), column.strip()
        if not part or not sep or not field or not column:
            raise TraceError(
                f"columns: {part!r} is not FIELD=COLUMN; write e.g. arrival=arrival_s,"
                "tenant=client_id"
            )
        mapping[field] = column
    return mapping


def _check_columns(columns: dict[str, str]) -> dict[str, str]:
    """The file's column -> the generic name, for a ``columns`` mapping."""
    unknown = sorted(set(columns) - set(COLUMN_FIELDS))
    if unknown:
        raise TraceError(
            f"columns: unknown field {unknown[0]!r}; map one of {', '.join(COLUMN_FIELDS)} "
            "to a column of the file (e.g. arrival=arrival_s)"
        )
    renamed = {c: ("timestamp_s" if f == "arrival" else f) for f, c in columns.items()}
    if len(renamed) != len(columns):
        raise TraceError(f"columns: two fields map to one column ({columns})")
    return renamed


def read_trace(
    path: str | Path, fmt: str = "auto", columns: dict[str, str] | None = None
) -> TraceData:
    """Read a trace file in format ``fmt`` (one of :data:`FORMATS`; ``"auto"`` detects it).

    ``auto`` decides from the first non-blank line: the Azure CSV header, a CSV header with
    ``input_tokens`` (generic), or a JSON object with ``input_length`` (Mooncake) or
    ``input_tokens`` (generic). ``columns`` maps the generic format's fields to the file's
    own names (:data:`COLUMN_FIELDS`, e.g. ``{"arrival": "arrival_s", "tenant":
    "client_id"}``): the file is then read as generic.
    """
    source = _Source.load(Path(path))
    if columns:
        if fmt not in ("auto", "generic"):
            raise TraceError(
                f"{source.label}: columns map a generic trace's fields; the {fmt} format has "
                "fixed columns (drop the mapping or use --format generic)"
            )
        return _read_generic(source, _check_columns(columns))
    if fmt == "auto":
        fmt = _detect_format(source)
    if fmt == "azure":
        return _read_azure(source)
    if fmt == "mooncake":
        return _read_mooncake(source)
    if fmt == "generic":
        return _read_generic(source)
    raise TraceError(f"{source.label}: unknown trace format {fmt!r}; expected one of {FORMATS}")


def read_azure_csv(path: str | Path) -> TraceData:
    """Read an Azure LLM inference trace (CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``)."""
    return _read_azure(_Source.load(Path(path)))


def read_mooncake_jsonl(path: str | Path) -> TraceData:
    """Read a Mooncake trace (JSON Lines with ms ``timestamp``, lengths and ``hash_ids``)."""
    return _read_mooncake(_Source.load(Path(path)))


def read_generic(path: str | Path) -> TraceData:
    """Read a generic headway trace, CSV or JSON Lines (decided by name, then by content)."""
    return _read_generic(_Source.load(Path(path)))


# --- the file --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Source:
    """A trace file's decoded text, with the helpers that word error messages."""

    path: Path
    text: str

    @property
    def label(self) -> str:
        return str(self.path)

    @property
    def name(self) -> str:
        """The file name without ``.gz``, the format suffix and a trailing ``_trace``.

        ``mooncake_fast25_conversation_trace.jsonl.gz`` is ``mooncake_fast25_conversation``,
        as the shared ``trace_stats.json`` names it.
        """
        name = self.path.name
        if name.lower().endswith(".gz"):
            name = name[:-3]
        for suffix in _SUFFIXES:
            if name.lower().endswith(suffix):
                name = name[: -len(suffix)]
                break
        return name.removesuffix("_trace") or name

    @property
    def looks_like_json(self) -> bool:
        """Whether the file is JSON Lines: by its name, else by its first non-blank line."""
        name = self.name_with_suffix.lower()
        if name.endswith((".jsonl", ".ndjson", ".json")):
            return True
        if name.endswith(".csv"):
            return False
        first = next(self.lines(), (0, ""))[1]
        return first.lstrip().startswith("{")

    @property
    def name_with_suffix(self) -> str:
        name = self.path.name
        return name[:-3] if name.lower().endswith(".gz") else name

    @classmethod
    def load(cls, path: Path) -> _Source:
        """Read ``path``, gunzip it if it is gzip data, and decode it as UTF-8."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise TraceError(f"{path}: no such file; check the path") from None
        except IsADirectoryError:
            raise TraceError(f"{path}: is a directory; pass a trace file") from None
        except OSError as exc:
            raise TraceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        if raw[:2] == b"\x1f\x8b":
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError, zlib.error) as exc:
                raise TraceError(
                    f"{path}: is not a complete gzip file ({exc}); re-download or re-compress it"
                ) from None
        elif path.name.lower().endswith(".gz"):
            raise TraceError(
                f"{path}: the name ends in .gz but the content is not gzip-compressed; "
                "compress it with gzip or drop the .gz from the name"
            )
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise TraceError(
                f"{path} line {line}: byte {raw[exc.start]:#04x} is not UTF-8 text; "
                "save the file as UTF-8"
            ) from None
        if not text.strip():
            raise TraceError(f"{path}: the file is empty; a trace needs at least one request")
        return cls(path, text)

    def lines(self) -> Iterator[tuple[int, str]]:
        """Non-blank lines with their 1-based line numbers."""
        for number, line in enumerate(self.text.split("\n"), start=1):
            if line.strip():
                yield number, line

    def error(self, line: int, where: str, value: Any, expected: str) -> TraceError:
        """A ``TraceError`` for a bad ``value`` of ``where`` (a column or key) on ``line``."""
        return TraceError(f"{self.label} line {line}: {where} has {_show(value)}; {expected}")

    def error_at(self, line: int, message: str) -> TraceError:
        """A ``TraceError`` for ``line`` with a free-form ``message``."""
        return TraceError(f"{self.label} line {line}: {message}")


def _show(value: Any) -> str:
    """A value as the user wrote it: strings quoted, JSON values as JSON, cut at 60 chars."""
    if isinstance(value, str):
        shown = repr(value)
    else:
        try:
            shown = msgspec.json.encode(value).decode()
        except (TypeError, msgspec.EncodeError):
            shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _detect_format(source: _Source) -> str:
    """``"azure"``, ``"mooncake"`` or ``"generic"`` from the first non-blank line."""
    line, first = next(source.lines())
    if source.looks_like_json:
        row = _json_object(source, line, first)
        if "input_length" in row:
            return "mooncake"
        if "input_tokens" in row:
            return "generic"
        raise source.error_at(
            line,
            f"cannot tell the trace format from the keys {sorted(row)}; expected Mooncake keys "
            "timestamp, input_length, output_length, hash_ids or generic keys timestamp_s, "
            "input_tokens, output_tokens (or pass --format)",
        )
    try:
        header = _strip_all(next(csv.reader([first])))
    except csv.Error as exc:
        raise source.error_at(line, f"is not valid CSV ({exc})") from None
    if tuple(header) == AZURE_HEADER:
        return "azure"
    if "input_tokens" in header:
        return "generic"
    raise source.error_at(
        line,
        f"cannot tell the trace format from the header {','.join(header)!r}; expected "
        f"{','.join(AZURE_HEADER)} (Azure) or timestamp_s,input_tokens,output_tokens "
        "(generic), or pass --format",
    )


def _strip_all(fields: Sequence[str]) -> list[str]:
    return [field.strip() for field in fields]


# --- CSV -------------------------------------------------------------------------------------


def _csv_rows(source: _Source) -> tuple[int, list[str], list[tuple[int, list[str]]]]:
    """The header's line and names, and every non-blank data row with its line number (the
    line a row starts on: a quoted field may span lines, and a stray quote makes one row
    of the rest of the file)."""
    reader = csv.reader(io.StringIO(source.text, newline=""))
    header: list[str] | None = None
    header_line = 0
    rows: list[tuple[int, list[str]]] = []
    last_line = 0
    try:
        for row in reader:
            line, last_line = last_line + 1, reader.line_num
            if not any(field.strip() for field in row):
                continue
            if header is None:
                header, header_line = _strip_all(row), line
                continue
            if len(row) != len(header):
                raise source.error_at(
                    line,
                    f"has {len(row)} fields but the header has {len(header)} "
                    f"({','.join(header)}); fix the row's commas or quoting",
                )
            rows.append((line, row))
    except csv.Error as exc:
        raise source.error_at(last_line + 1, f"is not valid CSV ({exc})") from None
    if header is None:  # pragma: no cover - _Source.load rejects blank files
        raise TraceError(f"{source.label}: the file is empty")
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise source.error_at(
            header_line, f"the header names column `{duplicates[0]}` twice; keep one"
        )
    if not rows:
        raise source.error_at(
            header_line, "the file has a header but no data rows; a trace needs a request"
        )
    return header_line, header, rows


def _count(source: _Source, line: int, column: str, text: str) -> int:
    """A token count written in CSV: ASCII digits only."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 15:
        raise source.error(line, f"column `{column}`", text, _COUNT_EXPECTED)
    return int(digits)


def _count_column(
    source: _Source, rows: list[tuple[int, list[str]]], index: int, column: str
) -> npt.NDArray[np.int64]:
    return np.array(
        [_count(source, line, column, row[index]) for line, row in rows], dtype=np.int64
    )


def _read_azure(source: _Source) -> TraceData:
    header_line, header, rows = _csv_rows(source)
    if tuple(header) != AZURE_HEADER:
        raise source.error_at(
            header_line,
            f"the header is {','.join(header)!r}; an Azure trace starts with "
            f"{','.join(AZURE_HEADER)} (use --format generic for timestamp_s,input_tokens,...)",
        )
    labels = [row[0].strip() for _, row in rows]
    lines = [line for line, _ in rows]
    arrival_ns = _azure_times_ns(source, labels, lines)
    input_tokens = _count_column(source, rows, 1, AZURE_HEADER[1])
    output_tokens = _count_column(source, rows, 2, AZURE_HEADER[2])
    order = _arrival_order(arrival_ns)
    arrival_ns, input_tokens, output_tokens = (
        arrival_ns[order],
        input_tokens[order],
        output_tokens[order],
    )
    arrival_s = (arrival_ns - arrival_ns[0]) / _NS_PER_S
    return TraceData(
        name=source.name,
        kind="azure",
        arrival_s=arrival_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        first_timestamp=labels[int(order[0])],
        last_timestamp=labels[int(order[-1])],
        tick_s=detect_tick_s(arrival_s),
    )


def _azure_times_ns(source: _Source, labels: list[str], lines: list[int]) -> npt.NDArray[np.int64]:
    """Nanoseconds since the first row's midnight for every wall-clock label, exactly.

    Each distinct date is validated once (a trace covers few days); times of day and the
    1–9 fractional digits are integer arithmetic, so no precision is lost to floats.
    """
    day_ns: dict[str, int] = {}
    first_date = labels[0][:10]
    times = np.empty(len(labels), dtype=np.int64)
    for i, (label, line) in enumerate(zip(labels, lines, strict=True)):
        match = _AZURE_TIME.fullmatch(label)
        if match is None:
            raise source.error(
                line, f"column `{AZURE_HEADER[0]}`", label, f"expected {_AZURE_EXAMPLE}"
            )
        date, hours, minutes, seconds, fraction = match.groups()
        base_ns = day_ns.get(date)
        if base_ns is None:
            base_ns = _date_offset_ns(source, line, date, first_date, label)
            day_ns[date] = base_ns
        h, m, s = int(hours), int(minutes), int(seconds)
        if h > 23 or m > 59 or s > 59:
            raise source.error(
                line,
                f"column `{AZURE_HEADER[0]}`",
                label,
                f"the time of day is out of range; expected {_AZURE_EXAMPLE}",
            )
        frac_ns = int(fraction.ljust(9, "0")) if fraction else 0
        times[i] = base_ns + ((h * 60 + m) * 60 + s) * _NS_PER_S + frac_ns
    return times


def _date_offset_ns(source: _Source, line: int, date: str, first_date: str, label: str) -> int:
    try:
        days = dt.date.fromisoformat(date).toordinal()
        first_days = dt.date.fromisoformat(first_date).toordinal()
    except ValueError:
        raise source.error(
            line,
            f"column `{AZURE_HEADER[0]}`",
            label,
            f"the date is not valid; expected {_AZURE_EXAMPLE}",
        ) from None
    offset_days = days - first_days
    if abs(offset_days) > 100_000:  # keeps the nanosecond count well inside int64
        raise source.error(
            line, f"column `{AZURE_HEADER[0]}`", label, "it is centuries from the first row"
        )
    return offset_days * _NS_PER_DAY


def _arrival_order(arrival: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
    """The stable order that sorts ``arrival`` (the identity when already sorted)."""
    if arrival.size < 2 or bool(np.all(arrival[1:] >= arrival[:-1])):
        return np.arange(arrival.size)
    return np.argsort(arrival, kind="stable")


# --- JSON Lines ------------------------------------------------------------------------------


def _json_object(source: _Source, line: int, text: str) -> dict[str, Any]:
    try:
        row = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise source.error_at(
            line, f"is not valid JSON ({exc}); each line must be one JSON object"
        ) from None
    except RecursionError:
        raise source.error_at(
            line, "is JSON nested too deeply to read; each line must be one flat JSON object"
        ) from None
    if not isinstance(row, dict):
        raise source.error_at(line, f"is {_show(row)}, not a JSON object {{...}}")
    return row


def _json_number(
    source: _Source, line: int, row: dict[str, Any], key: str, limit: float = _MAX_SECONDS
) -> float:
    value = row[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or abs(value) > limit
    ):
        raise source.error(line, f"key `{key}`", value, f"expected a number within ±{limit:g}")
    return float(value)


def _json_count(source: _Source, line: int, row: dict[str, Any], key: str) -> int:
    value = row[key]
    if type(value) is not int or not 0 <= value < _MAX_TOKENS:
        raise source.error(line, f"key `{key}`", value, _COUNT_EXPECTED)
    return value


def _json_label(source: _Source, line: int, row: dict[str, Any], key: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value:
        raise source.error(line, f"key `{key}`", value, "expected a non-empty string")
    if key == "priority" and value not in PRIORITIES:
        raise source.error(line, f"key `{key}`", value, f"expected one of {', '.join(PRIORITIES)}")
    return value


def _require_keys(
    source: _Source, line: int, row: dict[str, Any], keys: Sequence[str], fmt: str
) -> None:
    for key in keys:
        if key not in row:
            raise source.error_at(
                line, f"key `{key}` is missing; every {fmt} line needs {', '.join(keys)}"
            )


class _MooncakeRow(msgspec.Struct):
    """The fast, typed decoding of one Mooncake line (errors are re-checked field by field)."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int] | None = None


_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
_MAX_MS = _MAX_SECONDS * 1000
_MOONCAKE_DECODER = msgspec.json.Decoder(_MooncakeRow)


def _mooncake_row(source: _Source, line: int, text: str) -> _MooncakeRow:
    problem = "timestamp is not finite"
    try:
        row: _MooncakeRow | None = _MOONCAKE_DECODER.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        row, problem = None, str(exc)
    if row is not None and math.isfinite(row.timestamp) and abs(row.timestamp) <= _MAX_MS:
        if row.input_length < 0 or row.input_length >= _MAX_TOKENS:
            raise source.error(line, "key `input_length`", row.input_length, _COUNT_EXPECTED)
        if row.output_length < 0 or row.output_length >= _MAX_TOKENS:
            raise source.error(line, "key `output_length`", row.output_length, _COUNT_EXPECTED)
        return row
    # Slow path: find the field that is wrong and say so.
    obj = _json_object(source, line, text)
    _require_keys(source, line, obj, _MOONCAKE_KEYS, "Mooncake")
    _json_number(source, line, obj, "timestamp", limit=_MAX_MS)
    _json_count(source, line, obj, "input_length")
    _json_count(source, line, obj, "output_length")
    ids = obj.get("hash_ids")
    if ids is not None and not isinstance(ids, list):
        raise source.error(line, "key `hash_ids`", ids, "expected a list of integer block ids")
    for value in ids or ():
        if type(value) is not int or not -(2**63) <= value < 2**63:
            raise source.error(line, "key `hash_ids`", value, "expected integer block ids only")
    raise source.error_at(line, f"is not a valid Mooncake line ({problem})")


def _read_mooncake(source: _Source) -> TraceData:
    lines: list[int] = []
    rows: list[_MooncakeRow] = []
    for line, text in source.lines():
        rows.append(_mooncake_row(source, line, text))
        lines.append(line)
    with_hashes = [row.hash_ids is not None for row in rows]
    if any(with_hashes) and not all(with_hashes):
        line = lines[with_hashes.index(not with_hashes[0])]
        raise source.error_at(
            line,
            "key `hash_ids` is present on some lines and missing on others; "
            "give it on every line or on none",
        )
    timestamp_ms = np.array([row.timestamp for row in rows], dtype=np.float64)
    order = _arrival_order(timestamp_ms)
    timestamp_ms = timestamp_ms[order]
    arrival_s = (timestamp_ms - timestamp_ms[0]) / 1000.0
    hash_ids = None
    if with_hashes[0]:
        try:
            hash_ids = tuple(np.array(rows[i].hash_ids, dtype=np.int64) for i in order)
        except OverflowError:
            bad = next(
                i for i, row in enumerate(rows) if max(map(abs, row.hash_ids or [0])) >= 2**63
            )
            raise source.error_at(
                lines[bad], "key `hash_ids` has an id outside the 64-bit integer range"
            ) from None
    return TraceData(
        name=source.name,
        kind="mooncake",
        arrival_s=arrival_s,
        input_tokens=np.array([rows[i].input_length for i in order], dtype=np.int64),
        output_tokens=np.array([rows[i].output_length for i in order], dtype=np.int64),
        hash_ids=hash_ids,
        hash_block_tokens=MOONCAKE_BLOCK_TOKENS if hash_ids is not None else None,
        tick_s=detect_tick_s(arrival_s),
    )


# --- generic ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _GenericColumns:
    """The generic format's columns while reading, before sorting."""

    time_key: str
    lines: list[int]
    timestamp_s: list[float]
    input_tokens: list[int]
    output_tokens: list[int]
    labels: dict[str, list[str]]
    ignored: list[str]
    """The file's columns (or keys) the reader does not use."""


def _time_key(source: _Source, line: int, names: Sequence[str], what: str) -> str:
    present = [key for key in _GENERIC_TIME_COLUMNS if key in names]
    if len(present) == 2:
        raise source.error_at(
            line, f"both `timestamp_s` and `timestamp` are given; keep one {what} (seconds)"
        )
    if not present:
        raise source.error_at(
            line,
            f"no `timestamp_s` {what}; a generic trace needs timestamp_s (arrival, seconds), "
            "input_tokens and output_tokens",
        )
    return present[0]


def _read_generic(source: _Source, rename: dict[str, str] | None = None) -> TraceData:
    rename = rename or {}
    if source.looks_like_json:
        columns = _generic_jsonl(source, rename)
    else:
        columns = _generic_csv(source, rename)
    timestamp_s = np.array(columns.timestamp_s, dtype=np.float64)
    order = _arrival_order(timestamp_s)
    timestamp_s = timestamp_s[order]
    arrival_s = timestamp_s - timestamp_s[0]

    def label(key: str) -> npt.NDArray[np.object_] | None:
        values = columns.labels.get(key)
        return None if values is None else np.array(values, dtype=object)[order]

    return TraceData(
        name=source.name,
        kind="generic",
        arrival_s=arrival_s,
        input_tokens=np.array(columns.input_tokens, dtype=np.int64)[order],
        output_tokens=np.array(columns.output_tokens, dtype=np.int64)[order],
        tenant=label("tenant"),
        priority=label("priority"),
        session_id=label("session_id"),
        prefix_id=label("prefix_id"),
        tick_s=detect_tick_s(arrival_s),
        ignored_columns=tuple(columns.ignored),
    )


_GENERIC_KNOWN = frozenset((*_GENERIC_TIME_COLUMNS, "input_tokens", "output_tokens",
                            *GENERIC_LABEL_COLUMNS))  # fmt: skip


def _renamed(
    source: _Source, line: int, names: Sequence[str], rename: dict[str, str], what: str
) -> tuple[list[str], list[str]]:
    """The names under the mapping, and those the reader will not use (in file order)."""
    missing = [c for c in rename if c not in names]
    if missing:
        raise source.error_at(
            line,
            f"has no {what} `{missing[0]}` (mapped to `{rename[missing[0]]}`); it has "
            f"{', '.join(names)}",
        )
    out = [rename.get(n, n) for n in names]
    return out, [n for n, o in zip(names, out, strict=True) if o not in _GENERIC_KNOWN]


def _csv_seconds(source: _Source, line: int, column: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or abs(value) > _MAX_SECONDS:
        raise source.error(
            line,
            f"column `{column}`",
            text,
            f"expected a number of seconds within ±{_MAX_SECONDS:g}",
        )
    return value


def _csv_label(source: _Source, line: int, column: str, text: str) -> str:
    value = text.strip()
    if not value:
        raise source.error(
            line, f"column `{column}`", text, "expected a non-empty value (or drop the column)"
        )
    if column == "priority" and value not in PRIORITIES:
        raise source.error(
            line, f"column `{column}`", text, f"expected one of {', '.join(PRIORITIES)}"
        )
    return value


def _generic_csv(source: _Source, rename: dict[str, str]) -> _GenericColumns:
    header_line, header, rows = _csv_rows(source)
    header, ignored = _renamed(source, header_line, header, rename, "column")
    time_key = _time_key(source, header_line, header, "column")
    for key in ("input_tokens", "output_tokens"):
        if key not in header:
            raise source.error_at(
                header_line,
                f"the header has no `{key}` column; a generic trace needs timestamp_s, "
                "input_tokens and output_tokens",
            )

    def column(key: str, parse: Callable[[_Source, int, str, str], Any]) -> list[Any]:
        index = header.index(key)
        return [parse(source, line, key, row[index]) for line, row in rows]

    return _GenericColumns(
        time_key=time_key,
        lines=[line for line, _ in rows],
        timestamp_s=column(time_key, _csv_seconds),
        input_tokens=column("input_tokens", _count),
        output_tokens=column("output_tokens", _count),
        labels={key: column(key, _csv_label) for key in GENERIC_LABEL_COLUMNS if key in header},
        ignored=ignored,
    )


def _generic_jsonl(source: _Source, rename: dict[str, str]) -> _GenericColumns:
    columns: _GenericColumns | None = None
    for line, text in source.lines():
        row = _json_object(source, line, text)
        if columns is None:
            names, ignored = _renamed(source, line, list(row), rename, "key")
            time_key = _time_key(source, line, names, "key")
            present = [key for key in GENERIC_LABEL_COLUMNS if key in names]
            columns = _GenericColumns(
                time_key, [], [], [], [], {key: [] for key in present}, ignored
            )
        if rename:
            row = {rename.get(k, k): v for k, v in row.items()}
        required = (columns.time_key, "input_tokens", "output_tokens")
        _require_keys(source, line, row, required, "generic")
        columns.lines.append(line)
        columns.timestamp_s.append(_json_number(source, line, row, columns.time_key))
        columns.input_tokens.append(_json_count(source, line, row, "input_tokens"))
        columns.output_tokens.append(_json_count(source, line, row, "output_tokens"))
        for key in GENERIC_LABEL_COLUMNS:
            values = columns.labels.get(key)
            if values is not None and key in row:
                values.append(_json_label(source, line, row, key))
            elif values is not None or key in row:
                first = columns.lines[0]
                raise source.error_at(
                    line,
                    f"key `{key}` is {'missing' if values is not None else 'present'} here "
                    f"but {'present' if values is not None else 'missing'} on line {first}; "
                    "give it on every line or on none",
                )
    assert columns is not None  # _Source.load rejects files without a non-blank line
    return columns
