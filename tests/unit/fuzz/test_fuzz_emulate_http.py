"""Property-based fuzzing of `headway emulate`'s HTTP API against a real server process.

Hypothesis generates bodies and headers for ``/v1/completions`` and ``/v1/chat/completions``
(streaming and not): malformed JSON, wrong types for every field, huge/negative/float/bool
counts, unknown fields, garbage ``messages``, invalid UTF-8, lone surrogates, deep nesting,
numbers of thousands of digits, odd content types. The guarantees checked on every answer:

* never a 5xx for client input, and the server keeps serving;
* every 4xx is OpenAI-shaped, ``{"error": {"message", "type", "param", "code"}}``, and a
  field's mistake names the field (in ``param`` and in the message);
* a valid request is served: exactly ``max_tokens`` tokens, streamed or not.

Plus bodies over the size limit (413 without reading them, RSS bounded) and a slowloris
client that must not block others. ``HEADWAY_FUZZ_EXAMPLES`` multiplies the example counts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fuzz_http import (
    FIELDS,
    MODEL,
    ROUTES,
    WRONG,
    Client,
    assert_slowloris_does_not_block,
    examples,
    header_names,
    header_values,
    healthy,
    is_utf8,
    json_values,
    kinds,
    openai_error,
    raw_exchange,
    valid_body,
)
from headway.emulate.process import EmulatorProcess
from headway.emulate.server import MAX_BODY_BYTES

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorProcess]:
    # A small KV pool keeps max_model_len (and so the longest valid request) short.
    with EmulatorProcess(["--speedup", "1000", "--num-kv-blocks", "512"]) as emu:
        yield emu


@pytest.fixture(scope="module")
def client(emulator: EmulatorProcess) -> Iterator[Client]:
    c = Client(emulator.url)
    yield c
    c.close()
    # The server survived everything the module sent it.
    assert emulator.proc is not None and emulator.proc.poll() is None
    assert healthy(emulator.url)


@pytest.fixture(scope="module")
def max_model_len(client: Client) -> int:
    _, _, data = client.request("GET", "/v1/models")
    value = json.loads(data)["data"][0]["max_model_len"]
    assert isinstance(value, int)
    return value


def check(status: int, data: bytes, *, stream: bool = False) -> dict[str, Any] | None:
    """The guarantees every answer keeps; the error object of a 4xx, else ``None``."""
    assert status < 500, (status, data[:500])
    if status >= 400:
        error = openai_error(data)
        assert error["type"] == "invalid_request_error", error
        return error
    assert status == 200, (status, data[:500])
    if stream:
        assert data.endswith(b"data: [DONE]\n\n"), data[-200:]
    else:
        json.loads(data)
    return None


# --- valid requests --------------------------------------------------------------------------


@examples(150)
@given(kind=kinds, data=st.data())
def test_valid_requests_are_served_exactly(client: Client, kind: str, data: st.DataObject) -> None:
    body = data.draw(valid_body(kind))
    if body.get("stream"):
        body["stream_options"] = {"include_usage": True}
    status, _, raw = client.post(kind, body)
    check(status, raw, stream=bool(body.get("stream")))
    if body.get("stream"):
        events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line[6:7] == "{"]
        assert events[-1]["usage"]["completion_tokens"] == body["max_tokens"]
    else:
        reply = json.loads(raw)
        assert reply["usage"]["completion_tokens"] == body["max_tokens"]
        assert reply["choices"][0]["finish_reason"] == "length"


# --- arbitrary and mutated bodies ------------------------------------------------------------


@examples(300)
@given(
    kind=kinds,
    body=st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), json_values, max_size=8),
)
def test_arbitrary_objects_never_5xx(client: Client, kind: str, body: dict[str, Any]) -> None:
    status, _, raw = client.post(kind, body)
    check(status, raw, stream=body.get("stream") is True)


@examples(300)
@given(kind=kinds, data=st.data(), field=st.sampled_from(FIELDS), value=json_values)
def test_one_field_replaced_never_5xx(
    client: Client, kind: str, data: st.DataObject, field: str, value: object
) -> None:
    body = data.draw(valid_body(kind))
    body[field] = value
    status, _, raw = client.post(kind, body)
    error = check(status, raw, stream=body.get("stream") is True)
    if error is not None and error["param"] is not None:
        assert error["param"].split(".")[0].split("[")[0] in FIELDS, error


@examples(300)
@given(kind=kinds, data=st.data(), field=st.sampled_from(sorted(WRONG)))
def test_wrong_type_names_the_field(
    client: Client, kind: str, data: st.DataObject, field: str
) -> None:
    body = data.draw(valid_body(kind))
    body.pop("stream", None)
    body[field] = data.draw(WRONG[field])
    if field == "stream_options":
        body["stream"] = True
    status, _, raw = client.post(kind, body)
    error = check(status, raw)
    assert error is not None, (body, raw[:300])
    assert error["param"] == field, error
    assert f"`{field}`" in error["message"] or repr(body[field])[:10] in error["message"], error
    assert status == (404 if field == "model" and isinstance(body[field], str) else 400)


@examples(100)
@given(kind=kinds, data=st.data(), extra=st.integers(1, 2**70), stream=st.booleans())
def test_too_many_tokens_is_context_length_exceeded(
    client: Client, max_model_len: int, kind: str, data: st.DataObject, extra: int, stream: bool
) -> None:
    body = data.draw(valid_body(kind))
    body["max_tokens"] = max_model_len + extra
    body["stream"] = stream
    status, _, raw = client.post(kind, body)
    error = check(status, raw)
    assert status == 400 and error is not None
    assert error["code"] == "context_length_exceeded", error
    assert error["param"] == ("prompt" if kind == "completion" else "messages")
    assert str(max_model_len) in error["message"]


@examples(200)
@given(messages=st.lists(json_values, min_size=1, max_size=4) | json_values, stream=st.booleans())
def test_garbage_messages_name_the_entry(client: Client, messages: object, stream: bool) -> None:
    body = {"model": MODEL, "messages": messages, "max_tokens": 3, "stream": stream}
    status, _, raw = client.post("chat", body)
    error = check(status, raw, stream=stream)
    if error is not None:
        assert error["param"] is not None and error["param"].startswith("messages"), error
        assert "messages" in error["message"], error


@examples(200)
@given(kind=kinds, raw=st.binary(max_size=300))
def test_random_bytes_are_invalid_json(client: Client, kind: str, raw: bytes) -> None:
    status, _, answer = client.post(kind, raw)
    error = check(status, answer)
    assert error is not None
    if error["code"] == "invalid_json":
        assert "JSON" in error["message"]


@examples(100)
@given(kind=kinds, data=st.data(), cut=st.integers(0, 10_000), junk=st.binary(max_size=4))
def test_truncated_and_corrupted_json(
    client: Client, kind: str, data: st.DataObject, cut: int, junk: bytes
) -> None:
    raw = json.dumps(data.draw(valid_body(kind))).encode()
    at = cut % max(1, len(raw))
    mutated = raw[:at] + junk + raw[at + 1 :] if junk else raw[:at]
    status, _, answer = client.post(kind, mutated)
    check(status, answer, stream=b'"stream": true' in mutated)


@examples(60)
@given(
    kind=kinds,
    depth=st.integers(1, 200_000),
    opener=st.sampled_from(["[", '{"a":', '{"model":', '{"messages":[']),
)
def test_deep_nesting_is_refused_cleanly(
    client: Client, kind: str, depth: int, opener: str
) -> None:
    status, _, answer = client.post(kind, (opener * depth).encode())
    error = check(status, answer)
    assert error is not None and status == 400


@examples(40)
@given(kind=kinds, digits=st.integers(4301, 60_000), field=st.sampled_from(["max_tokens", "seed"]))
def test_numbers_of_thousands_of_digits(client: Client, kind: str, digits: int, field: str) -> None:
    prompt = '"prompt": "hi"' if kind == "completion" else '"messages": [{"role": "user"}]'
    raw = f'{{"model": "{MODEL}", {prompt}, "{field}": {"7" * digits}}}'.encode()
    status, _, answer = client.post(kind, raw)
    error = check(status, answer)
    assert error is not None and status == 400


@examples(60)
@given(
    kind=kinds,
    text=st.text(st.characters(codec=None, categories=["Cs", "Lu", "Nd"]), min_size=1, max_size=30),
    raw_bytes=st.binary(min_size=1, max_size=8).filter(lambda b: not is_utf8(b)),
)
# A lone surrogate encoded as UTF-8 is not UTF-8 (CI found the emulator serving it:
# json.loads of bytes decodes with "surrogatepass").
@example(kind="completion", text="0", raw_bytes=b"\xed\xa0\x80")
def test_surrogates_and_invalid_utf8(
    client: Client, kind: str, text: str, raw_bytes: bytes
) -> None:
    # Lone surrogates escaped in valid JSON are served (counted as bytes)...
    prompt: dict[str, Any] = (
        {"prompt": text}
        if kind == "completion"
        else {"messages": [{"role": "user", "content": text}]}
    )
    status, _, answer = client.post(kind, {"model": MODEL, "max_tokens": 2, **prompt})
    check(status, answer)
    assert status == 200
    # ... raw bytes that are not UTF-8 are a 400 that says the body is not valid JSON.
    raw = b'{"model": "' + MODEL.encode() + b'", "prompt": "' + raw_bytes + b'", "max_tokens": 2}'
    status, _, answer = client.post(kind, raw)
    error = check(status, answer)
    assert error is not None and error["code"] == "invalid_json", error


@examples(200)
@given(
    kind=kinds,
    data=st.data(),
    content_type=header_values
    | st.sampled_from(["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]),
    extra=st.dictionaries(header_names, header_values, max_size=5),
)
def test_headers_do_not_matter(
    client: Client, kind: str, data: st.DataObject, content_type: str, extra: dict[str, str]
) -> None:
    body = data.draw(valid_body(kind))
    status, _, raw = client.post(kind, body, {**extra, "Content-Type": content_type})
    check(status, raw, stream=bool(body.get("stream")))
    assert status == 200


@examples(60)
@given(
    method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "POST"]),
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/models", "/health"])
    | st.from_regex(r"\A/[a-z0-9/._-]{0,30}\Z"),
)
def test_unknown_routes_and_methods_are_openai_shaped(
    client: Client, method: str, path: str
) -> None:
    status, headers, raw = client.request(method, path, b"{}" if method != "GET" else None)
    assert status < 500, (status, raw[:300])
    if status in (404, 405):
        error = check(status, raw)
        assert error is not None and path in error["message"], error
        if status == 405:
            assert headers["Allow"], headers


# --- limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("route", sorted(ROUTES.values()))
def test_announced_oversized_body_is_refused_unread(emulator: EmulatorProcess, route: str) -> None:
    before = emulator.rss_kib()
    started = time.monotonic()
    head = (
        f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {100 * MAX_BODY_BYTES}\r\n\r\n"
    ).encode()
    answer = raw_exchange(emulator.url, head, iter([b'{"model": "' + b"x" * 100_000]))
    status = int(answer.split(b" ", 2)[1])
    assert status == 413, answer[:300]
    error = check(status, answer.split(b"\r\n\r\n", 1)[1])
    assert error is not None and str(MAX_BODY_BYTES) in error["message"]
    assert time.monotonic() - started < 5
    assert emulator.rss_kib() - before < 50_000


def test_chunked_oversized_body_is_refused_bounded(emulator: EmulatorProcess) -> None:
    before = emulator.rss_kib()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"x" * (1 << 20)
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    answer = raw_exchange(emulator.url, head, iter([chunk] * (MAX_BODY_BYTES // len(piece) + 16)))
    status = int(answer.split(b" ", 2)[1])
    assert status == 413, answer[:300]
    check(status, answer.split(b"\r\n\r\n", 1)[1].split(b"\r\n", 1)[-1].rsplit(b"\r\n0", 1)[0])
    # It read at most its limit, and gives the memory back to its allocator afterwards.
    assert emulator.rss_kib() - before < 2 * MAX_BODY_BYTES // 1024
    assert healthy(emulator.url)


def test_slowloris_does_not_block_other_clients(emulator: EmulatorProcess) -> None:
    assert_slowloris_does_not_block(emulator.url, {})
