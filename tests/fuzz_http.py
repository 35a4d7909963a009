"""Shared pieces of the HTTP fuzz tests (emulator and gateway): Hypothesis settings scaled by
``HEADWAY_FUZZ_EXAMPLES``, a keep-alive client that counts what it sent, the OpenAI error
shape every 4xx must have, JSON/header strategies and raw-socket helpers for oversized
bodies and slow clients."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

MODEL = "llama-3-8b"
SCALE = max(1, int(os.environ.get("HEADWAY_FUZZ_EXAMPLES", "1")))
ROUTES = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}
FUZZ = settings(
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def examples(n: int) -> settings:
    """``n`` examples (times ``HEADWAY_FUZZ_EXAMPLES``)."""
    return settings(FUZZ, max_examples=n * SCALE)


class Client:
    """One keep-alive HTTP/1.1 connection; reconnects only when the server closed it."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.conn: http.client.HTTPConnection | None = None
        self.count = 0

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            try:
                self.conn.request(method, path, body=body, headers=headers or {})
                response = self.conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt:
                    raise
                continue  # a keep-alive connection the server had closed
            except BaseException:
                self.close()  # e.g. a header http.client cannot encode: start afresh
                raise
            if response.will_close:
                self.close()
            self.count += 1
            return response.status, response.headers, data
        raise AssertionError("unreachable")

    def post(
        self, kind: str, body: object, headers: dict[str, str] | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.request(
            "POST", ROUTES[kind], raw, {"Content-Type": "application/json", **(headers or {})}
        )

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def healthy(url: str) -> bool:
    """``GET /health`` answers 200."""
    probe = Client(url)
    try:
        return probe.request("GET", "/health")[0] == 200
    finally:
        probe.close()


def openai_error(data: bytes) -> dict[str, Any]:
    """The ``error`` object of a 4xx body, checked to be OpenAI-shaped."""
    body = json.loads(data)
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and len(error["message"]) > 10, error
    assert isinstance(error["type"], str), error
    assert error["param"] is None or isinstance(error["param"], str), error
    return error  # type: ignore[no-any-return]


# --- strategies ------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "temperature",
    "stream", "stream_options", "seed", "echo", "top_p", "stop", "logit_bias", "user",
]  # fmt: skip
good_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=40)}
    ),
    min_size=1,
    max_size=3,
)
kinds = st.sampled_from(["completion", "chat"])


def valid_body(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    """A body the emulator serves: ``max_tokens`` 1-12, optional modelled and unknown fields."""
    prompt = (
        {"prompt": st.text(max_size=60) | st.lists(st.integers(0, 31_999), min_size=1, max_size=20)}
        if kind == "completion"
        else {"messages": good_messages}
    )
    return st.fixed_dictionaries(
        {"model": st.just(MODEL), **prompt, "max_tokens": st.integers(1, 12)},
        optional={
            "temperature": st.sampled_from([0, 0.0, 0.5, 1, 2]),
            "seed": st.integers(-(2**70), 2**70),
            "n": st.just(1),
            "stream": st.booleans(),
            "top_p": json_values,  # not modelled: accepted and ignored
            "unknown_field": json_values,
        },
    )


WRONG: dict[str, st.SearchStrategy[object]] = {
    "model": st.integers() | st.booleans() | st.lists(st.text(), max_size=2) | st.floats(),
    "max_tokens": (
        st.integers(max_value=0)
        | st.floats().filter(lambda x: not float(x).is_integer())
        | st.booleans()
        | st.text(max_size=5)
        | st.lists(st.integers(), max_size=2)
    ),
    "n": st.integers(max_value=0) | st.integers(2, 2**70) | st.floats(0.1, 9.9) | st.booleans(),
    "temperature": (
        st.floats().filter(lambda x: not 0 <= x <= 2)
        | st.booleans()
        | st.text(max_size=5)
        | st.integers(3, 2**70)
        | st.integers(max_value=-1)
    ),
    "stream": st.integers() | st.text(max_size=5) | st.floats() | st.lists(st.booleans()),
    "seed": st.floats() | st.text(max_size=5) | st.booleans() | st.lists(st.integers()),
    "stream_options": st.integers() | st.text(max_size=5) | st.lists(st.integers(), max_size=2),
}
"""Wrong values for the fields a server reads, by field."""


def is_utf8(raw: bytes) -> bool:
    """Whether ``raw`` decodes as UTF-8."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


_FRAMING = {"content-length", "transfer-encoding", "host", "connection", "expect", "upgrade",
            "content-encoding"}  # fmt: skip
header_names = st.from_regex(r"\A[A-Za-z][A-Za-z0-9-]{0,20}\Z").filter(
    lambda h: h.lower() not in _FRAMING
)
header_values = st.from_regex(r"\A[ -~]{0,40}\Z").map(str.strip)


# --- raw sockets -----------------------------------------------------------------------------


def raw_exchange(url: str, head: bytes, body_chunks: Iterator[bytes]) -> bytes:
    """Send a request by hand; the server may answer and close before it is all sent."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head)
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused early: what we want
        answer = b""
        with closed_first():
            while chunk := sock.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                    break
    return answer


def closed_first() -> contextlib.suppress:
    """Ignore the server closing the connection first (what a refusal looks like)."""
    return contextlib.suppress(ConnectionResetError, BrokenPipeError)


def assert_slowloris_does_not_block(url: str, headers: dict[str, str]) -> int:
    """64 clients trickle a request header a byte at a time while one fast client sends 50
    requests: every fast one is answered 200 within 10 s. Returns the fast requests sent."""
    parts = urlsplit(url)
    stop = threading.Event()
    slow = [socket.create_connection((parts.hostname, parts.port), timeout=10) for _ in range(64)]

    def trickle() -> None:
        header = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
        for i in range(len(header)):
            if stop.is_set():
                return
            for sock in slow:
                with closed_first():
                    sock.send(header[i : i + 1])
            time.sleep(0.05)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        fast = Client(url)
        started = time.monotonic()
        for i in range(50):
            body = {"model": MODEL, "prompt": f"hello {i}", "max_tokens": 4}
            status, _, raw = fast.post("completion", body, {**headers, "Connection": "close"})
            assert status == 200, raw[:300]
        assert time.monotonic() - started < 10
        fast.close()
        return fast.count
    finally:
        stop.set()
        thread.join()
        for sock in slow:
            sock.close()
