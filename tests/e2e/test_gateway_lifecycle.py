"""The gateway process's lifecycle: SIGTERM drains (health 503, new calls refused
``draining``, in-flight calls finish, exit 0), and every answer carries its request id
(the client's, or one the gateway gives)."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

MODEL = "llama-3-8b"


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_sigterm_drains_in_flight_then_exits_zero() -> None:
    with EmulatorProcess(["--speedup", "1"]) as engine:
        config = {"upstreams": [{"url": engine.url}], "shutdown_timeout_s": 20}
        gateway = GatewayProcess(config)
        url = gateway.start()
        try:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 150}  # fmt: skip
            answers: list[Any] = []
            long_call = threading.Thread(
                target=lambda: answers.append(_post(f"{url}/v1/chat/completions", body))
            )
            long_call.start()
            time.sleep(0.3)  # it is in flight (150 tokens take over a second)
            assert gateway.proc is not None
            gateway.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            while _health(url) != 503:
                assert time.monotonic() < deadline, "health never said draining"
                time.sleep(0.02)
            status, headers, data = _post(f"{url}/v1/chat/completions", {**body, "max_tokens": 2})
            assert status == 503 and headers["x-headway-shed-reason"] == "draining"
            assert headers["Retry-After"] == "0"
            long_call.join(30)
            status, _, data = answers[0]
            assert status == 200, data
            assert json.loads(data)["usage"]["completion_tokens"] == 150
            assert gateway.proc.wait(10) == 0
        finally:
            gateway.stop()


def test_answers_carry_the_request_id() -> None:
    with (
        EmulatorProcess(["--speedup", "50"]) as engine,
        GatewayProcess({"upstreams": [{"url": engine.url}]}) as gateway,
    ):
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        status, headers, _ = _post(
            f"{gateway.url}/v1/completions", body, {"x-request-id": "abc-123"}
        )
        assert status == 200 and headers["x-request-id"] == "abc-123"
        status, headers, _ = _post(f"{gateway.url}/v1/completions", body)
        assert status == 200 and headers["x-request-id"]
        assert headers["x-request-id"] != "abc-123"
        too_long = "y" * 500  # not echoed: the gateway gives its own id
        status, headers, _ = _post(
            f"{gateway.url}/v1/completions", body, {"x-request-id": too_long}
        )
        assert headers["x-request-id"] != too_long
        status, headers, _ = _post(
            f"{gateway.url}/v1/completions", {"prompt": "x"}, {"x-request-id": "bad-1"}
        )
        assert status == 400 and headers["x-request-id"] == "bad-1"


def test_fallback_routes_only_where_the_data_policy_allows_and_revision_pins() -> None:
    """A route whose upstreams are all out of rotation hands its calls to its fallback only
    when the core policy allows it (same data policy and quality class): the answer says
    which route served it. A route whose fallback handles data differently fails
    truthfully (503 naming why). A revision pin reaches only matching upstreams."""
    with (
        EmulatorProcess(["--speedup", "50", "--served-model-name", "big"]) as big,
        EmulatorProcess(["--speedup", "50", "--served-model-name", "small",
                         "--revision", "r2"]) as small,
        EmulatorProcess(["--speedup", "50", "--served-model-name", "external"]) as external,
    ):  # fmt: skip
        dead = "http://127.0.0.1:9"
        config = {
            "upstreams": [
                {"url": big.url, "route": "big", "revision": "r1"},
                {"url": small.url, "route": "small", "revision": "r2"},
                {"url": external.url, "route": "external", "revision": "r1"},
                {"url": dead, "route": "secret"},
            ],
            "routes": {
                "big": {"fallback": "small", "data_policy": "internal", "quality_class": "q"},
                "small": {"data_policy": "internal", "quality_class": "q"},
                "secret": {"fallback": "external", "data_policy": "restricted"},
                "external": {"data_policy": "public"},
            },
            "admin_token": "adm",
            "metrics_public": True,
        }
        with GatewayProcess(config) as gateway:
            chat = f"{gateway.url}/v1/chat/completions"
            admin = {"Authorization": "Bearer adm"}

            def ask(model: str, **headers: str) -> Any:
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 2}  # fmt: skip
                return _post(chat, body, headers)

            status, headers, data = ask("big")
            assert status == 200 and json.loads(data)["model"] == "big"
            assert "x-headway-route" not in headers
            for url in (big.url, dead):
                drained = _post(f"{gateway.url}/admin/drain", {"upstream": url}, admin)
                assert drained[0] == 200, drained
            status, headers, data = ask("big")
            assert status == 200, data
            assert headers["x-headway-route"] == "small"
            assert json.loads(data)["model"] == "small"
            status, headers, data = ask("secret")
            assert status == 503 and headers["x-headway-shed-reason"] == "downstream_unhealthy"
            message = json.loads(data)["error"]["message"]
            assert "no fallback" in message and "'restricted'" in message, message
            # Revision pins: an unknown revision is a client mistake naming the header.
            status, _, data = ask("small", **{"x-headway-revision": "r9"})
            assert status == 400 and "x-headway-revision" in json.loads(data)["error"]["message"]
            status, _, data = ask("small", **{"x-headway-revision": "r2"})
            assert status == 200, data
            with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=5) as response:
                text = response.read().decode()
            assert 'headway_gateway_fallbacks_total{fallback="small",route="big"} 1.0' in text


def test_measured_tpot_refuses_the_surely_late_at_arrival() -> None:
    """No ``tpot_s`` in the config: after 20 streamed answers the gateway knows the engine's
    time per output token and refuses at arrival a call whose output alone cannot meet its
    deadline (400 deadline_unmeetable: no wait can fix it), while a feasible one is served."""
    with (
        EmulatorProcess(["--speedup", "5"]) as engine,
        GatewayProcess({"upstreams": [{"url": engine.url}], "metrics_public": True}) as gateway,
    ):
        chat = f"{gateway.url}/v1/chat/completions"
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 30, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        for _ in range(20):
            status, _, data = _post(chat, body)
            assert status == 200 and data.endswith(b"data: [DONE]\n\n"), data[-200:]
        with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=5) as response:
            metrics = response.read().decode()
        line = next(x for x in metrics.splitlines() if x.startswith("headway_gateway_tpot_seconds"))
        tpot = float(line.split()[-1])
        assert 0 < tpot < 0.05, tpot
        late = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4000}  # fmt: skip
        # Half of what decoding alone takes for the planned output: min(max_tokens, the
        # config's p95_output_tokens, 512).
        budget_ms = max(int(512 * tpot * 1000 / 2), 1)
        status, headers, data = _post(chat, late, {"x-headway-deadline-ms": str(budget_ms)})
        assert status == 400, data
        assert headers["x-headway-shed-reason"] == "deadline_unmeetable"
        assert "Retry-After" not in headers
        assert "raise x-headway-deadline-ms" in json.loads(data)["error"]["message"]
        status, _, data = _post(chat, {**late, "max_tokens": 5}, {"x-headway-deadline-ms": "5000"})
        assert status == 200, data
