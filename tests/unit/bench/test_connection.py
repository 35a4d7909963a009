"""Response parsing of one connection, fed bytes directly (no network)."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest

from headway.bench.connection import Connection, dechunk, usage_of
from headway.bench.records import OK, STATUS, STREAM_ERROR, Columns


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True


class _Sender:
    """Collects what a connection reports."""

    def __init__(self) -> None:
        self.cols = Columns(1)
        self.released: list[tuple[int, int]] = []

    def release(self, conn: Connection, j: int, error: int) -> None:
        self.released.append((j, error))

    def lost(self, conn: Connection, j: int, got_bytes: bool) -> None:
        self.released.append((j, -1))


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(events: list[Any], sep: tuple[str, str] = (",", ":"), prefix: bytes = b"data: ") -> bytes:
    """A chunked SSE body, one event per chunk."""
    body = b"".join(
        _chunk(prefix + (e if isinstance(e, bytes) else json.dumps(e, separators=sep).encode())
               + b"\n\n")
        for e in events
    )  # fmt: skip
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    return head + body + _chunk(prefix + b"[DONE]\n\n") + b"0\r\n\r\n"


def _chat(content: str | None, role: bool = False, usage: Any = ...) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    event: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }
    if usage is not ...:
        event["usage"] = usage
    return event


def _feed(raw: bytes, pieces: list[int] | None = None) -> tuple[_Sender, Connection]:
    sender = _Sender()
    conn = Connection(sender)  # type: ignore[arg-type]
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    conn.send(0, b"GET / HTTP/1.1\r\n\r\n")
    cuts = [0, *(pieces or []), len(raw)]
    for a, b in itertools.pairwise(cuts):
        if b > a:
            conn.data_received(raw[a:b])
    return sender, conn


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
VLLM = _sse(
    [_chat("", role=True), _chat("a"), _chat("b"), _chat("c"), _chat(None),
     {"id": "c", "choices": [], "usage": USAGE}]
)  # fmt: skip


def test_vllm_style_stream_counts_tokens_and_reads_usage() -> None:
    sender, _ = _feed(VLLM)
    cols = sender.cols
    assert sender.released == [(0, OK)]
    assert cols.token_events[0] == 3  # the role-only and the empty deltas are no tokens
    assert cols.completion_tokens[0] == 3 and cols.prompt_tokens[0] == 7 and cols.usage[0]
    assert cols.status[0] == 200


@pytest.mark.parametrize("step", [1, 7, 50, 333])
def test_any_split_of_the_bytes_gives_the_same_record(step: int) -> None:
    sender, _ = _feed(VLLM, list(range(step, len(VLLM), step)))
    cols = sender.cols
    assert sender.released == [(0, OK)]
    assert cols.token_events[0] == 3
    assert cols.completion_tokens[0] == 3 and cols.usage[0]


def test_openai_style_usage_null_on_every_chunk_and_spaces() -> None:
    events = [_chat("", role=True, usage=None)]
    events += [_chat(t, usage=None) for t in ("x", "y")]
    events.append({"id": "c", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}})
    sender, _ = _feed(_sse(events, sep=(", ", ": ")))
    assert sender.cols.token_events[0] == 2
    assert sender.cols.completion_tokens[0] == 2 and sender.cols.usage[0]


def test_tgi_style_data_without_space_and_no_usage_falls_back_to_events() -> None:
    events = [_chat(t, role=True, usage=None) for t in ("p", "q", "r", "s")]
    sender, _ = _feed(_sse(events, prefix=b"data:"))
    assert sender.cols.token_events[0] == 4
    assert sender.cols.completion_tokens[0] == 4 and not sender.cols.usage[0]


def test_reasoning_and_completions_text_count_as_tokens() -> None:
    events = [
        {"choices": [{"delta": {"reasoning_content": "hm"}}]},
        {"choices": [{"text": "t"}]},
        {"choices": [{"text": ""}]},
    ]
    sender, _ = _feed(_sse(events))
    assert sender.cols.token_events[0] == 3  # an empty text is a token (partial UTF-8)


def test_events_split_across_chunks_are_counted_on_the_payload() -> None:
    payload = b"".join(b"data: " + json.dumps(_chat(t)).encode() + b"\n\n" for t in "abcd")
    payload += b"data: [DONE]\n\n"
    body = b"".join(_chunk(payload[i : i + 37]) for i in range(0, len(payload), 37))
    raw = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"
    )
    sender, _ = _feed(raw)
    assert sender.released == [(0, OK)]
    assert sender.cols.token_events[0] == 4
    assert dechunk(raw, raw.find(b"\r\n\r\n") + 4) == payload


def test_error_status_is_recorded_with_no_tokens() -> None:
    body = b'{"error": {"message": "slow down"}}'
    raw = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    sender, conn = _feed(raw, [20])
    assert sender.released == [(0, STATUS)]
    assert sender.cols.status[0] == 429 and sender.cols.token_events[0] == 0
    assert math.isnan(sender.cols.first_token_s[0]) and conn.keep_alive


def test_error_event_inside_a_200_stream_fails_the_call() -> None:
    sender, _ = _feed(_sse([_chat("a"), {"error": {"message": "engine died"}}]))
    assert sender.released == [(0, STREAM_ERROR)]


def test_whole_json_response_reads_usage_or_estimates() -> None:
    obj = {"choices": [{"message": {"role": "assistant", "content": "abcdefgh"}}]}
    body = json.dumps(obj).encode()
    raw = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
    sender, _ = _feed(raw % (len(body), body))
    assert sender.released == [(0, OK)]
    assert sender.cols.completion_tokens[0] == 2 and not sender.cols.usage[0]  # 8 chars / 4
    obj["usage"] = {"prompt_tokens": 3, "completion_tokens": 9}
    body = json.dumps(obj).encode()
    sender, _ = _feed(raw % (len(body), body))
    assert sender.cols.completion_tokens[0] == 9 and sender.cols.usage[0]


def test_connection_close_header_stops_reuse() -> None:
    raw = VLLM.replace(b"200 OK\r\n", b"200 OK\r\nConnection: close\r\n", 1)
    sender, conn = _feed(raw)
    assert sender.released == [(0, OK)] and not conn.keep_alive


def test_usage_of_takes_the_last_event_with_an_object() -> None:
    payload = b'data: {"usage": {"completion_tokens": 1}}\n\ndata: {"usage": null}\n\n'
    assert usage_of(payload) == {"completion_tokens": 1}
    assert usage_of(b"data: {}\n\n") is None
