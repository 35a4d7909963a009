"""Tenant isolation through `headway gateway` end to end (real gateway and emulator
processes on loopback ports).

* The tenant is the API key and nothing else: no header or body field changes it; one
  tenant spending its token budget leaves another's admitted, and its refusals never name
  the other tenant or its numbers.
* ``/metrics`` is private by default (403 without a token configured), refuses tenant keys
  (403) and, with ``metrics_token`` or ``admin_token``, anything but those
  (401); ``/admin/*`` takes the admin token only (401 otherwise, 403 when unset).
* Each tenant's relayed bodies carry its own ``cache_salt``: tenant B sending tenant A's
  exact prompt gets no prefix-cache hit on the engine, while A's own repeat does.
* No prompt text reaches the access log or the gateway's own log on error and refusal
  paths (the served paths are covered by ``test_gateway_ops_logs.py``).
"""

from __future__ import annotations

import json
import re
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fuzz_http import Client
from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

MODEL = "llama-3-8b"
KEY_A = "key-acme-7f3a"
KEY_B = "key-globex-91c2"
ADMIN = "admin-3b8e"
METRICS = "metrics-5d1c"
B_RATE = 98_765.0
TENANTS = {
    KEY_A: {"name": "acme", "token_rate_per_s": 40.0, "burst_s": 2.0},
    KEY_B: {"name": "globex", "token_rate_per_s": B_RATE, "burst_s": 3.0, "weight": 3.0},
}
ADMIN_ROUTES = [("GET", "/admin/state"), ("POST", "/admin/drain"), ("POST", "/admin/reload")]


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with EmulatorProcess(["--speedup", "50", "--prefix-caching"]) as emu:
        yield emu.url


def _gateway(emulator: str, **extra: Any) -> GatewayProcess:
    config: dict[str, Any] = {"upstreams": [{"url": emulator}], "tenants": TENANTS}
    config.update(extra)
    return GatewayProcess(config)


def _call(
    url: str,
    method: str,
    path: str,
    key: str | None = None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, bytes]:
    client = Client(url)
    try:
        auth = {"Authorization": f"Bearer {key}"} if key is not None else {}
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        more = {"Content-Type": "application/json"} if data is not None else {}
        return client.request(method, path, data, {**more, **auth, **(headers or {})})
    finally:
        client.close()


def _metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:{{(.*)}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


def _metrics(url: str, key: str | None = None) -> str:
    status, _, data = _call(url, "GET", "/metrics", key)
    assert status == 200, data[:300]
    return data.decode()


def _chat(text: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        **extra,
    }


# --- the tenant is the key -------------------------------------------------------------------


def test_tenant_comes_from_the_key_only(emulator: str) -> None:
    with _gateway(emulator, metrics_public=True) as gw:
        spoof = {
            "x-headway-tenant": "globex",
            "x-tenant": "globex",
            "OpenAI-Organization": "globex",
        }
        body = _chat("hello", user="globex", tenant="globex", metadata={"tenant": "globex"})
        status, _, data = _call(gw.url, "POST", "/v1/chat/completions", KEY_A, body, spoof)
        assert status == 200, data[:300]
        text = _metrics(gw.url)
        assert _metric(text, "headway_gateway_requests_offered_total", tenant="acme") == 1
        assert _metric(text, "headway_gateway_requests_offered_total", tenant="globex") == 0
        # Without a key, spoofed headers get nothing.
        status, _, data = _call(gw.url, "POST", "/v1/chat/completions", None, body, spoof)
        assert status == 401, data[:300]
        status, _, data = _call(gw.url, "POST", "/v1/chat/completions", "globex", body, spoof)
        assert status == 401, data[:300]


def test_one_tenant_spending_its_budget_leaves_the_other_admitted(emulator: str) -> None:
    with _gateway(emulator) as gw:
        refusals: list[tuple[Any, bytes]] = []
        for _ in range(6):  # 80 tokens of burst; each request plans ~40
            status, headers, data = _call(
                gw.url, "POST", "/v1/chat/completions", KEY_A, _chat("spend", max_tokens=30)
            )
            if status == 429:
                refusals.append((headers, data))
            else:
                assert status == 200, data[:300]
        assert refusals, "tenant A was never refused"
        for headers, data in refusals:
            error = json.loads(data)["error"]
            assert error["code"] == "tenant_token_rate", error
            assert headers["x-headway-shed-reason"] == "tenant_token_rate"
            seen = (data.decode() + json.dumps(dict(headers.items()))).lower()
            for secret in ("globex", KEY_B, "98765", "98,765", "296295"):  # B, its rate, burst
                assert secret.lower() not in seen, (secret, seen)
        for _ in range(5):  # B is untouched by A's spending
            status, _, data = _call(gw.url, "POST", "/v1/chat/completions", KEY_B, _chat("b"))
            assert status == 200, data[:300]


# --- metrics and admin -----------------------------------------------------------------------


def test_metrics_are_private_by_default_and_refuse_tenant_keys(emulator: str) -> None:
    with _gateway(emulator) as gw:  # no token: private (it named every tenant to anyone)
        for key in (KEY_A, None, "someone-else"):
            status, _, data = _call(gw.url, "GET", "/metrics", key)
            assert status == 403 and b"headway_" not in data, (key, data[:300])
        assert "metrics_public" in json.loads(data)["error"]["message"]
    with _gateway(emulator, admin_token=ADMIN) as gw:
        for key in (None, "someone-else"):
            assert _call(gw.url, "GET", "/metrics", key)[0] == 401
        assert "headway_gateway_requests_offered_total" in _metrics(gw.url, ADMIN)
    with _gateway(emulator, admin_token=ADMIN, metrics_public=True) as gw:
        assert _call(gw.url, "GET", "/metrics")[0] == 200  # opted in: open, as vLLM's
        for key in (KEY_A, KEY_B):
            status, _, data = _call(gw.url, "GET", "/metrics", key)
            assert status == 403, data[:300]
            error = json.loads(data)["error"]
            assert set(error) == {"message", "type", "param", "code"} and b"headway_" not in data
        assert _call(gw.url, "GET", "/metrics", "someone-else")[0] == 200


def test_metrics_token_guards_metrics(emulator: str) -> None:
    with _gateway(emulator, metrics_token=METRICS) as gw:
        for key in (None, "wrong", f"{METRICS}x"):
            status, _, data = _call(gw.url, "GET", "/metrics", key)
            assert status == 401 and b"headway_" not in data, (key, data[:300])
        for key in (KEY_A, KEY_B):
            assert _call(gw.url, "GET", "/metrics", key)[0] == 403
        assert "headway_gateway_requests_offered_total" in _metrics(gw.url, METRICS)


def test_tokens_may_not_be_tenant_keys(emulator: str) -> None:
    for field in ("admin_token", "metrics_token"):
        gw = _gateway(emulator, **{field: KEY_A})
        with pytest.raises(RuntimeError, match=field):
            gw.start()
    # An empty key would be the tenant of every request without one.
    for key in ("", " ", f" {KEY_A}"):
        gw = _gateway(emulator, tenants={key: {"name": "nobody"}})
        with pytest.raises(RuntimeError, match="tenants"):
            gw.start()


def test_admin_routes_take_the_admin_token_only(emulator: str) -> None:
    with _gateway(emulator, admin_token=ADMIN) as gw:
        for method, path in ADMIN_ROUTES:
            for key in (None, KEY_A, KEY_B, "wrong", f"{ADMIN}x", ADMIN[:-1]):
                status, _, data = _call(gw.url, method, path, key, {} if method == "POST" else None)
                assert status == 401, (method, path, key, data[:300])
                assert set(json.loads(data)["error"]) == {"message", "type", "param", "code"}
        status, _, data = _call(gw.url, "GET", "/admin/state", ADMIN)
        assert status == 200 and b"upstreams" in data
    with _gateway(emulator) as gw:  # admin_token unset: the admin API is off
        for method, path in ADMIN_ROUTES:
            for key in (None, KEY_A, ADMIN):
                status, _, data = _call(gw.url, method, path, key, {} if method == "POST" else None)
                assert status == 403, (method, path, key, data[:300])


# --- prefix-cache salts ----------------------------------------------------------------------


def _hits(emulator: str) -> float:
    status, _, data = _call(emulator, "GET", "/metrics")
    assert status == 200
    return _metric(data.decode(), "vllm:prefix_cache_hits_total")


def test_tenants_share_no_cached_prompt_blocks(emulator: str) -> None:
    secret = f"A's confidential contract {uuid.uuid4().hex}. " * 30  # dozens of full blocks
    unmetered = {KEY_A: {"name": "acme"}, KEY_B: {"name": "globex"}}
    with _gateway(emulator, tenants=unmetered) as gw:
        assert _call(gw.url, "POST", "/v1/chat/completions", KEY_A, _chat(secret))[0] == 200
        before = _hits(emulator)
        status, _, data = _call(gw.url, "POST", "/v1/chat/completions", KEY_B, _chat(secret))
        assert status == 200, data[:300]
        assert _hits(emulator) == before  # B's probe of A's prompt found nothing cached
        assert _call(gw.url, "POST", "/v1/chat/completions", KEY_A, _chat(secret))[0] == 200
        assert _hits(emulator) > before + 100  # A's own repeat hits its cached blocks
        # A client cannot pick a salt (it could be another tenant's).
        body = _chat(secret, cache_salt="anything")
        status, _, data = _call(gw.url, "POST", "/v1/chat/completions", KEY_B, body)
        assert status == 400 and json.loads(data)["error"]["param"] == "cache_salt"
    # Off: the engine may share blocks between tenants again.
    with _gateway(emulator, tenants=unmetered, tenant_cache_salt=False) as gw:
        prompt = f"shared {uuid.uuid4().hex} " * 40
        assert _call(gw.url, "POST", "/v1/chat/completions", KEY_A, _chat(prompt))[0] == 200
        before = _hits(emulator)
        assert _call(gw.url, "POST", "/v1/chat/completions", KEY_B, _chat(prompt))[0] == 200
        assert _hits(emulator) > before


# --- no prompt text in logs on error paths ---------------------------------------------------


def test_refused_and_malformed_requests_leave_no_prompt_text(emulator: str, tmp_path: Path) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    log = tmp_path / "access.log"
    gw = _gateway(emulator, access_log=str(log), models=[MODEL])
    with gw:
        url = gw.url
        chat = "/v1/chat/completions"
        sent = [
            (KEY_A, f'{{"model": "{MODEL}", "messages": [{{"content": "{marker}"'.encode(), {}),
            (KEY_A, _chat(marker, max_tokens="many"), {}),
            (KEY_A, _chat(marker, max_tokens=-1), {}),
            (KEY_A, _chat(marker), {"x-headway-priority": "urgent"}),
            (KEY_A, _chat(marker), {"x-headway-deadline-ms": "soon"}),
            (KEY_A, _chat(marker, cache_salt="x"), {}),
            (KEY_A, {**_chat(marker), "model": "other-model"}, {}),
            ("wrong-key", _chat(marker), {}),
            (KEY_B, _chat(marker, n=2), {}),  # the engine's 400
            (KEY_B, {**_chat(marker), "temperature": "hot"}, {}),  # the engine's 400
            (KEY_B, _chat(marker, max_tokens=2**62), {}),  # over any budget or replica
        ]
        statuses = []
        for key, body, headers in sent:
            status, _, _ = _call(url, "POST", chat, key, body, headers)
            statuses.append(status)
        statuses += [  # tenant A over its token budget: 429
            _call(url, "POST", chat, KEY_A, _chat(marker, max_tokens=30))[0] for _ in range(6)
        ]
        assert all(400 <= s < 500 for s in statuses[: len(sent)]), statuses
        assert 429 in statuses[len(sent) :], statuses
        gw.stop(timeout_s=20)
        stderr = "".join(gw.output)
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]
    assert len(lines) == len(statuses)
    assert sorted(line["status"] for line in lines) == sorted(statuses)
    assert marker not in log.read_text(encoding="utf-8")
    assert marker not in stderr and urllib.parse.quote(marker) not in stderr
