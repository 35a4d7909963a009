"""Little's law from the gateway's own /metrics (issue 19, result 1: "computed from ...
the gateway's own measurements"): over a window that starts and ends with nothing
inside, the in-system gauge's time-average (L) equals the offered rate (λ, the offered
counter) times the mean time in the gateway (W, the duration histogram), within the
gauge's sampling."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from gateway_calls import complete, metrics
from headway.core.metrics import little_from_counters, sampled_area
from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

KEY = "key-acme"


def test_the_gateways_own_counters_satisfy_littles_law() -> None:
    config = {"tenants": {KEY: {"name": "acme"}}, "metrics_public": True}
    with (
        EmulatorProcess(["--speedup", "4", "--model", "llama-3-8b"]) as emulator,
        GatewayProcess({"upstreams": [{"url": emulator.url}], **config}) as gateway,
    ):
        before = metrics(gateway.url)
        start = time.monotonic()
        samples: list[tuple[float, float]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                at = time.monotonic() - start
                n = metrics(gateway.url).total("headway_gateway_requests_in_system")
                samples.append((at, n))
                stop.wait(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        with ThreadPoolExecutor(8) as pool:
            codes = list(
                pool.map(lambda i: complete(gateway.url, KEY, 20 + 10 * (i % 5)), range(48))
            )
        stop.set()
        sampler.join()
        after = metrics(gateway.url)
        window_s = time.monotonic() - start
    assert set(codes) == {200}
    assert after.total("headway_gateway_requests_in_system") == 0
    area = sampled_area([t for t, _ in samples], [n for _, n in samples])
    name = "headway_gateway_request_duration_seconds"

    def delta(metric: str) -> float:
        return after.total(metric) - before.total(metric)

    check = little_from_counters(
        "gateway",
        window_s=window_s,
        arrivals=delta("headway_gateway_requests_offered_total"),
        ended=delta(f"{name}_count"),
        time_in_system_s=delta(f"{name}_sum"),
        mean_in_system=area / window_s,
    )
    assert delta("headway_gateway_requests_offered_total") == delta(f"{name}_count") == 48
    assert check.mean_in_system > 2  # the load overlapped
    assert check.relative_mismatch < 0.05, check
