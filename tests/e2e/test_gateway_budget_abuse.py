"""A tenant never gets past its token budget through the gateway, whatever it does:
retry tickets reused or presented by larger retries, disconnects while queued, while the
engine prefills and mid-stream, an engine that dies mid-stream, requests larger than the
whole bucket; with local budgets and with budgets shared through a real `redis-server`.
Real emulators and gateways on loopback ports; tokens served are the emulator's own
counts (``vllm:prompt_tokens_total`` + ``vllm:generation_tokens_total``)."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import re
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from binaries import RedisServer
from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

MODEL = "llama-3-8b"
FREE = "key-free"  # a tenant without a budget
METER = "key-meter"  # the budgeted tenant under test


METRICS_TOKEN = "budget-abuse-metrics"


def _meter_queued(gateway: str) -> float:
    """Requests of tenant meter waiting in the gateway's queues."""
    request = urllib.request.Request(
        f"{gateway}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    found = re.findall(
        r'^headway_gateway_tenant_queue_depth_requests\{[^}]*tenant="meter"[^}]*\} (\S+)$',
        text,
        re.MULTILINE,
    )
    return sum(float(v) for v in found)


def _body(prompt_tokens: int, max_tokens: int, *, stream: bool) -> dict[str, Any]:
    """A chat request of about ``prompt_tokens`` (4 bytes each, as the emulator and the
    gateway's default estimate count)."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "q" * (4 * prompt_tokens)}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _cost(body: dict[str, Any]) -> int:
    """What the gateway charges at admission: the body's bytes / 4, plus max_tokens."""
    return math.ceil(len(json.dumps(body).encode()) / 4.0) + int(body["max_tokens"])


class _Exchange:
    """One request on its own connection, which the test closes when it likes."""

    def __init__(self, url: str, key: str, body: dict[str, Any], timeout_s: float = 10.0):
        parts = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
        self.conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json",
                                   "Authorization": f"Bearer {key}"})  # fmt: skip
        self.resp: http.client.HTTPResponse | None = None

    def response(self) -> http.client.HTTPResponse:
        self.resp = self.conn.getresponse()
        return self.resp

    def close(self) -> None:
        # The response holds its own file on the socket: a connection that will close
        # hands it over, and closing only the connection leaves the socket open.
        if self.resp is not None:
            self.resp.close()
        self.conn.close()


def _status(url: str, key: str, body: dict[str, Any], **headers: str) -> tuple[int, Any, str]:
    """Status, headers and text of a request that is read to its end."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json",
                              "Authorization": f"Bearer {key}", **headers})  # fmt: skip
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read().decode()
    finally:
        conn.close()


def _assert_over_budget(gateway: str, body: dict[str, Any]) -> None:
    """The metered tenant's ``body`` is refused for its token budget (it is still charged
    for what came before)."""
    status, headers, text = _status(gateway, METER, body)
    assert status == 429, text
    assert headers["x-headway-shed-reason"] == "tenant_token_rate"


def _first_token_then_hang_up(url: str, body: dict[str, Any]) -> int:
    """Stream ``body``, read the first event, close: the status (429 when refused)."""
    exchange = _Exchange(url, METER, body)
    try:
        resp = exchange.response()
        if resp.status == 200:
            assert resp.read1(4096)
        else:
            resp.read()
        return resp.status
    finally:
        exchange.close()


def _read_events(exchange: _Exchange, events: int) -> None:
    """Read the answer until ``events`` SSE events came (TimeoutError when they do not)."""
    resp = exchange.response()
    assert resp.status == 200
    seen = 0
    while seen < events:
        chunk = resp.read1(4096)
        assert chunk, "the stream ended"
        seen += chunk.count(b"data:")


def _rest_of(resp: http.client.HTTPResponse) -> bytes:
    """What is left of a streamed answer, until it ends or its connection breaks."""
    data = b""
    try:
        while chunk := resp.read1(4096):
            data += chunk
    except (http.client.IncompleteRead, OSError):
        pass
    return data


def _config(upstream: str, rate: float, burst_s: float, **extra: Any) -> dict[str, Any]:
    return {
        "upstreams": [{"url": upstream}],
        "tenants": {
            FREE: {"name": "free"},
            METER: {"name": "meter", "token_rate_per_s": rate, "burst_s": burst_s},
        },
        "queues": {"critical_reserved_slots": 0},
        **extra,
    }


@pytest.fixture(scope="module")
def slow() -> Iterator[EmulatorProcess]:
    """Real time: a stream of hundreds of tokens lasts seconds."""
    with EmulatorProcess(["--speedup", "1"]) as emu:
        yield emu


def _abuse_by_disconnects(
    gateway: str, emulator: EmulatorProcess, rate: float, burst: float
) -> float:
    """Stream 1,000-token prompts, hang up after the first token, for 4 s: tokens served
    over the budget of the window (``burst + rate × elapsed``)."""
    body = _body(1000, 400, stream=True)
    assert _cost(body) <= burst
    before = emulator.tokens_served()
    start = time.monotonic()
    statuses = []
    while time.monotonic() - start < 4.0:
        statuses.append(_first_token_then_hang_up(gateway, body))
        if statuses[-1] != 200:
            time.sleep(0.05)
    elapsed = time.monotonic() - start
    time.sleep(0.3)  # the engine's counters settle once its last stream was aborted
    served = emulator.tokens_served() - before
    assert statuses.count(200) >= 2 and 429 in statuses, statuses
    return served / (burst + rate * elapsed)


def test_hanging_up_after_the_first_token_does_not_refund_the_served_prompt(
    slow: EmulatorProcess,
) -> None:
    # Issue 15: 42,000 prompt tokens served in 15 s against a 7,000-token budget.
    rate, burst_s = 200.0, 10.0
    with GatewayProcess(_config(slow.url, rate, burst_s)) as gw:
        ratio = _abuse_by_disconnects(gw.url, slow, rate, rate * burst_s)
    assert ratio <= 1.05, f"served {ratio:.2f}x the budget"


def test_shared_budgets_charge_disconnects_the_same(slow: EmulatorProcess) -> None:
    rate, burst_s = 200.0, 10.0
    with RedisServer() as redis:
        config = _config(slow.url, rate, burst_s, shared={"sync_interval_s": 0.2})
        with GatewayProcess(config, args=("--redis", redis.url)) as gw:
            ratio = _abuse_by_disconnects(gw.url, slow, rate, rate * burst_s)
    assert ratio <= 1.05, f"served {ratio:.2f}x the budget"


def test_a_disconnect_while_queued_costs_nothing(slow: EmulatorProcess) -> None:
    # One slot, held by another tenant: meter's request waits, and its client leaves.
    rate, burst_s = 1.0, 4000.0  # a 4,000-token bucket that barely refills
    config = _config(slow.url, rate, burst_s, slots_per_upstream=1, metrics_token=METRICS_TOKEN)
    with GatewayProcess(config) as gw:
        holder = _Exchange(gw.url, FREE, _body(10, 2000, stream=True))
        try:
            assert holder.response().status == 200
            queued = _body(2000, 1000, stream=True)
            waiting = _Exchange(gw.url, METER, queued, timeout_s=0.5)
            with pytest.raises(TimeoutError):
                waiting.response()
            waiting.close()
            # It leaves the line while the slot is still held (not dispatched after).
            deadline = time.monotonic() + 5.0
            while _meter_queued(gw.url) > 0:
                assert time.monotonic() < deadline, "the queued request never left its line"
                time.sleep(0.01)
        finally:
            holder.close()
        # Its whole cost came back: a request of 3,500 tokens passes.
        probe = _body(10, 3500 - _cost(_body(10, 0, stream=True)), stream=True)
        assert _first_token_then_hang_up(gw.url, probe) == 200


def test_a_non_streamed_request_left_in_flight_pays_the_output_it_may_have_had(
    slow: EmulatorProcess,
) -> None:
    # Nothing of an unstreamed answer is seen until it is whole: the gateway charges the
    # output its TPOT allows in the time an engine had it. At a TPOT of 1 µs that is all
    # of max_tokens within the half second the client waits.
    rate, burst_s = 1.0, 4000.0
    with GatewayProcess(_config(slow.url, rate, burst_s, tpot_s=1e-6)) as gw:
        sent = _Exchange(gw.url, METER, _body(10, 3000, stream=False), timeout_s=0.5)
        with pytest.raises(TimeoutError):
            sent.response()
        sent.close()
        time.sleep(0.2)  # the gateway sees the hang-up
        _assert_over_budget(gw.url, _body(10, 2000, stream=True))


def test_a_disconnect_while_the_engine_prefills_costs_the_prompt() -> None:
    # The engine is stalled: it holds the request and produces nothing.
    rate, burst_s = 1.0, 4000.0
    stalled = EmulatorProcess(["--speedup", "1", "--fault", "stall=true"])
    with stalled as emu, GatewayProcess(_config(emu.url, rate, burst_s)) as gw:
        sent = _Exchange(gw.url, METER, _body(2000, 1000, stream=True), timeout_s=0.5)
        with pytest.raises(TimeoutError):
            _read_events(sent, 2)  # no token comes (a role-only event at most)
        sent.close()
        time.sleep(0.2)  # the gateway sees the hang-up
        # ~2,000 prompt tokens stay charged: 3,000 more do not fit the 4,000 bucket.
        _assert_over_budget(gw.url, _body(10, 2980, stream=True))


def test_an_engine_dying_mid_stream_charges_what_it_served() -> None:
    rate, burst_s = 1.0, 4000.0
    engine = EmulatorProcess(["--speedup", "1"])
    with engine as emu, GatewayProcess(_config(emu.url, rate, burst_s)) as gw:
        stream = _Exchange(gw.url, METER, _body(2000, 1000, stream=True))
        try:
            resp = stream.response()
            assert resp.status == 200 and resp.read1(4096)
            emu.proc.kill()  # the engine dies mid-stream
            emu.proc.wait(timeout=10)
            assert b"[DONE]" not in _rest_of(resp)
        finally:
            stream.close()
        time.sleep(0.2)
        # The prompt it prefilled stays charged: 3,000 more tokens do not fit.
        _assert_over_budget(gw.url, _body(10, 2980, stream=True))


@contextlib.contextmanager
def _first_ticket(engine: str) -> Iterator[tuple[GatewayProcess, dict[str, Any], Any]]:
    """A gateway whose metered tenant has a 1,000-token bucket, one 610-token stream of it
    held open (charged while it streams), and a second such request refused for the
    budget with the turn the bucket can promise: the gateway, that request's body and
    the refusal's headers."""
    rate, burst_s = 500.0, 2.0  # a 1,000-token bucket
    with GatewayProcess(_config(engine, rate, burst_s)) as gw:
        small = _body(10, 600, stream=True)
        held = _Exchange(gw.url, METER, small)
        try:
            assert held.response().status == 200
            status, headers, _ = _status(gw.url, METER, small)
            assert status == 429 and headers["x-headway-shed-reason"] == "tenant_token_rate"
            assert "x-headway-retry-ticket" in headers and "Retry-After" in headers
            yield gw, small, headers
        finally:
            held.close()


def test_a_ticket_does_not_admit_a_larger_retry(slow: EmulatorProcess) -> None:
    with _first_ticket(slow.url) as (gw, _, headers):
        ticket = headers["x-headway-retry-ticket"]
        time.sleep(int(headers["x-headway-retry-after-ms"]) / 1000.0)
        # The retry grew to the whole bucket: judged afresh, it does not fit yet.
        bigger = _body(10, 995 - _cost(_body(10, 0, stream=True)), stream=True)
        assert _cost(bigger) <= 1000
        status, headers, _ = _status(gw.url, METER, bigger, **{"x-headway-retry-ticket": ticket})
        assert status == 429 and headers["x-headway-shed-reason"] == "tenant_token_rate"
        # Nor is the dropped ticket good for another try.
        status, _, _ = _status(gw.url, METER, bigger, **{"x-headway-retry-ticket": ticket})
        assert status == 429


def test_a_refusal_past_the_promisable_turns_names_no_time(slow: EmulatorProcess) -> None:
    # A tenant refused faster than its bucket refills: the first refusal gets the turn
    # the bucket can promise (a ticket and its Retry-After); the next finds every turn
    # promised and names none (a Retry-After would be a guess that the ticket's retry
    # and later fresh requests spend first): 429, no Retry-After, no ticket, never 400.
    with _first_ticket(slow.url) as (gw, small, _):
        status, headers, text = _status(gw.url, METER, small)
        assert status == 429, text
        assert headers["x-headway-shed-reason"] == "tenant_token_rate"
        assert "Retry-After" not in headers and "x-headway-retry-after-ms" not in headers
        assert "x-headway-retry-ticket" not in headers
        assert "back off" in json.loads(text)["error"]["message"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("shared", [False, True], ids=["local", "redis"])
def test_a_request_larger_than_the_whole_budget_is_a_400(shared: bool) -> None:
    # No engine is needed: nothing reaches one.
    rate, burst_s = 100.0, 10.0  # a 1,000-token bucket
    config = _config(f"http://127.0.0.1:{_free_port()}", rate, burst_s)
    with RedisServer() as redis:
        args = ("--redis", redis.url) if shared else ()
        with GatewayProcess(config, args=args) as gw:
            for max_tokens in (5000, 1_000_000_000):
                status, headers, text = _status(gw.url, METER, _body(10, max_tokens, stream=False))
                assert status == 400, text
                assert "Retry-After" not in headers and "x-headway-retry-ticket" not in headers
                error = json.loads(text)["error"]
                if max_tokens == 5000 or shared:  # else the KV check refuses it first
                    assert error["code"] == "tenant_token_rate"
                    assert f"max_tokens={max_tokens}" in error["message"]
                    assert "1000 tokens" in error["message"]
                    assert "lower max_tokens" in error["message"]
