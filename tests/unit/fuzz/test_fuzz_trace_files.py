"""Property-based fuzzing of the trace readers (Azure CSV, Mooncake JSONL, generic).

Hypothesis writes trace files with wrong columns and keys, NaN, negative, huge and
non-integer numbers, wrong JSON types, random and invalid-UTF-8 bytes, truncated gzip and
byte-level mutations of valid files. The guarantee: :func:`read_trace` returns a sane
trace (sorted arrivals from 0, non-negative counts, statistics computable) or raises a
:class:`TraceError` whose one-line message names the file and, for a row's problem, the
line and the column or key; ``headway trace stats FILE`` then exits 2 with one line.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headway.cli import main
from headway.core.errors import HeadwayError, TraceError
from headway.trace.readers import AZURE_HEADER, read_trace
from headway.trace.stats import trace_stats

pytestmark = pytest.mark.timeout(120)

SCALE = max(1, int(os.environ.get("HEADWAY_FUZZ_EXAMPLES", "1")))
FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def examples(n: int) -> settings:
    return settings(FUZZ, max_examples=n * SCALE)


_COUNTER = iter(range(10**9))


def _file(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / f"{next(_COUNTER)}-{name}"
    path.write_bytes(data)
    return path


def read_or_error(path: Path, fmt: str = "auto") -> None:
    """Read ``path``: a sane trace, or a ``TraceError`` naming the file (and line)."""
    try:
        trace = read_trace(path, fmt)
    except TraceError as error:
        message = str(error)
        assert message.startswith(str(path)), message
        assert "\n" not in message and len(message) < 1000, message
        return
    arrival = trace.arrival_s
    assert arrival.size >= 1 and arrival[0] == 0.0
    assert np.all(np.isfinite(arrival)) and np.all(np.diff(arrival) >= 0)
    assert np.all(trace.input_tokens >= 0) and np.all(trace.output_tokens >= 0)
    json.dumps(trace_stats(trace))


def assert_row_error(path: Path, fmt: str, line: int, where: str) -> None:
    with pytest.raises(TraceError) as caught:
        read_trace(path, fmt)
    message = str(caught.value)
    assert message.startswith(f"{path} line {line}:"), message
    assert where in message, message


# --- values ----------------------------------------------------------------------------------

good_count = st.integers(0, 100_000)
bad_count_json = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**53),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=6),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
any_json = st.one_of(good_count, bad_count_json)
bad_seconds_json = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.booleans(),
    st.text(max_size=6),
    st.none(),
    st.lists(st.floats(), max_size=2),
)
csv_cell = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "nan", "inf", "-1", "1e9", "0x10", "١٢", "1_000", "12abc"]),
    st.text(st.characters(exclude_characters="\r\n", exclude_categories=("Cs",)), max_size=8),
)


def _jsonl(rows: list[dict[str, object]]) -> bytes:
    # allow NaN/Infinity literals on purpose: a reader must refuse them with a message
    return "\n".join(json.dumps(row) for row in rows).encode()


# --- Mooncake --------------------------------------------------------------------------------

mooncake_row = st.fixed_dictionaries(
    {
        "timestamp": st.integers(0, 10**9) | st.floats(0, 1e9),
        "input_length": good_count,
        "output_length": good_count,
    },
    optional={"hash_ids": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4)},
)


@examples(300)
@given(
    rows=st.lists(mooncake_row, min_size=1, max_size=6),
    data=st.data(),
    key=st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "extra"]),
    mode=st.sampled_from(["replace", "drop"]),
)
def test_mooncake_one_bad_value_names_line_and_key(
    tmp_path: Path, rows: list[dict[str, object]], data: st.DataObject, key: str, mode: str
) -> None:
    for row in rows:
        row["hash_ids"] = row.get("hash_ids", [1])  # on every line, as the format wants
    bad = data.draw(st.integers(0, len(rows) - 1))
    if mode == "drop":
        rows[bad].pop(key, None)
    else:
        rows[bad][key] = data.draw(
            bad_seconds_json if key == "timestamp" else any_json, label="value"
        )
    path = _file(tmp_path, "t.jsonl", _jsonl(rows))
    value = rows[bad].get(key)
    count_ok = type(value) is int and 0 <= value < 2**53
    valid = (
        key == "extra"
        or (key == "hash_ids" and mode == "drop" and len(rows) == 1)
        or (key in ("input_length", "output_length") and mode == "replace" and count_ok)
        or (key == "hash_ids" and isinstance(value, list) and all(type(v) is int for v in value)
            and all(-(2**63) <= v < 2**63 for v in value))
        or (key == "hash_ids" and value is None and len(rows) == 1)
    )  # fmt: skip
    if valid:
        read_or_error(path, "mooncake")
        return
    with pytest.raises(TraceError) as caught:
        read_trace(path, "mooncake")
    message = str(caught.value)
    assert message.startswith(f"{path} line "), message
    assert f"`{key}`" in message or "JSON" in message or "hash_ids" in message, message
    read_or_error(path)  # auto-detection fails cleanly too


# --- generic ---------------------------------------------------------------------------------

generic_row = st.fixed_dictionaries(
    {
        "timestamp_s": st.floats(0, 1e6),
        "input_tokens": good_count,
        "output_tokens": good_count,
    },
    optional={
        "tenant": st.text("abcxyz_-", min_size=1, max_size=5),
        "priority": st.sampled_from(["critical", "interactive", "background"]),
    },
)


@examples(300)
@given(
    rows=st.lists(generic_row, min_size=1, max_size=6),
    data=st.data(),
    key=st.sampled_from(["timestamp_s", "input_tokens", "output_tokens", "tenant", "priority"]),
    as_csv=st.booleans(),
)
def test_generic_one_bad_value_names_line_and_key(
    tmp_path: Path, rows: list[dict[str, object]], data: st.DataObject, key: str, as_csv: bool
) -> None:
    for row in rows:  # labels on every row or none
        row.setdefault("tenant", "t")
        row.setdefault("priority", "interactive")
    bad = data.draw(st.integers(0, len(rows) - 1))
    if as_csv:
        columns = list(rows[0])
        lines = [",".join(columns)] + [",".join(str(r[c]) for c in columns) for r in rows]
        cell = data.draw(csv_cell, label="cell")
        fields = lines[bad + 1].split(",")
        fields[columns.index(key)] = json.dumps(cell) if "," in cell or '"' in cell else cell
        lines[bad + 1] = ",".join(fields)
        path = _file(tmp_path, "t.csv", "\n".join(lines).encode())
    else:
        rows[bad][key] = data.draw(
            bad_seconds_json if key == "timestamp_s" else bad_count_json, label="value"
        )
        path = _file(tmp_path, "t.jsonl", _jsonl(rows))
    try:
        read_trace(path, "generic")
    except TraceError as error:
        message = str(error)
        assert message.startswith(f"{path} line {bad + 2 if as_csv else bad + 1}:"), message
        named = (f"`{key}`", "CSV", "fields", "JSON")
        assert any(word in message for word in named), message
    else:
        assert as_csv or key in ("tenant",), "a bad JSON value was accepted"
    read_or_error(path)


# --- Azure -----------------------------------------------------------------------------------


@examples(300)
@given(
    good=st.lists(
        st.tuples(st.datetimes(), st.integers(0, 10**6), st.integers(0, 10**6)),
        min_size=1,
        max_size=5,
    ),
    bad_cell=csv_cell,
    column=st.integers(0, 2),
    data=st.data(),
)
def test_azure_one_bad_cell_names_line_and_column(
    tmp_path: Path,
    good: list[tuple[object, int, int]],
    bad_cell: str,
    column: int,
    data: st.DataObject,
) -> None:
    rows = [[f"{t:%Y-%m-%d %H:%M:%S.%f}", str(i), str(o)] for t, i, o in good]
    bad = data.draw(st.integers(0, len(rows) - 1))
    rows[bad][column] = json.dumps(bad_cell) if "," in bad_cell or '"' in bad_cell else bad_cell
    text = ",".join(AZURE_HEADER) + "\n" + "\n".join(",".join(r) for r in rows)
    path = _file(tmp_path, "az.csv", text.encode())
    read_or_error(path, "azure")
    read_or_error(path)


# --- bytes -----------------------------------------------------------------------------------

VALID = {
    "az.csv": b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
    b"2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n",
    "mc.jsonl": b'{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [0, 1]}\n'
    b'{"timestamp": 1, "input_length": 100, "output_length": 8, "hash_ids": [2]}\n',
    "g.csv": b"timestamp_s,input_tokens,output_tokens,tenant\n0.5,10,20,a\n0.1,5,6,b\n",
    "g.jsonl": b'{"timestamp_s": 0.5, "input_tokens": 10, "output_tokens": 20}\n'
    b'{"timestamp_s": 0.1, "input_tokens": 5, "output_tokens": 6}\n',
}


@examples(300)
@given(
    name=st.sampled_from(sorted(VALID)),
    edits=st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 4), st.binary(max_size=6)), max_size=4
    ),
    fmt=st.sampled_from(["auto", "azure", "mooncake", "generic"]),
    compress=st.booleans(),
)
def test_mutated_valid_files(
    tmp_path: Path, name: str, edits: list[tuple[int, int, bytes]], fmt: str, compress: bool
) -> None:
    data = VALID[name]
    for at, cut, insert in edits:
        at %= len(data) + 1
        data = data[:at] + insert + data[at + cut :]
    if compress:
        data, name = gzip.compress(data), name + ".gz"
    read_or_error(_file(tmp_path, name, data), fmt)


@examples(200)
@given(
    raw=st.binary(max_size=200),
    name=st.sampled_from(["x.csv", "x.jsonl", "x.txt", "x", "x.csv.gz", "x.gz"]),
    fmt=st.sampled_from(["auto", "azure", "mooncake", "generic"]),
)
def test_random_bytes(tmp_path: Path, raw: bytes, name: str, fmt: str) -> None:
    read_or_error(_file(tmp_path, name, raw), fmt)


@examples(150)
@given(name=st.sampled_from(sorted(VALID)), cut=st.integers(0, 10_000))
def test_truncated_gzip(tmp_path: Path, name: str, cut: int) -> None:
    packed = gzip.compress(VALID[name] * 20)
    cut %= len(packed)
    path = _file(tmp_path, name + ".gz", packed[:cut])
    read_or_error(path)
    if 2 <= cut < len(packed) - 8:
        with pytest.raises(TraceError, match="gzip"):
            read_trace(path)


@examples(100)
@given(
    prefix=st.sampled_from(sorted(VALID)),
    bad=st.binary(min_size=1, max_size=4).filter(lambda b: _not_utf8(b)),
)
def test_invalid_utf8_names_the_line(tmp_path: Path, prefix: str, bad: bytes) -> None:
    data = VALID[prefix] + b"\n" + bad + b"\n"
    path = _file(tmp_path, prefix, data)
    line = data[: data.index(bad)].count(b"\n") + 1
    try:
        bad.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: data.index(bad) + exc.start].count(b"\n") + 1
    assert_row_error(path, "auto", line, "not UTF-8")


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@pytest.mark.parametrize("depth", [10, 1_000, 100_000])
@pytest.mark.parametrize("name", ["mc.jsonl", "g.jsonl"])
def test_deeply_nested_json_line(tmp_path: Path, depth: int, name: str) -> None:
    data = VALID[name] + b'{"timestamp": ' + b"[" * depth + b"\n"
    path = _file(tmp_path, name, data)
    assert_row_error(path, "mooncake" if name == "mc.jsonl" else "generic", 3, "JSON")


# --- the CLI ---------------------------------------------------------------------------------


@examples(100)
@given(
    name=st.sampled_from(sorted(VALID)),
    edits=st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 4), st.binary(max_size=6)),
        min_size=1,
        max_size=4,
    ),
)
def test_trace_stats_cli_exits_2_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    edits: list[tuple[int, int, bytes]],
) -> None:
    data = VALID[name]
    for at, cut, insert in edits:
        at %= len(data) + 1
        data = data[:at] + insert + data[at + cut :]
    path = _file(tmp_path, name, data)
    capsys.readouterr()
    try:
        code = main(["trace", "stats", str(path), "--json"])
    except HeadwayError as error:  # pragma: no cover - main maps it to exit 2
        pytest.fail(f"escaped the CLI: {error!r}")
    out, err = capsys.readouterr()
    if code == 0:
        json.loads(out)
        return
    assert code == 2
    lines = err.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith(f"headway: error: {path}"), err
