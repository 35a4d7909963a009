"""Retry tickets: a capacity shed carries a promise that its Retry-After is kept."""

from __future__ import annotations

from headway.core.policy.admission import (
    AdmissionConfig,
    AdmissionPolicy,
    AdmissionRequest,
    LoadSnapshot,
    TenantLimits,
)
from headway.core.policy.decisions import Enqueue, Shed, ShedReason
from headway.core.policy.queues import BANDS, BandConfig, PriorityQueues, QueueConfig

NOW = 100.0


def _full_queues(bound: int = 2) -> PriorityQueues[str]:
    """An interactive band at its bound, draining 1 request/s (one dispatch per second)."""
    queues: PriorityQueues[str] = PriorityQueues(
        QueueConfig(interactive=BandConfig(max_queued_requests=bound))
    )
    running = dict.fromkeys(BANDS, 0)
    for i in range(bound):
        queues.push(NOW - 10 + i, f"old{i}", band="interactive", tenant="acme", cost_tokens=100)
    assert queues.try_pop(NOW - 2, total_slots=8, running=running) is not None
    queues.push(NOW - 1, "last", band="interactive", tenant="acme", cost_tokens=100)
    assert queues.statistics(NOW).bands["interactive"].full
    return queues


def _load(queues: PriorityQueues[str], now: float) -> LoadSnapshot:
    return LoadSnapshot(
        queues=queues.statistics(now),
        free_slots=dict.fromkeys(BANDS, 0),
        free_kv_blocks=1000,
        total_kv_blocks=1000,
    )


def _request(**fields: object) -> AdmissionRequest:
    base: dict[str, object] = {"tenant": "acme", "prompt_tokens": 50, "p95_output_tokens": 50}
    base.update(fields)
    return AdmissionRequest(**base)  # type: ignore[arg-type]


def test_a_queue_full_shed_carries_a_ticket_that_lets_the_retry_in_front() -> None:
    queues = _full_queues()
    policy = AdmissionPolicy()
    shed = policy.decide(NOW, _request(), _load(queues, NOW))
    assert isinstance(shed, Shed) and shed.reason is ShedReason.QUEUE_FULL
    assert shed.ticket is not None and shed.retry_after_s is not None
    assert policy.tickets_issued == 1 and policy.tickets_outstanding == 1
    # The queue is still full when the client returns, obeying Retry-After: let in.
    back = NOW + shed.retry_after_s
    again = policy.decide(back, _request(ticket=shed.ticket), _load(queues, back))
    assert isinstance(again, Enqueue) and again.front
    assert queues.push(back, "retry", band="interactive", tenant="acme", cost_tokens=100,
                       front=True) is None  # fmt: skip
    queues.check_invariants()
    # It is served before the requests that were waiting in its tenant's line.
    got = queues.try_pop(back, total_slots=8, running=dict.fromkeys(BANDS, 0))
    assert got is not None and got.item == "retry"
    # A ticket is used once.
    third = policy.decide(back, _request(ticket=shed.ticket), _load(queues, back))
    assert isinstance(third, Shed) and policy.tickets_honoured == 1


def test_a_ticket_is_not_valid_before_its_retry_after_nor_after_its_grace() -> None:
    queues = _full_queues()
    policy = AdmissionPolicy(AdmissionConfig(ticket_grace_s=5.0))
    shed = policy.decide(NOW, _request(), _load(queues, NOW))
    assert isinstance(shed, Shed) and shed.ticket is not None and shed.retry_after_s
    early = NOW + shed.retry_after_s / 2
    assert isinstance(
        policy.decide(early, _request(ticket=shed.ticket), _load(queues, early)), Shed
    )
    late = NOW + shed.retry_after_s + 5.5
    refused = policy.decide(late, _request(ticket=shed.ticket), _load(queues, late))
    assert isinstance(refused, Shed) and policy.tickets_honoured == 0


def test_no_ticket_where_no_retry_can_help_or_tickets_are_off() -> None:
    queues = _full_queues()
    policy = AdmissionPolicy()
    fixed = policy.decide(NOW, _request(deadline_s=NOW - 1.0), _load(queues, NOW))
    assert isinstance(fixed, Shed) and fixed.retry_after_s is None and fixed.ticket is None
    off = AdmissionPolicy(AdmissionConfig(retry_tickets=False))
    shed = off.decide(NOW, _request(), _load(queues, NOW))
    assert isinstance(shed, Shed) and shed.retry_after_s is not None and shed.ticket is None


def test_a_ticket_does_not_lift_a_tenant_budget() -> None:
    queues = _full_queues()
    policy = AdmissionPolicy(
        AdmissionConfig(tenants={"acme": TenantLimits(token_rate_per_s=1.0, burst_s=100.0)})
    )
    shed = policy.decide(NOW, _request(), _load(queues, NOW))
    assert isinstance(shed, Shed) and shed.reason is ShedReason.QUEUE_FULL and shed.ticket
    # The retry asks for more tokens than acme's budget holds: the ticket does not help.
    big = _request(prompt_tokens=140, p95_output_tokens=10, ticket=shed.ticket)
    back = NOW + (shed.retry_after_s or 0.0)
    refused = policy.decide(back, big, _load(queues, back))
    assert isinstance(refused, Shed) and refused.reason is ShedReason.TENANT_TOKEN_RATE
    assert policy.tickets_honoured == 0


def _open_load() -> LoadSnapshot:
    queues: PriorityQueues[str] = PriorityQueues()
    return LoadSnapshot(
        queues=queues.statistics(NOW),
        free_slots=dict.fromkeys(BANDS, 4),
        free_kv_blocks=1000,
        total_kv_blocks=1000,
    )


def test_a_budget_shed_carries_a_ticket_that_reserves_its_tokens_for_the_retry() -> None:
    # 10 tokens/s, a bucket of 200; each request costs 100 tokens.
    limits = TenantLimits(token_rate_per_s=10.0, burst_s=20.0)
    policy = AdmissionPolicy(AdmissionConfig(tenants={"acme": limits}))
    load = _open_load()
    for _ in range(2):
        assert not isinstance(policy.decide(NOW, _request(), load), Shed)  # empty now
    first = policy.decide(NOW, _request(), load)
    assert isinstance(first, Shed) and first.reason is ShedReason.TENANT_TOKEN_RATE
    assert first.ticket is not None and first.retry_after_s == 10.0
    # A second shed is told to come back after the first ticket's tokens have refilled.
    second = policy.decide(NOW, _request(), load)
    assert isinstance(second, Shed) and second.ticket is not None
    assert second.retry_after_s == 20.0
    # A third would need more than the bucket holds promised at once: no ticket, and no
    # time named either (the refill up to any time is promised or goes to fresh requests
    # first): the client backs off on its own.
    third = policy.decide(NOW, _request(), load)
    assert isinstance(third, Shed) and third.ticket is None and third.retry_after_s is None
    assert third.client_backoff and "every turn its budget can promise is taken" in third.detail
    # At 10 s a request with another ticket finds the tokens reserved for the holder...
    back = NOW + 10.0
    assert isinstance(policy.decide(back, _request(ticket=999), load), Shed)
    assert not isinstance(policy.decide(back, _request(ticket=first.ticket), load), Shed)
    assert policy.tokens_available(back, "acme") == 0.0
    # ... and so at 20 s: the second ticket's retry passes, and the bucket never goes
    # below zero.
    later = NOW + 20.0
    assert isinstance(policy.decide(later, _request(ticket=999), load), Shed)
    assert not isinstance(policy.decide(later, _request(ticket=second.ticket), load), Shed)
    assert policy.tokens_available(later, "acme") == 0.0
    assert policy.tickets_honoured == 2
    # The request refused at 20 s got a ticket: its 100 tokens come before the next.
    refused = policy.decide(later + 5.0, _request(ticket=999), load)
    assert isinstance(refused, Shed) and refused.retry_after_s == 15.0


def test_a_retry_without_its_budget_ticket_redeems_its_tenants_ticket() -> None:
    # A plain client obeys Retry-After but does not echo the ticket header.
    limits = TenantLimits(token_rate_per_s=10.0, burst_s=10.0)
    policy = AdmissionPolicy(AdmissionConfig(tenants={"acme": limits}))
    load = _open_load()
    assert not isinstance(policy.decide(NOW, _request(), load), Shed)
    shed = policy.decide(NOW, _request(), load)
    assert isinstance(shed, Shed) and shed.ticket is not None and shed.retry_after_s == 10.0
    assert not isinstance(policy.decide(NOW + 10.0, _request(), load), Shed)
    assert policy.tickets_honoured == 1 and policy.tickets_outstanding == 0
