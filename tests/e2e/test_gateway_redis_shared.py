"""Shared budgets across processes: a gateway process killed with SIGKILL while it holds a
lease does not keep that budget; its lease expires and the tokens return to the pool."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import redis

from binaries import RedisServer
from headway.core.policy.admission import TenantLimits
from headway.gateway.shared import SharedBudgets, SharedBudgetsConfig

CHILD = """
import asyncio, sys, time
from headway.core.policy.admission import TenantLimits
from headway.gateway.shared import SharedBudgets, SharedBudgetsConfig

async def main():
    cfg = SharedBudgetsConfig(redis_url=sys.argv[1], lease_tokens=2000.0,
                              sync_interval_s=0.1, lease_ttl_s=0.6)
    inst = SharedBudgets(cfg, {"a": TenantLimits(token_rate_per_s=1.0, burst_s=10000.0)},
                         "child")
    await inst.start()
    assert inst.mode == "shared", inst.stats()
    assert inst.try_take("a", 100, time.monotonic())
    inst.add_in_flight("a", 2)
    print("ready", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_killed_process_lease_returns_to_the_pool() -> None:
    limits = {"a": TenantLimits(token_rate_per_s=1.0, burst_s=10_000.0)}  # burst 10_000
    with RedisServer() as server:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, server.url], stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
            time.sleep(0.3)  # a sync publishes its in-flight count
        finally:
            child.kill()
            child.communicate(timeout=5)  # reaps it and closes the pipe
        client = redis.Redis.from_url(server.url)
        level_before = float(client.hget("headway:bucket:a", "level") or 0)
        assert level_before < 10_000 - 2_000 + 10  # the dead child's lease is out

        async def run() -> None:
            cfg = SharedBudgetsConfig(
                redis_url=server.url, lease_tokens=1_000.0, sync_interval_s=0.1, lease_ttl_s=0.6
            )
            live = SharedBudgets(cfg, limits, "live")
            await live.start()
            assert live.in_flight("a") == 2  # the child's, until it is reaped
            await asyncio.sleep(1.0)
            stats = live.stats()
            assert stats["reaped_instances"] == 1
            assert stats["instances"] == 1
            assert live.in_flight("a") == 0
            # the child's recorded lease (2_000) is back; live holds 1_000
            level = float(client.hget("headway:bucket:a", "level") or 0)
            assert level >= 10_000 - 1_000 - 5, level
            await live.stop()

        asyncio.run(run())
        assert float(client.hget("headway:bucket:a", "level") or 0) >= 9_999
        client.close()
