"""Trace readers: the three formats, gzip, sorting, exact timestamps and precise errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from headway.core.errors import TraceError
from headway.trace.readers import (
    read_azure_csv,
    read_generic,
    read_mooncake_jsonl,
    read_trace,
)
from shared_data import TRACES, require_shared

TRACES_DIR = TRACES
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    """Write ``text`` to ``tmp_path/name``, gzip-compressed when the name ends in .gz."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


def _shared_traces() -> Path:
    return require_shared(TRACES_DIR)


# --- Azure -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["az.csv", "az.csv.gz"])
def test_azure_parses_exact_sub_microsecond_times(tmp_path: Path, name: str) -> None:
    text = (
        AZURE_HEADER + "2023-11-16 23:59:59.9999999,100,7\r\n"
        "2023-11-17 00:00:00.0000000,200,8\r\n"
        "2023-11-17 00:00:00.5,300,9\r\n"
        "2023-11-17 00:00:02,400,10\r\n"
    )
    trace = read_trace(_write(tmp_path, name, text))
    assert trace.kind == "azure"
    assert trace.name == "az"
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 1e-7, 0.5000001, 2.0000001])
    np.testing.assert_array_equal(trace.input_tokens, [100, 200, 300, 400])
    np.testing.assert_array_equal(trace.output_tokens, [7, 8, 9, 10])
    assert trace.first_timestamp == "2023-11-16 23:59:59.9999999"
    assert trace.last_timestamp == "2023-11-17 00:00:02"
    assert trace.tenant is None
    assert trace.hash_ids is None
    assert trace.tick_s is None


def test_azure_unsorted_rows_are_sorted_stably(tmp_path: Path) -> None:
    text = (
        "\ufeff" + AZURE_HEADER + "2023-11-16 18:00:05.0000000,5,50\n"
        "\n"
        "2023-11-16 18:00:01.0000000,1,10\n"
        "2023-11-16 18:00:05.0000000,6,60\n"
        "2023-11-16 18:00:03.0000000,3,30\n"
    )
    trace = read_azure_csv(_write(tmp_path, "unsorted.csv", text))
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 2.0, 4.0, 4.0])
    np.testing.assert_array_equal(trace.input_tokens, [1, 3, 5, 6])
    np.testing.assert_array_equal(trace.output_tokens, [10, 30, 50, 60])
    assert trace.first_timestamp == "2023-11-16 18:00:01.0000000"
    assert trace.last_timestamp == "2023-11-16 18:00:05.0000000"


def test_azure_reads_20k_generated_rows_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    offsets_us = np.cumsum(rng.integers(1, 400_000, 20_000))
    rows = [
        f"2023-11-16 {18 + us // 3_600_000_000:02d}:{us // 60_000_000 % 60:02d}:"
        f"{us // 1_000_000 % 60:02d}.{us % 1_000_000:06d}0,{us % 5000},{us % 700}\r\n"
        for us in offsets_us.tolist()
    ]
    path = _write(tmp_path, "big.csv.gz", AZURE_HEADER + "".join(rows))
    trace = read_trace(path)
    assert len(trace) == 20_000
    np.testing.assert_allclose(trace.arrival_s, (offsets_us - offsets_us[0]) / 1e6, atol=1e-9)


# --- Mooncake --------------------------------------------------------------------------------

MOONCAKE = (
    '{"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [0, 2]}\n'
    '{"timestamp": 0, "input_length": 1000, "output_length": 7, "hash_ids": [0, 1]}\n'
    '{"timestamp": 0, "input_length": 100, "output_length": 9, "hash_ids": [3], "x": 1}\n'
)


@pytest.mark.parametrize("name", ["mc.jsonl", "mc.jsonl.gz", "mc"])
def test_mooncake_reads_ms_and_hash_ids_and_sorts(tmp_path: Path, name: str) -> None:
    trace = read_trace(_write(tmp_path, name, MOONCAKE))
    assert trace.kind == "mooncake"
    assert trace.name == "mc"
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 0.0, 3.0])
    np.testing.assert_array_equal(trace.input_tokens, [1000, 100, 600])
    np.testing.assert_array_equal(trace.output_tokens, [7, 9, 5])
    assert trace.hash_ids is not None
    assert [ids.tolist() for ids in trace.hash_ids] == [[0, 1], [3], [0, 2]]
    assert trace.hash_block_tokens == 512
    assert trace.first_timestamp is None


def test_mooncake_without_hash_ids(tmp_path: Path) -> None:
    text = '{"timestamp": 1.5, "input_length": 1, "output_length": 2}\n'
    trace = read_mooncake_jsonl(_write(tmp_path, "nohash.jsonl", text))
    assert trace.hash_ids is None
    assert trace.hash_block_tokens is None
    assert len(trace) == 1


# --- generic ---------------------------------------------------------------------------------


def test_generic_csv_with_all_columns(tmp_path: Path) -> None:
    text = (
        "timestamp_s,input_tokens,output_tokens,tenant,priority,session_id,prefix_id,model\n"
        "12.5,10,1,acme,critical,s1,p1,x\n"
        '10.0,20,2,"globex, inc",background,s2,p1,x\n'
        "11,30,3,acme,interactive,s1,p2,x\n"
    )
    trace = read_trace(_write(tmp_path, "gen.csv", text))
    assert trace.kind == "generic"
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 1.0, 2.5])
    np.testing.assert_array_equal(trace.input_tokens, [20, 30, 10])
    assert trace.tenant is not None
    assert trace.tenant.tolist() == ["globex, inc", "acme", "acme"]
    assert trace.priority is not None
    assert trace.priority.tolist() == ["background", "interactive", "critical"]
    assert trace.session_id is not None
    assert trace.session_id.tolist() == ["s2", "s1", "s1"]
    assert trace.prefix_id is not None
    assert trace.prefix_id.tolist() == ["p1", "p2", "p1"]


@pytest.mark.parametrize("name", ["gen.jsonl", "gen.jsonl.gz", "gen.ndjson"])
def test_generic_jsonl_with_timestamp_synonym(tmp_path: Path, name: str) -> None:
    text = (
        '{"timestamp": 5, "input_tokens": 1, "output_tokens": 2, "tenant": "a"}\n'
        "\n"
        '{"timestamp": 4.25, "input_tokens": 3, "output_tokens": 4, "tenant": "b"}\n'
    )
    trace = read_generic(_write(tmp_path, name, text))
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 0.75])
    np.testing.assert_array_equal(trace.output_tokens, [4, 2])
    assert trace.tenant is not None
    assert trace.tenant.tolist() == ["b", "a"]
    assert trace.priority is None
    assert trace.session_id is None


def test_generic_without_optional_columns(tmp_path: Path) -> None:
    trace = read_trace(
        _write(tmp_path, "plain.csv.gz", "timestamp,input_tokens,output_tokens\n0,1,1\n")
    )
    assert trace.tenant is None
    assert trace.priority is None
    assert trace.prefix_id is None


@pytest.mark.parametrize(
    ("fmt", "name", "text"),
    [
        ("azure", "a.txt", AZURE_HEADER + "2023-11-16 18:00:00.0,1,1\n"),
        ("mooncake", "m.txt", MOONCAKE),
        ("generic", "g.txt", "timestamp_s,input_tokens,output_tokens\n0,1,1\n"),
        ("generic", "g2", '{"timestamp_s": 0, "input_tokens": 1, "output_tokens": 1}'),
    ],
)
def test_auto_detects_format_from_content(tmp_path: Path, fmt: str, name: str, text: str) -> None:
    path = _write(tmp_path, name, text)
    assert read_trace(path).kind == fmt
    assert read_trace(path, fmt).kind == fmt


# --- errors ----------------------------------------------------------------------------------

ERROR_CASES = [
    # (file name, content, fmt, fragments the message must contain)
    ("a.csv", AZURE_HEADER + "2023-11-16 18:15:46.6805900,abc,3\n", "auto",
     ["line 2", "column `ContextTokens`", "'abc'", "expected a non-negative integer"]),
    ("a.csv.gz", AZURE_HEADER + "\n\n2023-11-16 18:15:46.6805900,1,-3\n", "auto",
     ["line 4", "column `GeneratedTokens`", "'-3'", "non-negative integer"]),
    ("a.csv", AZURE_HEADER + "2023-11-16 18:15:46.6,1,2.5\n", "auto",
     ["line 2", "`GeneratedTokens`", "'2.5'"]),
    ("a.csv", AZURE_HEADER + "16/11/2023 18:15:46,1,3\n", "auto",
     ["line 2", "column `TIMESTAMP`", "'16/11/2023 18:15:46'", "2023-11-16 18:15:46.6805900"]),
    ("a.csv", AZURE_HEADER + "2023-02-30 18:15:46.1,1,3\n", "auto",
     ["line 2", "`TIMESTAMP`", "date is not valid"]),
    ("a.csv", AZURE_HEADER + "2023-11-16 25:15:46.1,1,3\n", "auto",
     ["line 2", "`TIMESTAMP`", "out of range"]),
    ("a.csv", AZURE_HEADER + "2023-11-16 18:15:46.1,1,3\n2023-11-16 18:15:47.1,1\n", "auto",
     ["line 3", "has 2 fields but the header has 3"]),
    ("a.csv", AZURE_HEADER, "auto", ["line 1", "no data rows"]),
    ("a.csv", "timestamp_s,input_tokens,output_tokens\n0,1,1\n", "azure",
     ["line 1", "an Azure trace starts with TIMESTAMP,ContextTokens,GeneratedTokens"]),
    ("m.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": 1,\n',
     "auto", ["line 2", "not valid JSON"]),
    ("m.jsonl", '{"timestamp": 0, "input_length": "abc", "output_length": 1, "hash_ids": []}',
     "auto", ["line 1", "key `input_length`", "'abc'", "non-negative integer"]),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": -1, "hash_ids": [1]}',
     "auto", ["line 1", "key `output_length`", "-1", "non-negative integer"]),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5.5, "output_length": 1, "hash_ids": [1]}',
     "auto", ["key `input_length`", "5.5"]),
    ("m.jsonl", '{"timestamp": true, "input_length": 5, "output_length": 1}', "auto",
     ["line 1", "key `timestamp`", "true", "expected a number"]),
    ("m.jsonl", '{"input_length": 5, "output_length": 1, "hash_ids": [1]}', "auto",
     ["line 1", "key `timestamp` is missing"]),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]}',
     "auto", ["line 1", "key `hash_ids`", "'x'", "integer block ids"]),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": 7}', "auto",
     ["line 1", "key `hash_ids`", "7", "list of integer block ids"]),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
     '{"timestamp": 1, "input_length": 5, "output_length": 1}\n', "auto",
     ["line 2", "hash_ids", "some lines and missing on others"]),
    ("m.jsonl", "[1, 2, 3]\n", "mooncake", ["line 1", "not a JSON object"]),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
     '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 9223372036854775809]}'
     "\n",
     "auto", ["line 2", "key `hash_ids`", "64-bit"]),
    ("g.csv", "time,input_tokens,output_tokens\n0,1,1\n", "auto",
     ["line 1", "no `timestamp_s` column"]),
    ("g.csv", "timestamp_s,timestamp,input_tokens,output_tokens\n0,0,1,1\n", "auto",
     ["line 1", "both `timestamp_s` and `timestamp`"]),
    ("g.csv", "timestamp_s,input_tokens,output\n0,1,1\n", "auto",
     ["line 1", "no `output_tokens` column"]),
    ("g.csv", "timestamp_s,input_tokens,output_tokens,input_tokens\n0,1,1,1\n", "auto",
     ["line 1", "column `input_tokens` twice"]),
    ("g.csv", "timestamp_s,input_tokens,output_tokens\n0,1,1\nsoon,1,1\n", "auto",
     ["line 3", "column `timestamp_s`", "'soon'", "number of seconds"]),
    ("g.csv", "timestamp_s,input_tokens,output_tokens\nnan,1,1\n", "auto",
     ["line 2", "'nan'", "number of seconds"]),
    ("g.csv", "timestamp_s,input_tokens,output_tokens,priority\n0,1,1,urgent\n", "auto",
     ["line 2", "column `priority`", "'urgent'", "critical, interactive, background"]),
    ("g.csv", "timestamp_s,input_tokens,output_tokens,tenant\n0,1,1,a\n1,1,1,\n", "auto",
     ["line 3", "column `tenant`", "non-empty"]),
    ("g.csv", 'timestamp_s,input_tokens,output_tokens\n0,1,1\n1,"2\n', "auto",
     ["line 3"]),
    ("g.jsonl", '{"timestamp_s": 0, "input_tokens": 1, "output_tokens": 1, "tenant": "a"}\n'
     '{"timestamp_s": 1, "input_tokens": 1, "output_tokens": 1}\n', "auto",
     ["line 2", "key `tenant` is missing here but present on line 1"]),
    ("g.jsonl", '{"timestamp_s": 0, "input_tokens": 1, "output_tokens": 1}\n'
     '{"timestamp_s": 1, "input_tokens": 1, "output_tokens": 1, "priority": "critical"}\n',
     "auto", ["line 2", "key `priority` is present here but missing on line 1"]),
    ("g.jsonl", '{"timestamp_s": 0, "input_tokens": "12", "output_tokens": 1}\n', "auto",
     ["line 1", "key `input_tokens`", "'12'", "non-negative integer"]),
    ("g.jsonl", '{"timestamp_s": 0, "input_tokens": 1, "output_tokens": 1, "tenant": 5}\n',
     "auto", ["line 1", "key `tenant`", "5", "non-empty string"]),
    ("g.jsonl", '{"timestamp_s": 0, "input_tokens": 1, "output_tokens": 1, "priority": "x"}\n',
     "auto", ["line 1", "key `priority`", "'x'", "critical"]),
    ("g.jsonl", '{"timestamp_s": 0, "input_tokens": 1, "output_tokens": 1}\n'
     '{"timestamp_s": 1, "input_tokens": 1}\n', "auto",
     ["line 2", "key `output_tokens` is missing"]),
    ("g.jsonl", "timestamp_s,input_tokens,output_tokens\n0,1,1\n", "generic",
     ["line 1", "not valid JSON"]),
    ("e.csv", "", "auto", ["the file is empty"]),
    ("e.jsonl", "  \n\n \r\n", "auto", ["the file is empty"]),
    ("e.jsonl.gz", "", "auto", ["the file is empty"]),
    ("u.csv", "when,prompt,answer\n0,1,1\n", "auto",
     ["line 1", "cannot tell the trace format", "or pass --format"]),
    ("u.jsonl", '{"t": 0, "in": 1}\n', "auto", ["line 1", "cannot tell the trace format"]),
    ("u.csv", "timestamp_s,input_tokens,output_tokens\n0,1,1\n", "parquet",
     ["unknown trace format 'parquet'"]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "fmt", "fragments"), ERROR_CASES)
def test_bad_input_names_file_line_and_fix(
    tmp_path: Path, name: str, text: str, fmt: str, fragments: list[str]
) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(TraceError) as info:
        read_trace(path, fmt)
    message = str(info.value)
    assert message.startswith(str(path)), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


@pytest.mark.parametrize(
    ("name", "data", "fragment"),
    [
        (
            "bad.csv.gz",
            gzip.compress(AZURE_HEADER.encode(), mtime=0)[:-9],
            "not a complete gzip file",
        ),
        ("plain.csv.gz", AZURE_HEADER.encode(), "not gzip-compressed"),
        ("latin.csv", (AZURE_HEADER + "2023-11-16 18:00:00,1,1\nt\xe9,1,1\n").encode("latin-1"),
         "line 3: byte 0xe9 is not UTF-8"),
    ],
)  # fmt: skip
def test_bad_bytes(tmp_path: Path, name: str, data: bytes, fragment: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(TraceError, match=fragment):
        read_trace(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "absent.csv")
    with pytest.raises(TraceError, match="is a directory"):
        read_trace(tmp_path)


# --- the shipped public traces ---------------------------------------------------------------


def test_tick_detected_on_mooncake_conversation_only() -> None:
    traces = _shared_traces()
    conversation = read_trace(traces / "mooncake_fast25_conversation_trace.jsonl.gz")
    assert conversation.tick_s is not None
    assert 2.99 <= conversation.tick_s <= 3.01
    assert read_trace(traces / "azure_llm_2023_code.csv.gz").tick_s is None
    assert read_trace(traces / "mooncake_fast25_synthetic_trace.jsonl.gz").tick_s is None


def test_shipped_azure_trace_reads_exactly() -> None:
    path = _shared_traces() / "azure_llm_2023_conv.csv.gz"
    trace = read_azure_csv(path)
    assert len(trace) == 19_366
    assert trace.first_timestamp == "2023-11-16 18:15:46.6805900"
    assert trace.arrival_s[1] == pytest.approx(4.3145790, abs=1e-12)  # 18:15:50.9951690


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ('timestamp_s,input_tokens,output_tokens\n0.5,"\\"",3\n1.0,4,5\n', 2, "fields"),
        ('timestamp_s,input_tokens,output_tokens\n0.5,1,3\n1.0,"4\n', 3, "fields"),
    ],
    ids=["stray-quote", "unclosed-at-end"],
)
def test_a_row_whose_quote_spans_lines_is_named_by_its_first_line(
    tmp_path: Path, text: str, line: int, fragment: str
) -> None:
    # A stray quote makes one row of the lines after it; the error named the last of
    # them (line 3 for a quote on line 2; found by the trace-file fuzzer).
    path = _write(tmp_path, "t.csv", text)
    with pytest.raises(TraceError) as caught:
        read_trace(path, "generic")
    message = str(caught.value)
    assert message.startswith(f"{path} line {line}:") and fragment in message, message


def test_a_column_mapping_reads_a_trace_under_its_own_names(tmp_path: Path) -> None:
    """`--columns arrival=arrival_s,tenant=client_id`: CSV and JSON Lines under the file's
    own names; the columns nobody reads are named (an unmapped tenant column was dropped
    silently)."""
    from headway.trace.readers import parse_columns, read_trace

    csv_path = tmp_path / "t.csv"
    lines = ["arrival_s,client_id,prompt,completion,region", "0.5,acme,100,10,eu",
             "0.0,globex,200,20,us"]  # fmt: skip
    csv_path.write_text("\n".join(lines) + "\n")
    mapping = parse_columns("arrival=arrival_s, tenant=client_id,input_tokens=prompt,"
                            "output_tokens=completion")  # fmt: skip
    trace = read_trace(csv_path, columns=mapping)
    assert trace.arrival_s.tolist() == [0.0, 0.5]
    assert trace.tenant is not None and trace.tenant.tolist() == ["globex", "acme"]
    assert trace.input_tokens.tolist() == [200, 100]
    assert trace.ignored_columns == ("region",)
    jsonl = tmp_path / "t.jsonl"
    rows = [{"t": 1.0, "input_tokens": 5, "output_tokens": 2, "user": "u1"},
            {"t": 2.0, "input_tokens": 6, "output_tokens": 3, "user": "u2"}]  # fmt: skip
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    unmapped = read_trace(jsonl, columns={"arrival": "t"})
    assert unmapped.tenant is None and unmapped.ignored_columns == ("user",)
    mapped = read_trace(jsonl, columns={"arrival": "t", "tenant": "user"})
    assert mapped.tenant is not None and mapped.tenant.tolist() == ["u1", "u2"]
    assert mapped.ignored_columns == ()
    with pytest.raises(TraceError, match=r"has no column `client`.*arrival_s, client_id"):
        read_trace(csv_path, columns={"arrival": "arrival_s", "tenant": "client"})
    with pytest.raises(TraceError, match=r"unknown field 'when'.*arrival"):
        read_trace(csv_path, columns={"when": "arrival_s"})
    with pytest.raises(TraceError, match="is not FIELD=COLUMN"):
        parse_columns("arrival")


def test_trace_stats_warns_of_a_column_it_ignores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from headway.cli import main

    path = tmp_path / "t.csv"
    path.write_text("timestamp_s,input_tokens,output_tokens,client_id\n0,1,1,a\n1,2,2,b\n")
    assert main(["trace", "stats", str(path), "--json"]) == 0
    err = capsys.readouterr().err
    assert "ignored column(s) `client_id`" in err and "--columns" in err
    assert main(["trace", "stats", str(path), "--json", "--columns", "tenant=client_id"]) == 0
    assert "ignored" not in capsys.readouterr().err


def test_a_workload_replays_a_trace_with_its_column_mapping(tmp_path: Path) -> None:
    from headway.files.workload import load_workload

    (tmp_path / "t.csv").write_text("arrival_s,in,out\n0,100,10\n1,200,20\n2,300,30\n")
    (tmp_path / "w.yaml").write_text(
        "name: w\nduration_s: 3\nclasses: {c: {input_tokens: 1, output_tokens: 1}}\n"
        "sources:\n  - name: s\n    arrivals: {process: trace, path: t.csv,\n"
        "               columns: {arrival: arrival_s, input_tokens: in, output_tokens: out}}\n"
    )
    loaded = load_workload(tmp_path / "w.yaml")
    assert loaded.traces["t.csv"].input_tokens.tolist() == [100, 200, 300]


def test_a_replay_takes_its_tenants_from_the_trace(tmp_path: Path) -> None:
    """A trace of many tenants replays without listing them under `tenants` (it refused:
    "the trace names tenants a, b that `tenants` does not define"); each gets a share of
    its token work, and tenants the file does list keep their settings."""
    from headway.core.workload.compile import compile_workload
    from headway.files.workload import load_workload

    rows = ["timestamp_s,input_tokens,output_tokens,tenant", "0,10,0,a", "1,20,10,b",
            "2,30,0,a"]  # fmt: skip
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    head = ("name: w\nduration_s: 3\nclasses: {c: {input_tokens: 1, output_tokens: 1}}\n"
            "sources:\n  - {name: s, arrivals: {process: trace, path: t.csv}}\n")  # fmt: skip
    (tmp_path / "w.yaml").write_text(head)
    spec = load_workload(tmp_path / "w.yaml").spec
    assert set(spec.tenants) == {"a", "b"}  # the implicit `default` gave way
    assert spec.tenants["a"].share == pytest.approx(40 / 70)
    run = compile_workload(spec, traces=load_workload(tmp_path / "w.yaml").traces)
    assert [run.tenant_names[t] for t in run.task_tenant] == ["a", "b", "a"]
    (tmp_path / "w.yaml").write_text(head + "tenants: {a: {weight: 3}}\n")
    listed = load_workload(tmp_path / "w.yaml").spec
    assert listed.tenants["a"].weight == 3 and set(listed.tenants) == {"a", "b"}
