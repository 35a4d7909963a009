"""Degraded modes in the live gateway (issue 20, deliverable 1), against a real gateway
process and emulator: the admin API forces the mode on; an interactive chat call asking
for 500 tokens is served 16 (the emulator never ends a sequence early) with
``x-headway-degraded`` naming the mode and the change, streamed too; an optional call is
shed ``degraded_optional`` with a Retry-After; the metrics count both and the mode's
change; forced off, the same call is served whole with no header."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from headway.drill.observe import Metrics
from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

MODEL = "llama-3-8b"
KEY = "key-acme"
ADMIN = "admin-secret"
HEADER = "x-headway-degraded"


def _call(
    url: str, body: dict[str, Any] | None, token: str = KEY, method: str = "POST",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}",
        **(headers or {})})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return (
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                (response.read()),
            )
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "tell me about queues"}],
            "max_tokens": 500, **extra}  # fmt: skip


LONG = [{"role": "system", "content": "be brief"},
        *({"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "words " * 40}
          for i in range(8)),
        {"role": "user", "content": "so, queues?"}]  # fmt: skip
"""A conversation far over 64 estimated tokens: its oldest turns go."""


def _metrics(url: str) -> Metrics:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return Metrics(resp.read().decode())


def _logged(gateway: GatewayProcess, text: str) -> None:
    """Wait until the gateway's log has a line with ``text``."""
    end = time.monotonic() + 10
    while not any(text in line for line in gateway.output):
        assert time.monotonic() < end, f"no log line with {text!r}: {gateway.output[-5:]}"
        time.sleep(0.02)


def _force(url: str, state: str) -> dict[str, Any]:
    status, _, data = _call(f"{url}/admin/degraded/brief", {"state": state}, ADMIN)
    assert status == 200, data
    return dict(json.loads(data))


def test_a_forced_mode_caps_sheds_optional_says_so_and_counts() -> None:
    config = {
        "tenants": {KEY: {"name": "acme"}},
        "metrics_public": True,
        "admin_token": ADMIN,
        "degraded": {"modes": {"brief": {"bands": ["interactive"], "max_tokens": 16,
                                         "context_tokens": 64, "shed_optional": True}}},
    }  # fmt: skip
    with (
        EmulatorProcess(["--speedup", "50", "--model", MODEL]) as emulator,
        GatewayProcess({"upstreams": [{"url": emulator.url}], **config}) as gateway,
    ):
        url = gateway.url
        chat = f"{url}/v1/chat/completions"
        # Off (the default, no thresholds): served whole, no header.
        status, headers, data = _call(chat, _chat())
        assert status == 200 and HEADER not in headers
        assert json.loads(data)["usage"]["completion_tokens"] == 500
        status, headers, data = _call(chat, _chat(messages=LONG))
        assert status == 200 and HEADER not in headers
        whole_prompt = json.loads(data)["usage"]["prompt_tokens"]

        status, _, data = _call(f"{url}/admin/degraded", None, ADMIN, "GET")
        assert status == 200
        assert json.loads(data)["modes"]["brief"] == {
            "on": False, "forced": "auto", "since_s": None, "served": 0,
            "bands": ["interactive"],
        }  # fmt: skip
        state = _force(url, "on")
        assert state["on"] is True and state["forced"] == "on"
        _logged(gateway, "degraded mode 'brief' turned on (admin: on)")

        status, headers, data = _call(chat, _chat())
        assert status == 200, data
        assert headers[HEADER] == "brief; max_tokens=16 (asked 500)"
        assert json.loads(data)["usage"]["completion_tokens"] == 16
        status, headers, data = _call(chat, _chat(messages=LONG))
        assert status == 200, data
        assert headers[HEADER] == (
            "brief; max_tokens=16 (asked 500); context_tokens=64 (oldest_turns)"
        )
        usage = json.loads(data)["usage"]
        assert usage["completion_tokens"] == 16 and usage["prompt_tokens"] < whole_prompt / 2
        status, headers, data = _call(
            chat, _chat(stream=True, stream_options={"include_usage": True})
        )
        assert status == 200 and headers[HEADER] == "brief; max_tokens=16 (asked 500)"
        events = [line[6:] for line in data.decode().splitlines() if line.startswith("data: {")]
        assert json.loads(events[-1])["usage"]["completion_tokens"] == 16

        status, headers, data = _call(chat, _chat(), headers={"x-headway-optional": "true"})
        assert status == 503, data
        assert json.loads(data)["error"]["code"] == "degraded_optional"
        assert headers["x-headway-shed-reason"] == "degraded_optional"
        assert int(headers["retry-after"]) >= 1
        assert headers[HEADER] == "brief; shed optional"
        # A bad flag names the header, the value and the fix.
        status, _, data = _call(chat, _chat(), headers={"x-headway-speculative": "maybe"})
        assert status == 400
        error = json.loads(data)["error"]
        assert error["param"] == "x-headway-speculative" and "'maybe'" in error["message"]
        # The background band has no mode: untouched while brief is on.
        status, headers, data = _call(chat, _chat(), headers={"x-headway-priority": "background"})
        assert status == 200 and HEADER not in headers
        assert json.loads(data)["usage"]["completion_tokens"] == 500

        metrics = _metrics(url)
        served = metrics.by("headway_gateway_degraded_requests_total", "change")
        assert served == {"max_tokens": 3.0, "context": 1.0, "optional_shed": 1.0}
        assert metrics.total("headway_gateway_degraded_mode_active", mode="brief") == 1
        assert metrics.total("headway_gateway_degraded_mode_changes_total", to="on") == 1
        assert metrics.total("headway_gateway_sheds_total", reason="degraded_optional") == 1
        # A reload keeps the mode's state (forced on).
        status, _, data = _call(f"{url}/admin/reload", {}, ADMIN)
        assert status == 200, data
        status, _, data = _call(f"{url}/admin/degraded", None, ADMIN, "GET")
        assert json.loads(data)["modes"]["brief"]["on"] is True

        # Admin errors: an unknown mode names the declared ones; a bad state the fix.
        status, _, data = _call(f"{url}/admin/degraded/nope", {"state": "on"}, ADMIN)
        assert status == 404 and "brief" in json.loads(data)["error"]["message"]
        status, _, data = _call(f"{url}/admin/degraded/brief", {"state": "yes"}, ADMIN)
        assert status == 400 and json.loads(data)["error"]["param"] == "state"
        status, _, _ = _call(f"{url}/admin/degraded/brief", {"state": "off"}, KEY)
        assert status == 401

        state = _force(url, "off")
        assert state["on"] is False and state["served"] == 4
        _logged(gateway, "degraded mode 'brief' turned off (admin: off)")
        status, headers, data = _call(chat, _chat())
        assert status == 200 and HEADER not in headers
        assert json.loads(data)["usage"]["completion_tokens"] == 500
        status, headers, _ = _call(chat, _chat(), headers={"x-headway-optional": "true"})
        assert status == 200 and HEADER not in headers
        metrics = _metrics(url)
        assert metrics.total("headway_gateway_degraded_mode_active", mode="brief") == 0
        assert metrics.total("headway_gateway_degraded_mode_changes_total", to="off") == 1
