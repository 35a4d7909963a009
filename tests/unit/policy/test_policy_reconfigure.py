"""Live reload of the core policies: new settings apply to the next decision, state that
matters (queued entries, bucket levels and debt, tickets, retry counts) is kept."""

from __future__ import annotations

import asyncio
from typing import Any

from headway.core.policy.admission import (
    AdmissionConfig,
    AdmissionPolicy,
    AdmissionRequest,
    TenantLimits,
)
from headway.core.policy.decisions import Shed, ShedReason
from headway.core.policy.queues import BandConfig, PriorityQueues, QueueConfig
from headway.core.policy.retries import RetryConfig, RetryPolicy
from headway.gateway.config import parse_config
from headway.gateway.control import Controller, Lease


def test_admission_reload_keeps_the_bucket_level_and_debt() -> None:
    slow = TenantLimits(token_rate_per_s=100.0, burst_s=10.0)  # holds 1000
    policy = AdmissionPolicy(AdmissionConfig(tenants={"a": slow, "b": slow}))
    assert policy.tokens_available(0.0, "a") == 1000.0
    bucket = policy._bucket(0.0, "a")
    assert bucket is not None and bucket.try_take(0.0, 900.0)
    b_bucket = policy._bucket(0.0, "b")
    assert b_bucket is not None
    b_bucket.take_on_credit(0.0, 1200.0)  # b owes 200
    fast = TenantLimits(token_rate_per_s=1000.0, burst_s=10.0)  # holds 10000
    policy.reconfigure(0.0, AdmissionConfig(tenants={"a": fast, "b": fast}))
    # No fresh burst for a reload: a keeps its 100, b its debt; the new rate refills.
    assert policy.tokens_available(0.0, "a") == 100.0
    assert policy.tokens_available(0.0, "b") == -200.0
    assert policy.tokens_available(1.0, "a") == 1100.0
    # A smaller burst caps what was held; a removed budget removes the bucket.
    policy.reconfigure(1.0, AdmissionConfig(tenants={"a": TenantLimits(token_rate_per_s=10.0)}))
    assert policy.tokens_available(1.0, "a") == 100.0  # 10/s × 10 s burst
    assert policy.tokens_available(1.0, "b") is None


def test_queue_reload_keeps_entries_and_applies_new_bounds_and_weights() -> None:
    queues: PriorityQueues[int] = PriorityQueues(QueueConfig())
    for i in range(5):
        assert queues.push(0.0, i, band="interactive", tenant="a", cost_tokens=10) is None
    tighter = QueueConfig(interactive=BandConfig(max_queued_requests=3), tenant_weights={"a": 4})
    queues.reconfigure(tighter)
    assert len(queues) == 5  # nothing dropped
    refused = queues.push(0.0, 9, band="interactive", tenant="b", cost_tokens=10)
    assert refused is not None  # the new bound applies to the next push
    assert queues.config.weight("a") == 4
    popped = [queues.try_pop(0.0, total_slots=100, running={}) for _ in range(5)]
    assert [p.item for p in popped if p is not None] == [0, 1, 2, 3, 4]
    queues.check_invariants()


def test_retry_reload_keeps_the_budget_window_unless_its_length_changes() -> None:
    policy = RetryPolicy(RetryConfig(budget_ratio=0.1))
    for _ in range(50):
        policy.record_request(0.0)
    before = policy.budget(0.0)
    policy.reconfigure(RetryConfig(budget_ratio=0.5))
    after = policy.budget(0.0)
    assert after[0] == before[0] and after[2] > before[2]  # same requests, more allowed
    policy.reconfigure(RetryConfig(budget_ratio=0.5, budget_window_s=30.0))
    assert policy.budget(0.0)[0] == 0


def _request(tenant: str) -> AdmissionRequest:
    return AdmissionRequest(tenant=tenant, prompt_tokens=10, p95_output_tokens=10)


def test_controller_reload_under_load_drops_nothing_and_applies_budgets() -> None:
    base: dict[str, Any] = {
        "upstreams": [{"url": "http://127.0.0.1:9", "slots": 3}],
        "tenants": {"ka": {"name": "a"}, "kb": {"name": "b"}},
        "queues": {"critical_reserved_slots": 0},
    }

    async def scenario() -> None:
        ctl = Controller(parse_config(base))
        leases = [ctl.offer(_request("a")) for _ in range(5)]
        assert all(isinstance(x, Lease) for x in leases)
        running = [x for x in leases if isinstance(x, Lease) and x.upstream is not None]
        assert len(running) == 3
        new = dict(base)
        new["tenants"] = {"ka": {"name": "a"},
                          "kb": {"name": "b", "token_rate_per_s": 1.0, "burst_s": 1.0}}  # fmt: skip
        ctl.reconfigure(parse_config(new))
        assert ctl.running["interactive"] == 3 and len(ctl.queues) == 2
        refused = ctl.offer(_request("b"))
        assert isinstance(refused, Shed) and refused.reason is ShedReason.TENANT_TOKEN_RATE
        for lease in leases:
            assert isinstance(lease, Lease)
            ctl.release(lease, completed=True)
        assert sum(ctl.in_flight.values()) == 0 and len(ctl.queues) == 0
        # Draining: the instance refuses new work with Retry-After 0 (retry on a peer).
        ctl.draining = True
        drained = ctl.offer(_request("a"))
        assert isinstance(drained, Shed) and drained.reason is ShedReason.DRAINING
        assert drained.retry_after_s == 0.0

    asyncio.run(scenario())
