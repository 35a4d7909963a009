"""The HTTP boundary of the gateway and the emulator, tried as a hostile client would, over
raw loopback sockets: compressed bodies and a gzip bomb (RSS measured), malformed and
oversized headers (JSON, HTTP/1.1, no echo, one short log line), slowloris headers and
bodies, a connection bound, a client's half-close, strictly typed admin bodies, the
emulator's admin token and token-id range. (A port in use or out of range:
tests/e2e/test_cli_first_contact.py.)"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
import zlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_http import examples, json_values, openai_error
from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

MODEL = "llama-3-8b"
KEY = "key-boundary-tenant"
ADMIN = "admin-boundary-token"
METRICS = "metrics-boundary-token"
EMU_ADMIN = "emulator-admin-token"
TIMEOUT_S = 1.0
BODY = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 4}).encode()


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorProcess]:
    with EmulatorProcess(["--speedup", "50", "--admin-token", EMU_ADMIN]) as emu:
        yield emu


@pytest.fixture(scope="module")
def gateway(emulator: EmulatorProcess) -> Iterator[GatewayProcess]:
    config = {
        "upstreams": [{"url": emulator.url}],
        "tenants": {KEY: {"name": "acme"}},
        "models": [MODEL],
        "admin_token": ADMIN,
        "metrics_token": METRICS,
        "header_timeout_s": TIMEOUT_S,
        "body_timeout_s": TIMEOUT_S,
    }
    with GatewayProcess(config) as gw:
        yield gw


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _exchange(url: str, data: bytes, *, half_close: bool = False, timeout_s: float = 10) -> bytes:
    """Send ``data`` on a fresh connection, read until the server closes it."""
    with socket.create_connection(_address(url), timeout=timeout_s) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json",
             f"Content-Length: {len(body)}", "Connection: close", *headers]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _status(answer: bytes) -> tuple[str, int]:
    """The status line's version and code of the last (final) answer."""
    head = answer.split(b"\r\n\r\n")
    finals = [h for h in head if h.startswith(b"HTTP/") and not h.startswith(b"HTTP/1.1 100")]
    version, code = finals[-1].split(b" ", 2)[:2]
    return version.decode(), int(code)


def _json_body(answer: bytes) -> dict[str, Any]:
    return openai_error(answer.split(b"\r\n\r\n", 1)[1].split(b"\r\n\r\n")[-1])


def _bomb(inflated_mb: int) -> bytes:
    """A gzip body of ``inflated_mb`` MB of zeros (about 1 KB per MB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join(packer.compress(block) for _ in range(inflated_mb)) + packer.flush()


@pytest.mark.parametrize("server", ["gateway", "emulator"])
def test_encoded_bodies_are_415_and_a_gzip_bomb_costs_no_memory(
    server: str, request: pytest.FixtureRequest
) -> None:
    proc: GatewayProcess | EmulatorProcess = request.getfixturevalue(server)
    auth = f"Authorization: Bearer {KEY}"
    answer = _exchange(proc.url, _post("/v1/completions", b"not gzip", auth,
                                       "Content-Encoding: gzip"))  # fmt: skip
    assert _status(answer) == ("HTTP/1.1", 415), answer[:300]  # was a 500 and a traceback
    assert _json_body(answer)["param"] == "Content-Encoding"
    bomb = _bomb(300)
    before_kib = proc.rss_kib()
    started = time.monotonic()
    answer = _exchange(proc.url, _post("/v1/completions", bomb, auth, "Content-Encoding: gzip"))
    assert _status(answer)[1] == 415, answer[:300]
    growth_mb = (proc.rss_kib() - before_kib) / 1024
    assert growth_mb <= 20, f"RSS grew {growth_mb:.0f} MB for a {len(bomb)} byte gzip bomb"
    assert time.monotonic() - started < 2
    # Still serving, and plain bodies are read as before.
    assert _status(_exchange(proc.url, _post("/v1/completions", BODY, auth)))[1] == 200


def test_parser_refusals_are_json_http11_without_echo_and_one_log_line(
    gateway: GatewayProcess,
) -> None:
    secret_line = f"Authorization: Bearer {KEY}\x01".encode()
    cases = {
        400: b"GET /health HTTP/1.1\r\nHost: x\r\n" + secret_line + b"\r\n\r\n",
        431: b"GET /health HTTP/1.1\r\nHost: x\r\nX-Key: " + KEY.encode() * 800 + b"\r\n\r\n",
    }
    many = b"".join(b"X-%d: %s\r\n" % (i, KEY.encode()) for i in range(200))
    cases_many = b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n"
    before = len(gateway.output)
    for status, data in [*cases.items(), (431, cases_many)]:
        answer = _exchange(gateway.url, data)
        assert _status(answer) == ("HTTP/1.1", status), answer[:300]
        assert KEY.encode() not in answer and b"Bearer" not in answer
        error = _json_body(answer)
        assert error["type"] == "invalid_request_error"
    _settle(gateway, before + 3)
    written = gateway.output[before:]
    assert len(written) == 3, written  # one line each (was a ~10-line traceback)
    assert all(len(line) < 160 and "Traceback" not in line for line in written), written
    assert not any(KEY in line or "Bearer" in line for line in written), written


def _settle(proc: GatewayProcess | EmulatorProcess, lines: int, limit_s: float = 5.0) -> None:
    """Wait until the server has written ``lines`` lines of output (or the limit)."""
    end = time.monotonic() + limit_s
    while len(proc.output) < lines and time.monotonic() < end:
        time.sleep(0.02)


def _open_connections(url: str, n: int) -> list[socket.socket]:
    """``n`` connections; none is left open when one of them cannot be made."""
    opened: list[socket.socket] = []
    try:
        for _ in range(n):
            opened.append(socket.create_connection(_address(url), timeout=5))  # noqa: PERF401 - closed on failure
    except BaseException:
        for sock in opened:
            sock.close()
        raise
    return opened


def test_slowloris_headers_and_bodies_are_closed_after_their_timeouts(
    gateway: GatewayProcess,
) -> None:
    opened = _open_connections(gateway.url, 200)
    headers, bodies = opened[:150], opened[150:]
    for sock in bodies:  # whole headers, then a chunked body that never ends
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
        )  # fmt: skip
    started = time.monotonic()
    trickle = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    open_socks = dict.fromkeys(headers + bodies, b"")
    i = 0
    # Trickle a byte (or a 1-byte chunk) every 0.1 s to each until the server closes it.
    while open_socks and time.monotonic() - started < TIMEOUT_S + 5:
        for sock in list(open_socks):
            with contextlib.suppress(OSError):
                sock.send(trickle[i : i + 1] if sock in headers else b"1\r\na\r\n")
        readable, _, _ = select.select(list(open_socks), [], [], 0.1)
        for sock in readable:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            open_socks[sock] += data
            if not data:
                del open_socks[sock]
        i += 1
    try:
        assert not open_socks, f"{len(open_socks)} of 200 still open after {TIMEOUT_S + 5} s"
    finally:
        for sock in headers + bodies:
            sock.close()


def _faults(emulator: EmulatorProcess, method: str, body: bytes = b"") -> int:
    head = (
        f"{method} /admin/faults HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Authorization: Bearer {EMU_ADMIN}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return _status(_exchange(emulator.url, head.encode() + body))[1]


def test_the_header_timeout_spares_idle_keep_alive_and_slow_answers(
    gateway: GatewayProcess, emulator: EmulatorProcess
) -> None:
    keep = _post("/v1/completions", BODY, f"Authorization: Bearer {KEY}").replace(
        b"Connection: close", b"Connection: keep-alive"
    )
    # The reader is closed too: a socket closed while its makefile() is open stays open
    # until the reader is collected (a ResourceWarning in whichever test runs then).
    with (
        socket.create_connection(_address(gateway.url), timeout=10) as sock,
        sock.makefile("rb") as reader,
    ):

        def answer() -> int:
            status = int(reader.readline().split()[1])
            length = 0
            while (line := reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reader.read(length)
            return status

        sock.sendall(keep)
        assert answer() == 200
        time.sleep(TIMEOUT_S * 1.5)  # idle between requests longer than the header timeout
        sock.sendall(keep)
        assert answer() == 200
        assert _faults(emulator, "POST", b'{"delay_s": %f}' % (TIMEOUT_S * 1.5)) == 200
        try:
            sock.sendall(keep)  # its answer takes longer than the header timeout
            assert answer() == 200
        finally:
            assert _faults(emulator, "DELETE") == 200


def test_the_connection_bound_answers_503(emulator: EmulatorProcess) -> None:
    config = {"upstreams": [{"url": emulator.url}], "max_connections": 20}
    with GatewayProcess(config) as gw:
        held = _open_connections(gw.url, 20)
        try:
            answer = _exchange(gw.url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _status(answer) == ("HTTP/1.1", 503), answer[:300]
            assert _json_body(answer)["code"] == "too_many_connections"
        finally:
            for sock in held:
                sock.close()
        end = time.monotonic() + 5
        answer = b""
        while time.monotonic() < end:  # the server notices the closes
            answer = _exchange(gw.url, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close"
                               b"\r\n\r\n")  # fmt: skip
            if _status(answer)[1] == 200:
                break
            time.sleep(0.05)
        assert _status(answer)[1] == 200, answer[:300]


@pytest.mark.parametrize("server", ["gateway", "emulator"])
def test_a_client_that_half_closes_after_its_request_gets_the_answer(
    server: str, request: pytest.FixtureRequest
) -> None:
    proc: GatewayProcess | EmulatorProcess = request.getfixturevalue(server)
    data = _post("/v1/completions", BODY, f"Authorization: Bearer {KEY}")
    for _ in range(5):
        answer = _exchange(proc.url, data, half_close=True)
        assert _status(answer) == ("HTTP/1.1", 200), answer[:300]  # was no answer (499)
        assert json.loads(answer.rsplit(b"\r\n\r\n", 1)[1])["usage"]["completion_tokens"] == 4


def _admin(url: str, body: bytes, token: str = ADMIN) -> tuple[int, dict[str, Any]]:
    answer = _exchange(url, _post("/admin/drain", body, f"Authorization: Bearer {token}"))
    return _status(answer)[1], json.loads(answer.split(b"\r\n\r\n", 1)[1])


def test_admin_drain_takes_strict_types(gateway: GatewayProcess, emulator: EmulatorProcess) -> None:
    wrong = {
        b'{"upstream": "%s", "drain": "false"}' % emulator.url.encode(): "drain",
        b'{"upstream": "%s", "drain": 0}' % emulator.url.encode(): "drain",
        b'{"upstream": "%s", "drain": null}' % emulator.url.encode(): "drain",
        b'{"upstream": null}': "upstream",
        b'{"upstream": 5}': "upstream",
        b'{"upstream": ["%s"]}' % emulator.url.encode(): "upstream",
        b'{"drain": true}': "upstream",
        b'{"upstream": "%s", "drains": true}' % emulator.url.encode(): "drains",
    }
    for body, field in wrong.items():
        status, answer = _admin(gateway.url, body)
        assert status == 400, (body, answer)
        assert answer["error"]["param"] == field, (body, answer)
        assert f"`{field}`" in answer["error"]["message"], answer
    for body in (b"[]", b'"x"', b"not json", b""):
        assert _admin(gateway.url, body)[0] == 400, body
    state = _exchange(gateway.url, b"GET /admin/state HTTP/1.1\r\nHost: x\r\nAuthorization: "
                      b"Bearer " + ADMIN.encode() + b"\r\nConnection: close\r\n\r\n")  # fmt: skip
    assert not json.loads(state.split(b"\r\n\r\n", 1)[1])["upstreams"][0]["draining"]
    up = emulator.url.encode()
    assert _admin(gateway.url, b'{"upstream": "%s", "drain": false}' % up)[0] == 200


@examples(40)
@given(
    drain=json_values.filter(lambda v: not isinstance(v, bool)),
    upstream=json_values.filter(lambda v: not isinstance(v, str)),
    which=st.sampled_from(["drain", "upstream"]),
)
def test_admin_drain_refuses_every_wrong_type(
    gateway: GatewayProcess, emulator: EmulatorProcess, drain: object, upstream: object, which: str
) -> None:
    body = {"upstream": upstream} if which == "upstream" else {"upstream": emulator.url}
    if which == "drain":
        body["drain"] = drain
    raw = json.dumps(body)
    status, answer = _admin(gateway.url, raw.encode())
    strict = "NaN" not in raw and "Infinity" not in raw  # else not JSON at all: still 400
    assert status == 400 and (answer["error"]["param"] == which or not strict), (raw, answer)
    state = _exchange(gateway.url, b"GET /admin/state HTTP/1.1\r\nHost: x\r\nAuthorization: "
                      b"Bearer " + ADMIN.encode() + b"\r\nConnection: close\r\n\r\n")  # fmt: skip
    assert not json.loads(state.split(b"\r\n\r\n", 1)[1])["upstreams"][0]["draining"]


def test_emulator_faults_need_the_admin_token_and_token_ids_fit_the_vocabulary(
    emulator: EmulatorProcess,
) -> None:
    for method in ("GET", "DELETE"):
        head = f"{method} /admin/faults HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        assert _status(_exchange(emulator.url, (head + "\r\n").encode()))[1] == 401
        good = head + f"Authorization: Bearer {EMU_ADMIN}\r\n\r\n"
        assert _status(_exchange(emulator.url, good.encode()))[1] == 200
    stall = b'{"stall": true}'
    answer = _exchange(emulator.url, _post("/admin/faults", stall, "Authorization: Bearer x"))
    assert _status(answer)[1] == 401 and _json_body(answer)["code"] == "invalid_api_key"
    for ids in ([10**20], [-1], [128256]):
        body = json.dumps({"model": MODEL, "prompt": ids, "max_tokens": 2}).encode()
        answer = _exchange(emulator.url, _post("/v1/completions", body))
        assert _status(answer)[1] == 400, (ids, answer[:300])
        assert _json_body(answer)["param"] == "prompt[0]"
