"""Per-tenant slot shares end to end: a heavy tenant flooding the gateway takes every slot
while alone (work-conserving), and holds at most its share of the slots once a light
tenant is active, so the light tenant's requests are dispatched at once (no queue wait as
measured by the gateway) while the heavy tenant's queue. Assertions are on the gateway's
own counters, not on latencies: robust on a loaded machine."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from headway.emulate.process import EmulatorProcess
from headway.gateway.probe import metric_samples
from headway.gateway.process import GatewayProcess

MODEL = "llama-3-8b"
HEAVY, LIGHT = "key-heavy", "key-light"
SLOTS = 4
HEAVY_CAP = 2  # ceil(1/2 × 4 slots × headroom 1.0)


def _metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def _series(text: str, name: str, tenant: str, **more: str) -> float:
    """The sample of ``name`` whose labels are exactly ``tenant`` and ``more`` (0 if none)."""
    want = {"tenant": tenant, **more}
    for sample, labels, value in metric_samples(text):
        if sample == name and dict(re.findall(r'(\w+)="([^"]*)"', labels)) == want:
            return value
    return 0.0


def _held(url: str, tenant: str) -> float:
    return _series(_metrics(url), "headway_gateway_tenant_dispatched_requests", tenant)


def _post(url: str, key: str, max_tokens: int) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens}  # fmt: skip
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        err.read()
        return int(err.code)


def _wait_for(check: Any, limit_s: float = 20.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_a_light_tenant_is_dispatched_at_once_beside_a_flood() -> None:
    config = {
        "tenants": {HEAVY: {"name": "heavy"}, LIGHT: {"name": "light"}},
        "slots_per_upstream": SLOTS,
        "tenant_slot_headroom": 1.0,
        "tenant_active_s": 5.0,
        "queues": {"critical_reserved_slots": 0, "max_queued_per_tenant": 64,
                   "interactive": {"max_queued_requests": 128}},
    }  # fmt: skip
    stop = threading.Event()
    heavy_codes: list[int] = []

    def flood() -> None:
        while not stop.is_set():
            heavy_codes.append(_post(gw.url, HEAVY, 120))  # about 1 s each in real time

    with (
        EmulatorProcess(["--speedup", "1"]) as emu,
        GatewayProcess({"upstreams": [{"url": emu.url}], "metrics_public": True, **config}) as gw,
        ThreadPoolExecutor(12) as pool,
    ):
        floods = [pool.submit(flood) for _ in range(12)]
        try:
            # Alone, the heavy tenant takes every slot (work-conserving).
            assert _wait_for(lambda: _held(gw.url, "heavy") == SLOTS)
            # The light tenant becomes active; the heavy one drains down to its share (its
            # dispatched requests are never pre-empted). Light keeps sending meanwhile.
            assert _wait_for(
                lambda: _post(gw.url, LIGHT, 2) == 200 and _held(gw.url, "heavy") <= HEAVY_CAP
            )
            before = _metrics(gw.url)
            measured, held = 8, []
            for _ in range(measured):
                assert _post(gw.url, LIGHT, 4) == 200
                held.append(_held(gw.url, "heavy"))
            after = _metrics(gw.url)
        finally:
            stop.set()
            for f in floods:
                f.result(timeout=120)
    # While the light tenant was active the heavy one never held more than its share ...
    assert max(held) <= HEAVY_CAP, held
    # ... so every measured light request found a slot at once: no queue wait at all.
    name = "headway_gateway_queue_wait_seconds_bucket"
    at_once = [_series(t, name, "light", le="0.001") for t in (before, after)]
    assert at_once[1] - at_once[0] == measured
    # Meanwhile the heavy tenant's requests did queue (the contention was real).
    heavy_total = _series(after, "headway_gateway_queue_wait_seconds_count", "heavy")
    heavy_at_once = _series(after, name, "heavy", le="0.001")
    assert heavy_total - heavy_at_once >= 1
    assert set(heavy_codes) == {200}
