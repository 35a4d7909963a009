"""Property-based fuzzing of `headway gateway`'s HTTP API: a real gateway process in front
of a real `headway emulate` process.

Hypothesis generates bodies and headers for ``/v1/completions`` and
``/v1/chat/completions`` (streaming and not), as the emulator's fuzz tests do
(``fuzz_http``): malformed JSON, wrong types, huge/negative/float/bool ``max_tokens``,
unknown fields, invalid UTF-8, lone surrogates, deep nesting, odd content types, and the
gateway's own headers garbled (``Authorization``, ``x-headway-priority``,
``x-headway-deadline-ms``, ``x-headway-retry-ticket``). The guarantees checked on every
answer:

* never a 5xx for client input (a 503 ``overloaded_error`` refusal is load, not input, and
  at this load there is none; a 502 only when the upstream failed, and here it never does);
* the gateway keeps serving and logs no traceback;
* every 4xx is OpenAI-shaped, ``{"error": {"message", "type", "param", "code"}}``, and a
  field's or header's mistake names it.

Plus bodies over the size limit (413 without reading them) and a slowloris client that
must not block others. ``HEADWAY_FUZZ_EXAMPLES`` multiplies the example counts; run with
``-s`` to see how many requests were sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import assume, example, given
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
from headway.gateway.guards import MAX_BODY_BYTES
from headway.gateway.process import GatewayProcess

pytestmark = pytest.mark.timeout(180)

KEY = "key-fuzz"
OTHER = "key-other"
ADMIN = "admin-fuzz"
AUTH = {"Authorization": f"Bearer {KEY}"}
HEADERS = ("x-headway-priority", "x-headway-deadline-ms", "x-headway-retry-ticket")
TALLY = {"requests": 0, "5xx": 0, "shed_503": 0}


class _Gateway:
    """The emulator and the gateway processes, and the gateway's stderr, drained."""

    def __init__(self, emulator: EmulatorProcess, gateway: GatewayProcess) -> None:
        self.emulator = emulator
        self.gateway = gateway
        self.url = gateway.url
        self.stderr = gateway.output  # drained by the process helper


@pytest.fixture(scope="module")
def stack() -> Iterator[_Gateway]:
    # A small KV pool keeps max_model_len short; speedup 50 answers a 12-token request in
    # milliseconds.
    with EmulatorProcess(["--speedup", "50", "--num-kv-blocks", "512"]) as emu:
        config = {
            "upstreams": [{"url": emu.url}],
            "tenants": {KEY: {"name": "fuzz"}, OTHER: {"name": "other"}},
            "models": [MODEL],
            "admin_token": ADMIN,
        }
        with GatewayProcess(config) as gw:
            yield _Gateway(emu, gw)
            # Both survived everything the module sent.
            assert gw.proc is not None and gw.proc.poll() is None
            assert emu.proc is not None and emu.proc.poll() is None
            assert healthy(gw.url)


@pytest.fixture(scope="module")
def client(stack: _Gateway) -> Iterator[Client]:
    c = Client(stack.url)
    yield c
    c.close()
    TALLY["requests"] += c.count
    print(  # noqa: T201 - the count for the notes (pytest -s)
        f"\ngateway fuzz: {TALLY['requests']} generated requests, {TALLY['5xx']} 5xx, "
        f"{TALLY['shed_503']} 503 refusals; gateway stderr lines: {len(stack.stderr)}"
    )
    assert not any("Traceback" in line or "Error handling" in line for line in stack.stderr), (
        "".join(stack.stderr)[-3000:]
    )


def check(
    status: int, data: bytes, *, stream: bool = False, headers: Any = None
) -> dict[str, Any] | None:
    """The guarantees every answer keeps; the error object of a 4xx, else ``None``."""
    if status >= 500:
        TALLY["5xx"] += 1
    assert status < 500, (status, data[:500])
    if status >= 400:
        error = openai_error(data)
        if status == 401:
            assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
        elif status == 429:
            assert error["type"] == "overloaded_error", error
            assert headers is None or headers["Retry-After"], headers
        else:
            assert error["type"] == "invalid_request_error", error
        return error
    assert status == 200, (status, data[:500])
    if stream:
        assert data.endswith(b"data: [DONE]\n\n"), data[-200:]
    else:
        json.loads(data)
    return None


def post(
    client: Client, kind: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, Any, bytes]:
    return client.post(kind, body, {**AUTH, **(headers or {})})


def strict_json(body: object) -> bool:
    """Whether ``body`` is JSON without NaN/Infinity (the gateway refuses those; Python's
    ``json`` module, and so the emulator, reads them) and without lone surrogates (refused
    by the gateway's decoder)."""
    try:
        text = json.dumps(body, allow_nan=False, ensure_ascii=False)
        # A high surrogate followed by a low one is a pair: on the wire (escaped, as the
        # client sends it) it is one valid character.
        text.encode("utf-16", "surrogatepass").decode("utf-16").encode("utf-8")
    except (ValueError, UnicodeError):
        return False
    return True


# --- valid requests --------------------------------------------------------------------------

good_headers = st.fixed_dictionaries(
    {},
    optional={
        "x-headway-priority": st.sampled_from(["critical", "interactive", "background"]),
        "x-headway-deadline-ms": st.integers(30_000, 10**17).map(str),
        "x-headway-retry-ticket": st.integers(0, 2**62).map(str) | header_values,
        "x-headway-tenant": st.sampled_from(["other", "fuzz", "admin"]),
    },
)


@examples(100)
@given(kind=kinds, data=st.data(), headers=good_headers)
def test_valid_requests_are_served_exactly(
    client: Client, kind: str, data: st.DataObject, headers: dict[str, str]
) -> None:
    body = data.draw(valid_body(kind))
    assume(strict_json(body))
    if body.get("stream"):
        body["stream_options"] = {"include_usage": True}
    status, _, raw = post(client, kind, body, headers)
    check(status, raw, stream=bool(body.get("stream")))
    if body.get("stream"):
        events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line[6:7] == "{"]
        assert events[-1]["usage"]["completion_tokens"] == body["max_tokens"]
    else:
        assert json.loads(raw)["usage"]["completion_tokens"] == body["max_tokens"]


# --- arbitrary and mutated bodies ------------------------------------------------------------


@examples(250)
@given(
    kind=kinds,
    body=st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), json_values, max_size=8),
)
@example(kind="chat", body={"messages": [{"role": "user", "content": "hi"}]})  # no model
@example(kind="completion", body={"model": MODEL, "prompt": "x", "stream": None})  # was a 400
def test_arbitrary_objects_never_5xx(client: Client, kind: str, body: dict[str, Any]) -> None:
    status, headers, raw = post(client, kind, body)
    error = check(status, raw, stream=body.get("stream") is True, headers=headers)
    if error is not None and "model" not in body and strict_json(body):
        assert error["param"] is not None, error  # the gateway names the (first) bad field


@examples(250)
@given(kind=kinds, data=st.data(), field=st.sampled_from(FIELDS), value=json_values)
def test_one_field_replaced_never_5xx(
    client: Client, kind: str, data: st.DataObject, field: str, value: object
) -> None:
    body = data.draw(valid_body(kind))
    body[field] = value
    status, headers, raw = post(client, kind, body)
    error = check(status, raw, stream=body.get("stream") is True, headers=headers)
    if error is not None and error["param"] is not None:
        assert error["param"].split(".")[0].split("[")[0] in FIELDS, error


@examples(200)
@given(kind=kinds, data=st.data(), field=st.sampled_from(sorted(WRONG)))
def test_wrong_type_names_the_field(
    client: Client, kind: str, data: st.DataObject, field: str
) -> None:
    body = data.draw(valid_body(kind))
    body.pop("stream", None)
    body[field] = data.draw(WRONG[field])
    assume(strict_json(body))
    if field == "stream_options":
        body["stream"] = True
    status, _, raw = post(client, kind, body)
    error = check(status, raw)
    assert error is not None, (body, raw[:300])
    assert error["param"] == field, error
    assert f"`{field}`" in error["message"] or repr(body[field])[:10] in error["message"], error
    assert status == (404 if field == "model" and isinstance(body[field], str) else 400)


@examples(80)
@given(
    kind=kinds,
    value=st.integers(min_value=2**13, max_value=2**200) | st.integers(max_value=0),
    field=st.sampled_from(["max_tokens", "max_completion_tokens"]),
    stream=st.booleans(),
)
@example(kind="completion", value=2**13, field="max_tokens", stream=False)
@example(kind="completion", value=2**64, field="max_tokens", stream=False)
@example(kind="chat", value=-(2**80), field="max_completion_tokens", stream=True)
def test_huge_and_negative_max_tokens_are_400(
    client: Client, kind: str, value: int, field: str, stream: bool
) -> None:
    prompt: dict[str, Any] = (
        {"prompt": "hi"} if kind == "completion" else {"messages": [{"role": "user"}]}
    )
    if kind == "completion":
        field = "max_tokens"  # the emulator reads max_completion_tokens on chat only
    body = {"model": MODEL, **prompt, field: value, "stream": stream}
    status, _, raw = post(client, kind, body)
    error = check(status, raw)
    assert status == 400 and error is not None, (status, raw[:300])
    # Too large for any replica (the gateway: too_large) or for the engine (its context).
    assert error["param"] in (field, "prompt", "messages", None), error


@examples(150)
@given(kind=kinds, raw=st.binary(max_size=300))
def test_random_bytes_are_400(client: Client, kind: str, raw: bytes) -> None:
    status, _, answer = post(client, kind, raw)
    assert check(status, answer) is not None


@examples(100)
@given(kind=kinds, data=st.data(), cut=st.integers(0, 10_000), junk=st.binary(max_size=4))
def test_truncated_and_corrupted_json(
    client: Client, kind: str, data: st.DataObject, cut: int, junk: bytes
) -> None:
    raw = json.dumps(data.draw(valid_body(kind))).encode()
    at = cut % max(1, len(raw))
    mutated = raw[:at] + junk + raw[at + 1 :] if junk else raw[:at]
    status, _, answer = post(client, kind, mutated)
    check(status, answer, stream=b'"stream": true' in mutated)


@examples(40)
@given(
    kind=kinds,
    depth=st.integers(1, 200_000),
    opener=st.sampled_from(["[", '{"a":', '{"model":', '{"model": "m", "messages":[', '{"x":[']),
)
@example(kind="chat", depth=5_000, opener='{"model": "m", "messages":[')  # RecursionError: 500
def test_deep_nesting_is_refused_cleanly(
    client: Client, kind: str, depth: int, opener: str
) -> None:
    status, _, answer = post(client, kind, (opener * depth).encode())
    assert check(status, answer) is not None and status == 400


@examples(30)
@given(kind=kinds, digits=st.integers(4301, 60_000), field=st.sampled_from(["max_tokens", "seed"]))
def test_numbers_of_thousands_of_digits(client: Client, kind: str, digits: int, field: str) -> None:
    prompt = '"prompt": "hi"' if kind == "completion" else '"messages": [{"role": "user"}]'
    raw = f'{{"model": "{MODEL}", {prompt}, "{field}": {"7" * digits}}}'.encode()
    status, _, answer = post(client, kind, raw)
    assert check(status, answer) is not None and status == 400


@examples(50)
@given(
    kind=kinds,
    text=st.text(st.characters(codec=None, categories=["Cs", "Lu", "Nd"]), min_size=1, max_size=30),
    raw_bytes=st.binary(min_size=1, max_size=8).filter(lambda b: not is_utf8(b)),
    where=st.sampled_from(["model", "prompt", "unknown"]),
)
def test_surrogates_and_invalid_utf8(
    client: Client, kind: str, text: str, raw_bytes: bytes, where: str
) -> None:
    # Lone surrogates escaped in JSON are refused with a 400 that says so (the gateway's
    # decoder refuses them; RFC 8259 leaves their meaning open); paired ones are served.
    prompt: dict[str, Any] = (
        {"prompt": text}
        if kind == "completion"
        else {"messages": [{"role": "user", "content": text}]}
    )
    status, _, answer = post(client, kind, {"model": MODEL, "max_tokens": 2, **prompt})
    error = check(status, answer)
    if strict_json(text):
        assert status == 200
    else:
        assert error is not None and "surrogate" in error["message"], error
    # ... and in `model` they are a 400 or the 404 of an unknown model.
    status, _, answer = post(client, kind, {"model": text, "max_tokens": 2, **prompt})
    assert check(status, answer) is not None
    # Raw bytes that are not UTF-8, wherever they are, are a 400.
    field = {"model": b'"model": "', "prompt": b'"prompt": "', "unknown": b'"zz": "'}[where]
    head = b'{"model": "' + MODEL.encode() + b'", ' if where != "model" else b"{"
    raw = head + field + raw_bytes + b'", "prompt": "x", "messages": [], "max_tokens": 2}'
    status, _, answer = post(client, kind, raw)
    assert check(status, answer) is not None and status == 400


# --- headers ---------------------------------------------------------------------------------

bad_deadlines = (
    st.integers(max_value=-1).map(str)
    | st.integers(19, 6000).map(lambda n: "9" * n)
    | st.text(max_size=12).filter(lambda t: not (t.strip().isascii() and t.strip().isdigit()))
    | st.sampled_from(["1.5", "1e3", "²", "٣", "0x10", "+5", "-0", "  ", "9" * 5000])
)


def _header_safe(value: str) -> bool:
    return value == value.strip() and all(" " <= c <= "~" or "\xa0" <= c <= "\xff" for c in value)


@examples(100)
@given(kind=kinds, value=bad_deadlines.filter(_header_safe))
@example(kind="chat", value="²")  # str.isdigit() but not int()
@example(kind="completion", value="9" * 5000)  # int() refuses 4300+ digits: was a 500
@example(kind="completion", value="9" * 400)  # / 1000.0 overflows a float: was a 500
def test_bad_deadline_header_names_it(client: Client, kind: str, value: str) -> None:
    prompt: dict[str, Any] = (
        {"prompt": "hi"} if kind == "completion" else {"messages": [{"role": "user"}]}
    )
    status, _, raw = post(
        client, kind, {"model": MODEL, **prompt, "max_tokens": 2}, {HEADERS[1]: value}
    )
    error = check(status, raw)
    assert status == 400 and error is not None, (value, raw[:300])
    assert error["param"] == HEADERS[1] and HEADERS[1] in error["message"], error


@examples(80)
@given(
    kind=kinds,
    priority=st.text(max_size=15).filter(
        lambda t: t not in ("critical", "interactive", "background")
    ),
    ticket=st.text(max_size=30) | st.sampled_from(["²", "9" * 5000, "-1", "18446744073709551616"]),
)
@example(kind="chat", priority="urgent", ticket="9" * 5000)  # int() of 5000 digits: was a 500
def test_bad_priority_names_it_and_bad_ticket_is_ignored(
    client: Client, kind: str, priority: str, ticket: str
) -> None:
    prompt: dict[str, Any] = (
        {"prompt": "hi"} if kind == "completion" else {"messages": [{"role": "user"}]}
    )
    body = {"model": MODEL, **prompt, "max_tokens": 2}
    if _header_safe(ticket):
        status, _, raw = post(client, kind, body, {HEADERS[2]: ticket})
        check(status, raw)
        assert status == 200, raw[:300]  # an unknown ticket is no ticket
    if _header_safe(priority):
        status, _, raw = post(client, kind, body, {HEADERS[0]: priority, HEADERS[2]: "1"})
        error = check(status, raw)
        assert status == 400 and error is not None
        assert error["param"] == HEADERS[0] and HEADERS[0] in error["message"], error


@examples(80)
@given(
    kind=kinds,
    auth=st.sampled_from(["", "Bearer", "Bearer ", "Basic a2V5", f"Bearer {KEY}x", f"{KEY}"])
    | st.text(max_size=40).filter(_header_safe)
    | st.text(max_size=40).filter(_header_safe).map(lambda t: f"Bearer {t}"),
)
def test_wrong_keys_are_401(client: Client, kind: str, auth: str) -> None:
    prompt: dict[str, Any] = {"prompt": "hi"} if kind == "completion" else {"messages": []}
    status, _, raw = client.post(
        kind, {"model": MODEL, **prompt, "max_tokens": 2}, {"Authorization": auth}
    )
    if auth.strip() in (f"Bearer {KEY}", f"Bearer {OTHER}"):
        return
    error = check(status, raw)
    assert status == 401 and error is not None, (auth, raw[:300])


@examples(150)
@given(
    kind=kinds,
    data=st.data(),
    content_type=header_values
    | st.sampled_from(["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]),
    extra=st.dictionaries(
        header_names.filter(lambda h: h.lower() not in (*HEADERS, "authorization")),
        header_values,
        max_size=5,
    ),
)
def test_other_headers_do_not_matter(
    client: Client, kind: str, data: st.DataObject, content_type: str, extra: dict[str, str]
) -> None:
    body = data.draw(valid_body(kind))
    assume(strict_json(body))
    status, _, raw = post(client, kind, body, {**extra, "Content-Type": content_type})
    check(status, raw, stream=bool(body.get("stream")))
    assert status == 200


def test_client_cache_salt_is_refused(client: Client) -> None:
    """The gateway sets each tenant's salt; a client's own could be another tenant's."""
    for salt in ("abc", "", None, 5):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "cache_salt": salt}
        status, _, raw = post(client, "completion", body)
        error = check(status, raw)
        assert status == 400 and error is not None and error["param"] == "cache_salt", raw


@examples(60)
@given(
    method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "POST"]),
    path=st.sampled_from([*ROUTES.values(), "/v1/models", "/health", "/admin/state", "/metrics"])
    | st.from_regex(r"\A/[a-z0-9/._-]{0,30}\Z"),
)
def test_unknown_routes_and_methods_are_openai_shaped(
    client: Client, method: str, path: str
) -> None:
    status, headers, raw = client.request(method, path, b"{}" if method != "GET" else None)
    assert status < 500, (status, raw[:300])
    if status >= 400:
        error = openai_error(raw)
        if status in (404, 405):
            assert path in error["message"], error
        if status == 405:
            assert headers["Allow"], headers


# --- limits ----------------------------------------------------------------------------------


def _gateway_rss(stack: _Gateway) -> int:
    return stack.gateway.rss_kib()


@pytest.mark.parametrize("route", sorted(ROUTES.values()))
def test_announced_oversized_body_is_refused_unread(stack: _Gateway, route: str) -> None:
    before = _gateway_rss(stack)
    started = time.monotonic()
    head = (
        f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Length: {100 * MAX_BODY_BYTES}\r\n\r\n"
    ).encode()
    answer = raw_exchange(stack.url, head, iter([b'{"model": "' + b"x" * 100_000]))
    status = int(answer.split(b" ", 2)[1])
    assert status == 413, answer[:300]
    TALLY["requests"] += 1
    error = openai_error(answer.split(b"\r\n\r\n", 1)[1])
    assert str(MAX_BODY_BYTES) in error["message"]
    assert time.monotonic() - started < 5
    assert _gateway_rss(stack) - before < 50_000


def test_chunked_oversized_body_is_refused_bounded(stack: _Gateway) -> None:
    before = _gateway_rss(stack)
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"x" * (1 << 20)
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    answer = raw_exchange(stack.url, head, iter([chunk] * (MAX_BODY_BYTES // len(piece) + 16)))
    status = int(answer.split(b" ", 2)[1])
    assert status == 413, answer[:300]
    TALLY["requests"] += 1
    body = answer.split(b"\r\n\r\n", 1)[1]
    openai_error(body.split(b"\r\n", 1)[-1].rsplit(b"\r\n0", 1)[0] if b"\r\n" in body else body)
    # It read at most its limit (the bytes are not kept after the refusal).
    assert _gateway_rss(stack) - before < 2 * MAX_BODY_BYTES // 1024
    assert healthy(stack.url)


def test_slowloris_does_not_block_other_clients(stack: _Gateway) -> None:
    TALLY["requests"] += assert_slowloris_does_not_block(stack.url, AUTH)
