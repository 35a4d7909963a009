"""`headway gateway` end to end: real emulators and the gateway on loopback ports, the
official `openai` client. Pass-through equals direct; refusals carry a reason, a
Retry-After and a ticket that a retry redeems; disconnects free the upstream within
100 ms (queued or in flight, streaming or not); client mistakes are 4xx."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import re
import shutil
import socket
import struct
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess
from openai_clients import openai_client

MODEL = "llama-3-8b"
KEY = "key-acme"
LIGHT = "key-light"
PROMPT = [{"role": "user", "content": "Tell me about queues"}]


def _metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def _value(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape(labels)}(?:{{[^}}]*}})? (\S+)$"
    if labels:
        pattern = rf"^{re.escape(name)}{{[^}}]*{re.escape(labels)}[^}}]*}} (\S+)$"
    found = re.findall(pattern, text, re.MULTILINE)
    return sum(float(v) for v in found)


def _settled(url: str, name: str, labels: str, expected: float) -> float:
    """The metric once it reaches ``expected`` (a handler counts a request as it returns,
    just after its client saw the end): polled for up to 5 s, then returned as it is."""
    deadline = time.monotonic() + 5.0
    while True:
        value = _value(_metrics(url), name, labels)
        if value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def _busy(emulator: str) -> float:
    text = _metrics(emulator)
    return _value(text, "vllm:num_requests_running") + _value(text, "vllm:num_requests_waiting")


def _freed_within(emulator: str, expected: float, limit_s: float = 0.1) -> float | None:
    """Seconds until the emulator holds ``expected`` requests, polling up to ``limit_s``
    (None: not by then)."""
    start = time.monotonic()
    while True:
        now = time.monotonic()
        if _busy(emulator) <= expected:
            return now - start
        if now - start > limit_s:
            return None
        time.sleep(0.002)


class _Raw:
    """A raw HTTP exchange (http.client) whose connection the test closes at will."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        parts = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
        self.resp: http.client.HTTPResponse | None = None

    def send(self, method: str, path: str, body: Any = None, headers: Any = None) -> Any:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        self.conn.request(method, path, body=data, headers={
            "Content-Type": "application/json", **(headers or {})})  # fmt: skip
        self.resp = self.conn.getresponse()
        return self.resp

    def close(self) -> None:
        if self.resp is not None:  # its file on the socket outlives a closed connection
            self.resp.close()
        self.conn.close()


def _call(url: str, path: str, body: Any = None, headers: Any = None,
          method: str = "POST", timeout_s: float = 10.0) -> tuple[int, Any, str]:  # fmt: skip
    """Status, headers and text of one request; TimeoutError when it took too long (the
    connection is closed: a client giving up)."""
    raw = _Raw(url, timeout_s)
    try:
        resp = raw.send(method, path, body, headers)
        return resp.status, resp.headers, resp.read().decode()
    finally:
        raw.close()


def _client(url: str, key: str = KEY, timeout_s: float = 30.0) -> openai.OpenAI:
    return openai_client(url, key, timeout_s)


@pytest.fixture(scope="module")
def fast() -> Iterator[str]:
    with EmulatorProcess(["--speedup", "50"]) as emu:
        yield emu.url


@pytest.fixture(scope="module")
def slow() -> Iterator[str]:
    """Real time: 2000 tokens take seconds, long enough to disconnect in the middle."""
    with EmulatorProcess(["--speedup", "1"]) as emu:
        yield emu.url


def _config(upstream: str, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "upstreams": [{"url": upstream}],
        "tenants": {
            KEY: {"name": "acme", "max_priority": "interactive"},
            LIGHT: {"name": "light", "token_rate_per_s": 100.0, "burst_s": 1.0},
        },
        "admin_token": "admin-secret",
        "metrics_public": True,
    }
    config.update(extra)
    return config


@pytest.fixture(scope="module")
def gateway(fast: str) -> Iterator[str]:
    with GatewayProcess(_config(fast)) as gw:
        yield gw.url


def test_pass_through_equals_direct(fast: str, gateway: str) -> None:
    for api in ("chat", "completions"):
        for stream in (False, True):
            answers = []
            for url, key in ((fast, "unused"), (gateway, KEY)):
                client = _client(url, key)
                if api == "chat":
                    if stream:
                        chunks = client.chat.completions.create(
                            model=MODEL, messages=PROMPT, max_tokens=8, temperature=0,
                            stream=True, stream_options={"include_usage": True},
                        )  # fmt: skip
                        answers.append(
                            [(c.choices[0].delta.content if c.choices else c.usage) for c in chunks]
                        )
                    else:
                        r = client.chat.completions.create(
                            model=MODEL, messages=PROMPT, max_tokens=8, temperature=0
                        )
                        answers.append([r.choices[0].message.content, r.usage])
                elif stream:
                    parts = client.completions.create(
                        model=MODEL, prompt="Once upon", max_tokens=8, temperature=0, stream=True
                    )
                    answers.append([c.choices[0].text for c in parts])
                else:
                    r2 = client.completions.create(
                        model=MODEL, prompt="Once upon", max_tokens=8, temperature=0
                    )
                    answers.append([r2.choices[0].text, r2.usage])
            assert answers[0] == answers[1], (api, stream)
    models = _client(gateway).models.list()
    assert [m.id for m in models.data] == [MODEL]
    # The gateway counts a request when its handler returns, just after the client has read
    # the last byte: poll briefly rather than race it.
    deadline = time.monotonic() + 5.0
    while True:
        text = _metrics(gateway)
        done = _value(text, "headway_gateway_completed_total", 'tenant="acme"')
        if done >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert done >= 4
    assert _value(text, "headway_gateway_upstream_ttft_seconds_count") >= 4


def _read_to_done_and_reset(url: str, key: str) -> None:
    """Stream a chat completion through ``url`` over a raw socket, read up to ``[DONE]``
    and reset the connection at once, before the closing chunk of the stream."""
    parts = urllib.parse.urlsplit(url)
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
         "stream": True}
    ).encode()  # fmt: skip
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(head + body)
        got = b""
        while b"data: [DONE]" not in got:
            data = sock.recv(65536)
            assert data, got
            got += data
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_client_that_leaves_right_after_done_counts_as_completed(fast: str) -> None:
    """It has the whole answer; only the stream's closing chunk may not have reached it."""
    with GatewayProcess(_config(fast)) as gw:
        for _ in range(6):
            _read_to_done_and_reset(gw.url, KEY)
        completed = _settled(gw.url, "headway_gateway_completed_total", 'tenant="acme"', 6)
        text = _metrics(gw.url)
    assert completed == 6
    assert _value(text, "headway_gateway_cancellations_total") == 0


def test_client_mistakes_are_4xx(gateway: str) -> None:
    with pytest.raises(openai.AuthenticationError) as auth:
        _client(gateway, "wrong").chat.completions.create(model=MODEL, messages=PROMPT)
    assert auth.value.status_code == 401
    with pytest.raises(openai.BadRequestError) as bad:
        _client(gateway).chat.completions.create(
            model=MODEL, messages=PROMPT, extra_body={"max_tokens": "many"}
        )
    assert bad.value.status_code == 400
    assert "max_tokens" in str(bad.value) and bad.value.param == "max_tokens"  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as missing:
        _client(gateway).completions.create(model=MODEL, prompt=None)  # type: ignore[call-overload]
    assert "prompt" in str(missing.value)
    auth_header = {"Authorization": f"Bearer {KEY}"}
    status, _, text = _call(gateway, "/v1/chat/completions", b"{not json", auth_header)
    assert status == 400 and json.loads(text)["error"]["type"] == "invalid_request_error"
    status, _, text = _call(
        gateway, "/v1/chat/completions", {"model": MODEL, "messages": PROMPT},
        {**auth_header, "x-headway-priority": "urgent"},
    )  # fmt: skip
    assert status == 400 and "x-headway-priority" in text
    assert _call(gateway, "/admin/drain", {})[0] == 401


def test_tenant_over_budget_is_429_tenant_token_rate(gateway: str) -> None:
    client = _client(gateway, LIGHT)
    client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=60)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=60)
    response = refused.value.response
    assert response.status_code == 429
    assert response.headers["x-headway-shed-reason"] == "tenant_token_rate"
    assert int(response.headers["Retry-After"]) >= 1
    assert "tenant_token_rate" in response.json()["error"]["message"]
    assert "x-headway-retry-ticket" in response.headers


def test_overload_sheds_with_retry_after_and_the_ticket_is_honoured(slow: str) -> None:
    config = _config(
        slow,
        slots_per_upstream=2,
        queues={
            "critical_reserved_slots": 0,
            "interactive": {"max_queued_requests": 2},
            "max_queued_per_tenant": 2,
        },
        admission={"max_retry_after_s": 1.0},
    )
    with GatewayProcess(config) as gw:

        def call(_: int) -> tuple[int, Any]:
            try:
                r = _client(gw.url).chat.completions.with_raw_response.create(
                    model=MODEL, messages=PROMPT, max_tokens=40
                )
                return r.status_code, r.headers
            except openai.APIStatusError as error:
                return error.status_code, error.response.headers

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(call, range(8)))
        statuses = sorted(s for s, _ in results)
        assert statuses.count(200) >= 4, statuses  # 2 running + 2 queued
        sheds = [h for s, h in results if s == 429]
        assert sheds, statuses
        headers = sheds[0]
        assert headers["x-headway-shed-reason"] == "queue_full"
        assert int(headers["Retry-After"]) >= 1
        ticket = headers["x-headway-retry-ticket"]
        # Refill the line, then come back after Retry-After with the ticket.
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            busy = [pool.submit(call, i) for i in range(4)]
            time.sleep(int(headers["x-headway-retry-after-ms"]) / 1000.0)
            retry = _client(gw.url).chat.completions.with_raw_response.create(
                model=MODEL, messages=PROMPT, max_tokens=5,
                extra_headers={"x-headway-retry-ticket": ticket},
            )  # fmt: skip
            assert retry.status_code == 200
            for f in busy:
                f.result()
        assert _settled(gw.url, "headway_gateway_queue_depth_requests", "", 0) == 0
        text = _metrics(gw.url)
        assert _value(text, "headway_gateway_sheds_total", 'reason="queue_full"') >= 1
        assert _value(text, "headway_gateway_retry_after_issued_total") >= 1


def test_disconnects_free_the_upstream_within_100_ms(slow: str) -> None:
    config = _config(slow, slots_per_upstream=2, queues={"critical_reserved_slots": 0})
    long = {"model": MODEL, "messages": PROMPT, "max_tokens": 2000}
    headers = {"Authorization": f"Bearer {KEY}"}
    with GatewayProcess(config) as gw:
        assert _busy(slow) == 0
        # In flight, non-streaming: the client gives up.
        with pytest.raises(TimeoutError):
            _call(gw.url, "/v1/chat/completions", long, headers, timeout_s=0.5)
        assert _freed_within(slow, 0) is not None, "non-streaming in flight"
        # In flight, streaming: read a token, then close.
        raw = _Raw(gw.url)
        resp = raw.send("POST", "/v1/chat/completions", {**long, "stream": True}, headers)
        assert resp.status == 200 and resp.read1(4096)
        assert _busy(slow) == 1
        raw.close()
        assert _freed_within(slow, 0) is not None, "streaming in flight"
        # Queued: both slots busy, a third waits; its client goes away.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            holders = [
                pool.submit(_call, gw.url, "/v1/chat/completions", long, headers, timeout_s=1.5)
                for _ in range(2)
            ]
            time.sleep(0.4)
            for stream in (False, True):
                with pytest.raises(TimeoutError):
                    _call(gw.url, "/v1/chat/completions", {**long, "stream": stream}, headers,
                          timeout_s=0.3)  # fmt: skip
            assert _busy(slow) == 2  # the queued ones never reached it
            for holder in holders:
                with pytest.raises(TimeoutError):
                    holder.result()
        assert _freed_within(slow, 0) is not None, "the holders"
        name = "headway_gateway_cancellations_total"
        assert _settled(gw.url, name, 'stage="queued"', 2) == 2
        assert _settled(gw.url, name, 'stage="in_flight"', 4) == 4
        _, _, body = _call(
            gw.url, "/admin/state", None, {"Authorization": "Bearer admin-secret"}, "GET"
        )
        state = json.loads(body)
        assert all(u["outstanding_requests"] == 0 for u in state["upstreams"])


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_retry_to_another_upstream_drain_and_reload(fast: str) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens: connect refused
    admin = {"Authorization": "Bearer admin-secret"}
    config = _config(fast)
    config["upstreams"] = [{"url": dead}, {"url": fast}]
    with GatewayProcess(config) as gw:
        client = _client(gw.url)
        for _ in range(4):
            r = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=3)
            assert r.choices[0].message.content
        text = _metrics(gw.url)
        assert _value(text, "headway_gateway_upstream_retries_total") >= 1
        assert _value(text, "headway_gateway_upstream_errors_total") >= 1
        assert _value(text, "headway_gateway_retry_budget_left") >= 0
        assert _value(text, "headway_gateway_upstream_retries_total") == 1  # then ejected
        # Drain the live one: only the dead one is left, so requests fail truthfully.
        status, _, body = _call(gw.url, "/admin/drain", {"upstream": fast}, admin)
        assert status == 200 and json.loads(body)["draining"] is True
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=3)
        assert refused.value.status_code == 503
        assert refused.value.response.headers["x-headway-shed-reason"] == "downstream_unhealthy"
        # Reload a config without the dead upstream: the live one is back, nothing dropped.
        config["upstreams"] = [{"url": fast}]
        gw.write_config(config)
        status, _, body = _call(gw.url, "/admin/reload", {}, admin)
        assert status == 200, body
        r = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=3)
        assert r.choices[0].message.content
        _, _, state = _call(gw.url, "/admin/state", None, admin, "GET")
        ready = {u["url"]: u["ready"] for u in json.loads(state)["upstreams"]}
        assert ready == {dead: False, fast: True}
        assert _call(gw.url, "/admin/drain", {"upstream": fast}, {})[0] == 401


def test_pool_probes_gate_routing(fast: str) -> None:
    """With a `pool:` section, an upstream takes traffic only while its fingerprint probes
    pass; a corrupted fingerprint takes it out of rotation (fail closed)."""
    config = _config(fast, pool={"probe_interval_s": 0.2, "probe_deadline_s": 0.2,
                                 "warmup_probes": 1})  # fmt: skip
    config["upstreams"] = [{"url": fast, "model": MODEL, "revision": "r1"}]
    with GatewayProcess(config) as gw:
        deadline = time.monotonic() + 10
        while _call(gw.url, "/health", None, None, "GET")[0] != 200:
            assert time.monotonic() < deadline, "the probes never passed"
            time.sleep(0.05)
        r = _client(gw.url).chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=3)
        assert r.choices[0].message.content
        admin = {"Authorization": "Bearer admin-secret"}
        status, _, body = _call(gw.url, "/admin/reload", {}, admin)  # the same file
        assert status == 200 and json.loads(body)["needs_restart"] == [], body
        assert _call(gw.url, "/health", None, None, "GET")[0] == 200  # kept its state
        text = _metrics(gw.url)
        assert text.count("# TYPE headway_gateway_upstream_ready ") == 1
        try:
            _call(fast, "/admin/faults", {"corrupt_fingerprint": True})
            deadline = time.monotonic() + 10
            while _call(gw.url, "/health", None, None, "GET")[0] != 503:
                assert time.monotonic() < deadline, "the mismatch was not noticed"
                time.sleep(0.05)
            with pytest.raises(openai.APIStatusError) as refused:
                _client(gw.url).chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=3)
            assert refused.value.status_code == 503
            assert refused.value.response.headers["x-headway-shed-reason"] == (
                "downstream_unhealthy"
            )
        finally:
            _call(fast, "/admin/faults", None, None, "DELETE")


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_redis_shared_budgets_are_wired(fast: str, tmp_path: Path) -> None:
    """`--redis URL` puts the tenant budgets in Redis (the budget logic is tested with
    shared.py); over its budget a tenant is refused with tenant_token_rate."""
    port = _free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        config = _config(fast)
        with GatewayProcess(config, args=("--redis", f"redis://127.0.0.1:{port}/0")) as gw:
            client = _client(gw.url, LIGHT)
            deadline = time.monotonic() + 10
            refused = None
            while refused is None and time.monotonic() < deadline:
                try:
                    client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=40)
                except openai.RateLimitError as error:
                    refused = error
            assert refused is not None
            assert refused.response.headers["x-headway-shed-reason"] == "tenant_token_rate"
            text = _metrics(gw.url)
            assert _value(text, "headway_gateway_shared_budgets_healthy") == 1
            assert _value(text, "headway_gateway_shared_budgets_round_trips") >= 1
    finally:
        redis.terminate()
        redis.wait(10)
