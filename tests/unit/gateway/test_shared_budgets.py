"""Shared tenant budgets (``headway.gateway.shared``) against a real ``redis-server``.

Each test that needs Redis starts its own on a free port (:class:`binaries.RedisServer`)
and stops it at the end. Time runs on the wall clock, so the tests hammer for a few
seconds with loose margins.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import msgspec
import pytest
import redis

from binaries import RedisServer, free_port
from headway.core.errors import ConfigError
from headway.core.policy.admission import TenantLimits
from headway.core.policy.decisions import ShedReason
from headway.gateway.shared import SharedBudgets, SharedBudgetsConfig, SharedBudgetsConfigError

COST = 100  # tokens per request


def _cfg(url: str, **kw: object) -> SharedBudgetsConfig:
    base: dict[str, object] = {"redis_url": url, "request_tokens_hint": COST}
    base.update(kw)
    return msgspec.convert(base, SharedBudgetsConfig)


async def _hammer(
    inst: SharedBudgets,
    tenant: str,
    until_s: float,
    admitted: list[int],
    *,
    pace_s: float = 0.0,
    on_step: Callable[[], None] | None = None,
) -> None:
    """try_take COST tokens as fast as the loop allows (or every ``pace_s``) until then."""
    while (now := time.monotonic()) < until_s:
        if inst.try_take(tenant, COST, now):
            admitted[0] += 1
        else:
            admitted[1] += 1
        if on_step is not None:
            on_step()
        await asyncio.sleep(pace_s)


async def _wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    """Poll ``condition`` every 20 ms for up to ``timeout_s`` (the caller asserts after)."""
    for _ in range(math.ceil(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("redis_url", "http://127.0.0.1:6379"),
        ("lease_tokens", 0),
        ("lease_requests", 0),
        ("max_lease_fraction", 1.5),
        ("low_water_fraction", 1.0),
        ("sync_interval_s", -1.0),
        ("lease_ttl_s", 0.5),
        ("fail_mode", "sometimes"),
        ("expected_instances", 0),
        ("key_prefix", "has space"),
        ("timeout_s", float("nan")),
    ],
)
def test_bad_config_names_field_value_and_fix(field: str, value: object) -> None:
    with pytest.raises((ConfigError, msgspec.ValidationError)) as info:
        _cfg("redis://127.0.0.1:6379/0", **{field: value})
    message = str(info.value)
    assert field in message
    if isinstance(info.value, ConfigError):
        assert repr(value) in message
        assert "use " in message  # the fix
    direct = {"redis_url": "redis://127.0.0.1:6379/0", field: value}
    with pytest.raises(SharedBudgetsConfigError, match=rf"shared\.{field} is invalid"):
        SharedBudgetsConfig(**direct)  # type: ignore[arg-type]


def test_bad_instance_id_is_refused() -> None:
    with pytest.raises(ConfigError, match="instance_id"):
        SharedBudgets(_cfg("redis://127.0.0.1:1/0"), {}, "")


# ----------------------------------------------------------------------------- no Redis


def test_unbudgeted_tenants_pass_and_are_counted() -> None:
    inst = SharedBudgets(_cfg("redis://127.0.0.1:1/0"), {"free": TenantLimits()}, "i0")
    assert all(inst.try_take("free", 10_000, float(t)) for t in range(100))
    assert inst.try_take("stranger", 5, 1.0)
    inst.add_in_flight("free", 2)
    assert inst.in_flight("free") == 2
    assert inst.served_tokens("free") == 100 * 10_000


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
def test_unreachable_redis_at_start_serves_local_share_or_refuses(fail_mode: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens
    limits = {"a": TenantLimits(token_rate_per_s=1_000.0, burst_s=10.0)}  # burst 10_000
    inst = SharedBudgets(
        _cfg(url, fail_mode=fail_mode, expected_instances=2, timeout_s=0.2), limits, "i0"
    )

    async def run() -> tuple[int, dict[str, object]]:
        await inst.start()
        now = time.monotonic()
        passed = sum(inst.try_take("a", COST, now) for _ in range(200))
        stats = inst.stats()
        await inst.stop()
        return passed, stats

    t0 = time.monotonic()
    passed, stats = asyncio.run(run())
    assert time.monotonic() - t0 < 2.0, "an unreachable Redis must not hold up start/stop"
    assert stats["mode"] == "local-fallback"
    assert stats["healthy"] is False
    assert stats["last_error"]
    if fail_mode == "open":
        assert passed == 10_000 / 2 / COST  # burst / N of the local share, no more
    else:
        assert passed == 0
    shed = inst.check(time.monotonic(), "a", COST)  # stopped: refused, with a reason
    assert shed is not None
    assert shed.reason is ShedReason.TENANT_TOKEN_RATE


# ----------------------------------------------------------------------------- with Redis


def test_two_instances_keep_a_tenant_within_its_budget() -> None:
    rate, burst_s = 20_000.0, 2.0
    burst = rate * burst_s
    limits = {"a": TenantLimits(token_rate_per_s=rate, burst_s=burst_s)}

    async def run(url: str) -> None:
        cfg = _cfg(url)
        insts = [SharedBudgets(cfg, limits, f"i{k}") for k in range(2)]
        t0 = time.monotonic()
        for inst in insts:
            await inst.start()
        leases = [inst.stats()["tenants"]["a"]["lease_tokens"] for inst in insts]
        counts = [[0, 0], [0, 0]]
        until = t0 + 3.0
        await asyncio.gather(
            *(_hammer(i, "a", until, c) for i, c in zip(insts, counts, strict=True))
        )
        elapsed = time.monotonic() - t0
        # in-flight accounting: each instance's own count shows at once, the other's after
        # a sync
        insts[0].add_in_flight("a", 3)
        insts[1].add_in_flight("a", 4)
        assert insts[0].in_flight("a") == 3
        await asyncio.sleep(2 * cfg.sync_interval_s + 0.3)
        assert [inst.in_flight("a") for inst in insts] == [7, 7]
        assert insts[0].served_tokens("a") == pytest.approx(COST * (counts[0][0] + counts[1][0]))
        trips = sum(inst.round_trips for inst in insts)
        for inst in insts:
            await inst.stop()
        trips_all = sum(inst.round_trips for inst in insts)

        admitted_tokens = COST * (counts[0][0] + counts[1][0])
        budget = rate * elapsed + burst
        bound = budget + len(insts) * max(leases)
        assert admitted_tokens <= bound, (admitted_tokens, bound)
        # connected, live instances never exceed the bucket itself
        assert admitted_tokens <= budget
        # no starvation: most of the budget is used, and by both instances
        assert admitted_tokens >= 0.8 * budget, (admitted_tokens, budget)
        assert min(counts[0][0], counts[1][0]) >= 0.2 * (counts[0][0] + counts[1][0])
        admitted_requests = counts[0][0] + counts[1][0]
        assert trips_all <= admitted_requests / 20, (trips, trips_all, admitted_requests)

        # stop returned every unspent lease token: the bucket is back to what refill allows
        level = float(redis.Redis.from_url(url).hget("headway:bucket:a", "level") or 0)
        assert level > 0

    with RedisServer() as server:
        asyncio.run(run(server.url))


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
def test_redis_killed_mid_run_falls_back_then_recovers(fail_mode: str) -> None:
    # A light tenant (10 % of its budget) must lose nothing when Redis dies under fail-open.
    limits = {"light": TenantLimits(token_rate_per_s=10_000.0, burst_s=5.0)}

    async def run(server: RedisServer) -> None:
        cfg = _cfg(
            server.url,
            fail_mode=fail_mode,
            sync_interval_s=0.1,
            lease_ttl_s=0.6,
            timeout_s=0.2,
            reconnect_max_s=0.2,
        )
        insts = [SharedBudgets(cfg, limits, f"i{k}") for k in range(2)]
        for inst in insts:
            await inst.start()
        assert [inst.mode for inst in insts] == ["shared", "shared"]
        modes: set[str] = set()

        def watch() -> None:
            modes.update(inst.mode for inst in insts)

        counts = [[0, 0], [0, 0]]
        t0 = time.monotonic()
        tasks = [
            asyncio.create_task(_hammer(i, "light", t0 + 3.0, c, pace_s=0.02, on_step=watch))
            for i, c in zip(insts, counts, strict=True)
        ]
        await asyncio.sleep(0.8)
        server.kill()
        await _wait_for(lambda: all(i.mode == "local-fallback" for i in insts), 1.5)
        stats = [inst.stats() for inst in insts]
        assert [s["mode"] for s in stats] == ["local-fallback"] * 2
        assert not any(s["healthy"] for s in stats)
        assert all(s["last_error"] for s in stats)
        await asyncio.sleep(0.6)  # leases lapse: fail-closed now refuses
        if fail_mode == "closed":
            now = time.monotonic()
            assert not insts[0].try_take("light", COST, now)
        server.start()  # same port, empty data
        await _wait_for(lambda: all(i.mode == "shared" for i in insts), 2.0)
        assert [inst.mode for inst in insts] == ["shared", "shared"]
        await asyncio.gather(*tasks)  # no exception escaped try_take
        assert insts[0].try_take("light", COST, time.monotonic())
        for inst in insts:
            await inst.stop()
        assert modes >= {"shared", "local-fallback"}
        if fail_mode == "open":
            assert counts[0][1] == counts[1][1] == 0, counts  # nothing refused
        else:
            assert counts[0][1] + counts[1][1] > 0

    with RedisServer() as server:
        asyncio.run(run(server))


def test_dead_instance_lease_expires_and_returns_to_the_pool() -> None:
    # Slow refill, so that the bucket's level shows the returned lease.
    limits = {"a": TenantLimits(token_rate_per_s=1.0, burst_s=10_000.0)}  # burst 10_000

    async def run(url: str) -> None:
        cfg = _cfg(url, sync_interval_s=0.1, lease_ttl_s=0.5, lease_tokens=2_000.0)
        dead = SharedBudgets(cfg, limits, "dead")
        live = SharedBudgets(cfg, limits, "live")
        await dead.start()
        dead.add_in_flight("a", 5)
        assert dead.try_take("a", COST, time.monotonic())
        await asyncio.sleep(0.25)  # one sync publishes its in-flight count
        # crash: the task stops and the client goes away without returning anything
        assert dead._task is not None
        dead._task.cancel()
        assert dead._redis is not None
        await dead._redis.aclose()
        await live.start()
        client = redis.Redis.from_url(url)
        level = float(client.hget("headway:bucket:a", "level") or 0)
        assert level < 10_000 - 2 * 2_000 + 10  # both leases out
        assert live.in_flight("a") == 5
        await asyncio.sleep(0.8)  # past the dead instance's lease_ttl_s; live syncs
        level = float(client.hget("headway:bucket:a", "level") or 0)
        # its whole recorded lease is back, the 100 it spent unreported included: that
        # overspend is what the bound's "instances × lease" term allows
        assert level >= 10_000 - 2_000 - 5, level
        assert live.in_flight("a") == 0
        assert live.stats()["reaped_instances"] == 1
        assert live.stats()["instances"] == 1
        await live.stop()
        assert float(client.hget("headway:bucket:a", "level") or 0) >= 9_999
        client.close()

    with RedisServer() as server:
        asyncio.run(run(server.url))


def test_partition_charges_local_share_spending_on_reconnect() -> None:
    # Redis stays up but stops answering (CLIENT PAUSE) for longer than the lease TTL:
    # the instance serves its local share, is reaped, and on reconnection the share it
    # spent is charged to the shared bucket, so tokens are conserved.
    rate, burst = 1_000.0, 10_000.0
    limits = {"a": TenantLimits(token_rate_per_s=rate, burst_s=burst / rate)}

    async def run(url: str) -> None:
        cfg = _cfg(url, sync_interval_s=0.1, lease_ttl_s=0.6, timeout_s=0.2, reconnect_max_s=0.2)
        inst = SharedBudgets(cfg, limits, "i0")
        t0 = time.monotonic()
        await inst.start()
        client = redis.Redis.from_url(url)
        client.execute_command("CLIENT", "PAUSE", "1500", "ALL")
        await _wait_for(lambda: inst.mode == "local-fallback", 1.0)
        assert inst.mode == "local-fallback"
        assert "Timeout" in str(inst.stats()["last_error"])
        now = time.monotonic()
        passed = sum(inst.try_take("a", COST, now) for _ in range(200))
        assert 0 < passed < 200  # the local share (N = 1: the whole bucket), no more
        await _wait_for(lambda: inst.mode == "shared", 3.0)
        assert inst.mode == "shared"
        await asyncio.sleep(3 * cfg.sync_interval_s)  # the next sync settles what it owes
        elapsed = time.monotonic() - t0
        stats = inst.stats()["tenants"]["a"]
        level = float(client.hget("headway:bucket:a", "level") or 0)
        held = stats["lease_tokens_left"]
        # admitted + still leased + left in the bucket never exceeds what the bucket gave
        assert stats["admitted_tokens"] + held + level <= burst + rate * elapsed + 1
        await inst.stop()
        client.close()

    with RedisServer() as server:
        asyncio.run(run(server.url))
