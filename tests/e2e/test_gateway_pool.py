"""The gateway's upstream pool against real emulators on loopback: warm-up, revision
pinning, a corrupted fingerprint excluded within one probe interval, a stalled replica
busy but not wrong, drain, and load read from the engines' /metrics."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest

from headway.emulate.process import EmulatorProcess
from headway.gateway.pool import Upstream, UpstreamPool, parse_pool_config

MODEL = "llama-3-8b"
INTERVAL_S = 0.2
DEADLINE_S = 0.15
SLACK_S = 0.35
"""Loopback and a busy 2-core machine: what a probe may take beyond its schedule."""
WARMUP = 2


@pytest.fixture(scope="module")
def r1() -> Iterator[str]:
    with EmulatorProcess(["--speedup", "20", "--revision", "r1"]) as emu:
        yield emu.url


@pytest.fixture(scope="module")
def r2() -> Iterator[str]:
    with EmulatorProcess(["--speedup", "20", "--revision", "r2"]) as emu:
        yield emu.url


def _pool(*upstreams: dict[str, Any], **extra: Any) -> UpstreamPool:
    config = {
        "upstreams": list(upstreams),
        "probe_interval_s": INTERVAL_S,
        "probe_deadline_s": DEADLINE_S,
        "warmup_probes": WARMUP,
        "metrics_interval_s": 0.05,
        "metrics_deadline_s": 0.05,
        **extra,
    }
    return UpstreamPool(parse_pool_config(config))


async def _faults(url: str, body: dict[str, Any] | None) -> None:
    async with aiohttp.ClientSession() as session:
        if body is None:
            response = await session.delete(f"{url}/admin/faults")
        else:
            response = await session.post(f"{url}/admin/faults", json=body)
        assert response.status == 200, await response.text()


async def _until(check: Callable[[], bool], within_s: float) -> float:
    """Seconds until ``check()`` holds; fails past ``within_s``."""
    start = time.monotonic()
    while not check():
        waited = time.monotonic() - start
        assert waited < within_s, f"not within {within_s:g} s"
        await asyncio.sleep(0.002)
    return time.monotonic() - start


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20.0))


def _state(u: Upstream) -> str:
    """Its state, read through a call (a property read twice narrows in mypy)."""
    return u.state


def _ready(u: Upstream) -> bool:
    return u.ready


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_warmup_then_only_matching_revisions(r1: str, r2: str) -> None:
    impostor = r2.replace("127.0.0.1", "localhost")  # the r2 engine, configured as r1
    dead = f"http://127.0.0.1:{_free_port()}"

    async def scenario() -> None:
        pool = _pool(
            {"url": r1, "revision": "r1", "model": MODEL},
            {"url": r2, "revision": "r2", "model": MODEL},
            {"url": impostor, "revision": "r1", "model": MODEL},
            {"url": dead, "revision": "r1", "model": MODEL},
            unreachable_after_probes=2,
        )
        u1, u2, fake, gone = pool.upstreams
        assert pool.ready_for(None) == []  # nothing before the warm-up
        async with pool:
            await _until(lambda: u1.ready and u2.ready, WARMUP * INTERVAL_S + 2.0)
            assert u1.probe_counts["pass"] >= WARMUP
            await _until(lambda: gone.health == "unreachable", 3 * INTERVAL_S + SLACK_S)
            assert pool.ready_for("r1") == [u1]
            assert pool.ready_for("r2") == [u2]
            assert pool.ready_for(None) == [u1, u2]
            assert pool.ready_for("r3") == []
            assert (fake.state, fake.reason) == ("excluded", "fingerprint mismatch")
            assert fake.probe_counts["pass"] == 0
            assert gone.reason == "unreachable: connection refused"
            assert gone.probe_counts["pass"] == 0
            state = pool.state()
            assert state["ready"] == 2
            assert state["by_state"] == {"ready": 2, "excluded": 1, "unreachable": 1}

    _run(scenario)


def test_corrupted_fingerprint_leaves_rotation_within_one_interval(r1: str) -> None:
    async def scenario() -> None:
        pool = _pool({"url": r1, "revision": "r1", "model": MODEL})
        (u,) = pool.upstreams
        seen: list[str] = []
        pool.subscribe(lambda up: seen.append(up.state))
        async with pool:
            await _until(lambda: _ready(u), WARMUP * INTERVAL_S + 2.0)
            try:
                await _faults(r1, {"corrupt_fingerprint": True})
                took_s = await _until(
                    lambda: u.health == "excluded", INTERVAL_S + DEADLINE_S + SLACK_S
                )
                assert u.reason == "fingerprint mismatch"
                assert pool.ready_for("r1") == [] and not _ready(u)
                assert u.last_probe is not None and "expected" in u.last_probe.detail
                assert took_s < INTERVAL_S + DEADLINE_S + SLACK_S
                await asyncio.sleep(2 * INTERVAL_S)
                assert u.health == "excluded"  # fail closed while it mismatches
            finally:
                await _faults(r1, None)
            seen.clear()
            await _until(lambda: _ready(u), WARMUP * INTERVAL_S + DEADLINE_S + SLACK_S)
            assert seen == ["warming", "ready"]  # back only after the warm-up
            assert pool.ready_for("r1") == [u]

    _run(scenario)


def test_stalled_replica_is_busy_not_wrong(r1: str) -> None:
    async def scenario() -> None:
        pool = _pool({"url": r1, "revision": "r1", "model": MODEL})
        (u,) = pool.upstreams
        async with pool:
            await _until(lambda: _ready(u), WARMUP * INTERVAL_S + 2.0)
            try:
                await _faults(r1, {"stall": True})
                await _until(lambda: u.health == "busy", INTERVAL_S + DEADLINE_S + SLACK_S)
                busy_before = u.probe_counts["busy"]
                await asyncio.sleep(3 * INTERVAL_S)
                assert u.probe_counts["busy"] >= busy_before + 2
                assert u.reason == f"busy: timeout after {DEADLINE_S:g} s"
                assert _ready(u) and pool.ready_for("r1") == [u]  # kept in rotation
                assert u.probe_counts["wrong"] == 0 and u.probe_counts["error"] == 0
                snap = pool.state()["upstreams"][0]
                assert snap["busy"] and snap["busy_for_s"] > 2 * INTERVAL_S
            finally:
                await _faults(r1, None)
            await _until(lambda: u.health == "ready", INTERVAL_S + DEADLINE_S + SLACK_S)
            assert not u.busy

    _run(scenario)


def test_drain_stops_admission_and_waits_for_in_flight(r1: str) -> None:
    async def scenario() -> None:
        pool = _pool({"url": r1, "revision": "r1", "model": MODEL})
        (u,) = pool.upstreams
        async with pool:
            await _until(lambda: _ready(u), WARMUP * INTERVAL_S + 2.0)
            u.started(100)
            pool.drain(r1, 0.1)
            assert pool.ready_for(None) == [] and _state(u) == "draining"
            assert not await pool.wait_drained(r1)  # deadline passed with one in flight
            pool.drain(r1, 5.0)
            waiter = asyncio.create_task(pool.wait_drained(r1))
            await asyncio.sleep(0.05)
            assert not waiter.done()
            u.finished(100)
            assert await waiter and u.drained
            await asyncio.sleep(2 * INTERVAL_S)
            assert _state(u) == "draining"  # probes go on, admission does not
            pool.undrain(r1)
            assert not _ready(u) and _state(u) == "warming"
            await _until(lambda: _ready(u), WARMUP * INTERVAL_S + DEADLINE_S + SLACK_S)

    _run(scenario)


async def _generate(session: aiohttp.ClientSession, url: str, max_tokens: int) -> None:
    body = {"model": MODEL, "prompt": "load", "max_tokens": max_tokens}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        await response.read()


def test_metrics_fill_running_waiting_and_kv(r2: str) -> None:
    async def scenario() -> None:
        pool = _pool({"url": r2, "revision": "r2", "model": MODEL, "kv_blocks": 1000})
        (u,) = pool.upstreams
        async with pool, aiohttp.ClientSession() as client:
            await _until(lambda: u.metrics_at_s is not None, 2.0)
            assert u.running_requests + u.waiting_requests <= 1  # at most the probe
            # The engine's own count (vllm:cache_config_info, which the emulator writes as
            # vLLM does) wins over the configured kv_blocks.
            total = u.kv_blocks_total
            assert total is not None and total != 1000
            # A health probe in flight may hold a block at the scrape; once it ends, all free.
            await _until(lambda: u.free_kv_blocks == u.kv_blocks_total, 2.0)
            load: list[asyncio.Task[None]] = []
            try:
                await _faults(r2, {"stall": True})
                load = [asyncio.create_task(_generate(client, r2, 4000)) for _ in range(3)]
                await _until(lambda: u.waiting_requests >= 3, 2.0)
                assert u.outstanding_requests >= 3
                await _faults(r2, {"stall": False})
                await _until(
                    lambda: u.running_requests >= 3 and (u.kv_usage_fraction or 0) > 0, 2.0
                )
                upstream: Upstream = u
                assert 0 < upstream.free_kv_blocks < total
                passes = u.probe_counts["pass"]
                await asyncio.sleep(2 * INTERVAL_S)
                assert u.probe_counts["pass"] >= passes + 1  # loaded, still answering right
                snap = pool.state()["upstreams"][0]
                assert snap["running_requests"] >= 3 and snap["metrics_error"] == ""
                running = pool.metric_series()["headway_gateway_upstream_running_requests"]()
                assert running == [((r2, "r2"), float(u.running_requests))]
            finally:
                for task in load:
                    task.cancel()
                await asyncio.gather(*load, return_exceptions=True)
                await _faults(r2, None)
            await _until(lambda: u.running_requests <= 1, 2.0)  # disconnects free them

    _run(scenario)


def test_reconfigure_keeps_what_stays(r1: str, r2: str) -> None:
    def config(*upstreams: dict[str, Any]) -> Any:
        return parse_pool_config(
            {"upstreams": list(upstreams), "probe_interval_s": INTERVAL_S,
             "probe_deadline_s": DEADLINE_S, "warmup_probes": WARMUP}
        )  # fmt: skip

    first = {"url": r1, "revision": "r1", "model": MODEL}
    second = {"url": r2, "revision": "r2", "model": MODEL}

    async def scenario() -> None:
        pool = UpstreamPool(config(first))
        (u1,) = pool.upstreams
        async with pool:
            await _until(lambda: u1.ready, WARMUP * INTERVAL_S + 2.0)
            seen: list[tuple[str, str]] = []
            pool.subscribe(lambda up: seen.append((up.url, up.state)))
            u1.started(10)
            await pool.reconfigure(config(first, second))
            u1_again, u2 = pool.upstreams
            assert u1_again is u1 and u1.ready and u1.inflight_requests == 1
            await _until(lambda: u2.ready, WARMUP * INTERVAL_S + DEADLINE_S + SLACK_S)
            assert all(state == "ready" for url, state in seen if url == u1.url)  # no flap
            assert pool.ready_for(None) == [u1, u2]
            await pool.reconfigure(config({**second, "revision": "r9"}))  # r1 leaves
            assert pool.upstreams == [u2] and pool.ready_for(None) == []
            await _until(lambda: u2.health == "excluded", INTERVAL_S + DEADLINE_S + SLACK_S)
            assert u2.reason == "fingerprint mismatch"  # it serves r2, not r9
            u1.finished(10)  # a request that outlived its upstream's removal

    _run(scenario)
