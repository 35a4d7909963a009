"""Two gateway processes sharing one `redis-server` in front of one emulator: a tenant
sending to both stays within its one token budget (the over-admission bound of
`headway.gateway.shared`), and killing Redis mid-run loses no request (every request gets
a terminal answer: 2xx, or 429/503 with Retry-After; the gateways go on serving on local
shares and say so in their metrics)."""

from __future__ import annotations

import http.client
import json
import math
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from binaries import RedisServer
from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

MODEL = "llama-3-8b"
KEY = "key-shared"
RATE, BURST_S = 2000.0, 1.0  # tokens per second, seconds of burst
MAX_TOKENS = 16
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS}
).encode()
COST = math.ceil(len(BODY) / 4.0) + MAX_TOKENS  # prompt estimate (bytes / 4) + max_tokens


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    return sum(float(v) for v in found)


def _post(url: str) -> tuple[int, str | None]:
    """Status and Retry-After of one request; status 0 when no answer came (an error)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=15)
    try:
        conn.request("POST", "/v1/chat/completions", body=BODY, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})  # fmt: skip
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("Retry-After")
    except OSError:
        return 0, None
    finally:
        conn.close()


def _drive(
    urls: list[str], seconds: float, at: Callable[[float], None] | None = None
) -> list[tuple[float, int, str | None]]:
    """Four clients (two per gateway) sending back to back for ``seconds``: (time from
    the start, status, Retry-After) of every request. ``at(elapsed)`` runs in between."""
    out: list[tuple[float, int, str | None]] = []
    lock = threading.Lock()
    start = time.monotonic()

    def client(url: str) -> None:
        while time.monotonic() - start < seconds:
            sent = time.monotonic() - start
            status, retry_after = _post(url)
            with lock:
                out.append((sent, status, retry_after))
            if status == 429:
                time.sleep(0.005)

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client, url) for url in urls for _ in range(2)]
        if at is not None:
            at(start)
        for f in futures:
            f.result(timeout=seconds + 60)
    return out


def test_two_gateways_share_one_budget_and_survive_redis_dying() -> None:
    with RedisServer() as redis, EmulatorProcess(["--speedup", "50"]) as emu:
        config = {
            "upstreams": [{"url": emu.url}],
            "tenants": {KEY: {"name": "shared", "token_rate_per_s": RATE, "burst_s": BURST_S}},
            "slots_per_upstream": 64,
            "metrics_public": True,
            "queues": {"critical_reserved_slots": 0},
            "shared": {"sync_interval_s": 0.2, "lease_ttl_s": 1.0, "timeout_s": 0.2,
                       "reconnect_max_s": 0.5, "request_tokens_hint": float(COST)},
        }  # fmt: skip
        args = ("--redis", redis.url)
        with GatewayProcess(config, args=args) as one, GatewayProcess(config, args=args) as two:
            urls = [one.url, two.url]
            for url in urls:
                assert _metric(url, "headway_gateway_shared_budgets_healthy") == 1

            # 1. One budget across both instances.
            seconds = 3.0
            start = time.monotonic()
            shared = _drive(urls, seconds)
            elapsed = time.monotonic() - start
            admitted = sum(1 for _, status, _ in shared if status == 200) * COST
            lease = 0.25 * RATE * BURST_S  # max_lease_fraction × burst bounds L
            bound = RATE * elapsed + RATE * BURST_S + 2 * max(lease, COST)
            assert admitted <= bound, (admitted, bound)
            assert admitted >= RATE * BURST_S / 2  # it did serve
            statuses = {status for _, status, _ in shared}
            assert statuses <= {200, 429}, statuses
            assert 429 in statuses  # the budget binds (demand is far above it)
            assert all(ra is not None for _, status, ra in shared if status == 429)

            # 2. Redis dies mid-run: every request still gets a terminal answer.
            def kill_later(start: float) -> None:
                time.sleep(max(0.0, start + 1.0 - time.monotonic()))
                redis.kill()

            outage = _drive(urls, 3.0, at=kill_later)
            for _, status, retry_after in outage:
                assert status == 200 or (status in (429, 503) and retry_after is not None), (
                    status,
                    retry_after,
                )
            assert any(status == 200 for sent, status, _ in outage if sent > 1.5)
            for url in urls:
                assert _metric(url, "headway_gateway_shared_budgets_healthy") == 0
