"""Deadlines that reach the engine (issue 18): a request whose x-headway-deadline-ms
passes while an engine serves it is cancelled there at its deadline (the upstream call
closed, the emulator's sequence aborted and its blocks freed), answered 504
``deadline_exceeded`` (a stream gets a last error event); the remaining budget travels
upstream in x-headway-budget-ms, which the emulator honours by itself. Before, a request
with a 500 ms deadline ran 2.16 s in the engine."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

MODEL = "llama-3-8b"
KEY = "key-acme"
BODY = {"model": MODEL, "prompt": "tell me about queues", "max_tokens": 400, "ignore_eos": True}


def _post(url: str, headers: dict[str, str], body: dict[str, Any] = BODY) -> tuple[int, Any, float]:
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}", **headers},
    )  # fmt: skip
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read()), time.monotonic() - start
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null"), time.monotonic() - start


def _stream(url: str, deadline_ms: str) -> tuple[int, list[str], float]:
    """A streamed completion with ``deadline_ms``: its status, its SSE data events (to the
    end of the stream) and the seconds it took."""
    conn = http.client.HTTPConnection(url.split("//")[1], timeout=30)
    conn.request(
        "POST", "/v1/completions", json.dumps({**BODY, "stream": True}).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}",
         "x-headway-deadline-ms": deadline_ms},
    )  # fmt: skip
    start = time.monotonic()
    try:
        resp = conn.getresponse()
        text = resp.read().decode()
        took_s = time.monotonic() - start
    finally:
        conn.close()
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    return resp.status, events, took_s


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def _until(check: Any, within_s: float) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < within_s, "the condition never held"
        time.sleep(0.005)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def stack() -> Any:
    # One stream at ~25 ms a token: 400 tokens take ~10 s, far past a 500 ms deadline.
    with EmulatorProcess(["--speedup", "1", "--model", MODEL]) as emulator:
        config = {
            "upstreams": [{"url": emulator.url, "model": MODEL}],
            "tenants": {KEY: {"name": "acme"}},
            "metrics_public": True,
            # Admission would refuse it at arrival (its service alone outlasts the
            # deadline); this is about the deadline a call overruns in flight.
            "admission": {"check_deadlines": False},
        }
        with GatewayProcess(config) as gateway:
            yield emulator, gateway


def test_a_whole_answer_past_its_deadline_is_cancelled_in_the_engine(stack: Any) -> None:
    emulator, gateway = stack
    status, body, took_s = _post(gateway.url, {"x-headway-deadline-ms": "500"})
    assert status == 504 and body["error"]["code"] == "deadline_exceeded", body
    assert 0.5 <= took_s <= 0.5 + 0.05 + 0.05, took_s  # ±50 ms, plus the local round trip
    _until(lambda: _metric(emulator.url, "vllm:num_requests_running") == 0, 5.0)
    assert _metric(emulator.url, "vllm:kv_cache_usage_perc") == 0.0  # its blocks freed
    assert _metric(gateway.url, "headway_gateway_deadline_cancels_total") >= 1


def test_a_stream_past_its_deadline_ends_with_an_error_event(stack: Any) -> None:
    emulator, gateway = stack
    status, events, took_s = _stream(gateway.url, "800")
    assert status == 200
    assert len(events) > 2 and "[DONE]" not in events  # tokens, then the cut
    assert json.loads(events[-1])["error"]["code"] == "deadline_exceeded"
    assert took_s <= 0.8 + 0.1, took_s
    _until(lambda: _metric(emulator.url, "vllm:num_requests_running") == 0, 5.0)


def test_the_budget_travels_upstream_and_the_emulator_honours_it(stack: Any) -> None:
    emulator, _ = stack
    before = _metric(emulator.url, "headway_emulator_deadline_aborts_total")
    status, body, took_s = _post(emulator.url, {"x-headway-budget-ms": "300"})
    assert status == 504 and body["error"]["code"] == "deadline_exceeded"
    assert 0.3 <= took_s <= 0.4, took_s
    assert _metric(emulator.url, "headway_emulator_deadline_aborts_total") == before + 1
    status, body, _ = _post(emulator.url, {"x-headway-budget-ms": "soon"})
    assert status == 400 and body["error"]["param"] == "x-headway-budget-ms", body


def test_a_deadline_that_leaves_time_changes_nothing(stack: Any) -> None:
    _, gateway = stack
    status, body, _ = _post(
        gateway.url, {"x-headway-deadline-ms": "30000"}, {**BODY, "max_tokens": 8}
    )
    assert status == 200 and body["usage"]["completion_tokens"] == 8


def test_a_failed_request_is_counted_and_the_gateways_counts_balance(stack: Any) -> None:
    """The lifecycle's one balance on the gateway's own /metrics (issue 18): offered =
    completed + sheds + cancellations + deadline cancels + failed, nothing in flight.
    The engine dying under an admitted call (the last use of this module's engine) makes
    it fail, 502, which the gateway now counts. Self-contained (under xdist the module's
    other tests may run on another worker, with their own stack): one call completes,
    one is cut at its deadline, one fails."""
    emulator, gateway = stack
    status, _, _ = _post(gateway.url, {}, {**BODY, "max_tokens": 4})
    assert status == 200
    status, _, _ = _post(gateway.url, {"x-headway-deadline-ms": "300"})
    assert status == 504
    fault = urllib.request.Request(
        f"{emulator.url}/admin/faults", json.dumps({"crash_after_s": 0.3}).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(fault, timeout=10) as resp:
        assert resp.status == 200
    status, body, _ = _post(gateway.url, {})
    assert status == 502, body

    def value(name: str) -> float:
        return _metric(gateway.url, name)

    assert value("headway_gateway_requests_failed_total") == 1
    offered = value("headway_gateway_requests_offered_total")
    ended = (
        value("headway_gateway_completed_total")
        + value("headway_gateway_sheds_total")
        + value("headway_gateway_cancellations_total")
        + value("headway_gateway_deadline_cancels_total")
        + value("headway_gateway_requests_failed_total")
    )
    assert offered == ended >= 3, (offered, ended)
    assert value("headway_gateway_completed_total") >= 1
    assert value("headway_gateway_deadline_cancels_total") >= 1


def test_an_engine_that_stops_first_is_counted_as_a_deadline_cancel() -> None:
    """An engine that honours less of the budget than the gateway's deadline (here half:
    the emulator's ``budget_fraction`` fault; on a loaded host, the budget's rounding
    down alone) stops the request itself and answers ``deadline_exceeded``. The gateway
    relays that answer and counts it as the deadline cancel it is, never as completed
    (a stream without [DONE]) or failed (a 504): before, the soak drill's
    clients-vs-counters check was 2 off on a loaded host."""
    with (
        EmulatorProcess(
            ["--speedup", "1", "--model", MODEL, "--fault", "budget_fraction=0.5"]
        ) as emulator,
        GatewayProcess(
            {
                "upstreams": [{"url": emulator.url, "model": MODEL}],
                "tenants": {KEY: {"name": "acme"}},
                "metrics_public": True,
                "admission": {"check_deadlines": False},
            }
        ) as gateway,
    ):
        status, body, took_s = _post(gateway.url, {"x-headway-deadline-ms": "2000"})
        assert status == 504 and body["error"]["code"] == "deadline_exceeded", body
        assert took_s < 1.5, took_s  # the engine's stop at ~1 s, not the gateway's at 2 s
        _, events, _ = _stream(gateway.url, "2000")
        assert "[DONE]" not in events
        assert json.loads(events[-1])["error"]["code"] == "deadline_exceeded"

        def value(name: str) -> float:
            return _metric(gateway.url, name)

        assert value("headway_gateway_deadline_cancels_total") == 2
        assert value("headway_gateway_completed_total") == 0
        assert value("headway_gateway_requests_failed_total") == 0
        assert value("headway_gateway_requests_offered_total") == 2
