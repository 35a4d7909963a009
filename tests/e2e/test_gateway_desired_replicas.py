"""The live gateway recommends replicas (issue 20, deliverable 5): with ``autoscaler:``
its /metrics carries ``headway_gateway_desired_replicas{pool}``, the core predictive
autoscaler on the gateway's own counters, and the figure rises while one emulated
upstream with two slots is offered more than it carries; a reload that changes the
autoscaler or its pools is reported as needing a restart."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from gateway_calls import complete, metrics
from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess
from headway.metrics_catalog import DESIRED_REPLICAS_METRIC

KEY = "key-acme"
ADMIN = "admin-secret"


def _desired(url: str) -> float:
    return metrics(url).total(DESIRED_REPLICAS_METRIC, pool="default")


def test_the_desired_replica_count_appears_and_rises_under_load() -> None:
    config = {
        "tenants": {KEY: {"name": "acme"}},
        "metrics_public": True,
        "admin_token": ADMIN,
        "slots_per_upstream": 2,
        "autoscaler": {
            "kind": "predictive",
            "evaluation_interval_s": 0.2,
            "detection_delay_s": 0.4,
            "startup_delay_s": 5.0,
            "scale_up_cooldown_s": 0.0,
            "min_replicas": 1,
            "max_replicas": 6,
            "predictive": {"queue_delay_target_s": 0.05, "recovery_objective_s": 10.0},
        },
    }
    with (
        EmulatorProcess(["--speedup", "1", "--model", "llama-3-8b"]) as emulator,
        GatewayProcess({"upstreams": [{"url": emulator.url}], **config}) as gateway,
    ):
        idle = _desired(gateway.url)
        stop = threading.Event()
        seen: list[float] = []

        def watch() -> None:
            while not stop.is_set():
                seen.append(_desired(gateway.url))
                stop.wait(0.1)

        watcher = threading.Thread(target=watch)
        watcher.start()
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(lambda _: complete(gateway.url, KEY, 48), range(48)))
        stop.set()
        watcher.join()
        loaded_s = time.monotonic() - started
        # A reload cannot move the pools or the autoscaler under running windows: it says so.
        gateway.write_config(
            {
                **gateway.config,
                "upstreams": [{"url": emulator.url, "route": "llama-3-8b"}],
                "routes": {"llama-3-8b": {}},
                "autoscaler": {**config["autoscaler"], "max_replicas": 5},
            }
        )
        reload = urllib.request.Request(
            f"{gateway.url}/admin/reload", b"{}",
            {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN}"},
        )  # fmt: skip
        with urllib.request.urlopen(reload, timeout=10) as resp:
            needs_restart = json.loads(resp.read())["needs_restart"]
    assert {"autoscaler", "autoscaler pools"} <= set(needs_restart), needs_restart
    assert set(codes) == {200}
    assert idle == 1.0  # the one upstream, before any load
    assert loaded_s > 1.0, "the load did not last long enough to be measured"
    assert max(seen) >= 2.0, seen
