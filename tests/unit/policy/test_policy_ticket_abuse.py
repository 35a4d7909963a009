"""Retry tickets under abuse: a ticket is bound to the request it was issued for, and no
sequence of requests, tickets and retries takes a tenant past its token budget."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

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
RATE = 400.0
BURST_S = 10.0
BURST = RATE * BURST_S  # a 4,000-token bucket, as in issue 15


def _open_load() -> LoadSnapshot:
    queues: PriorityQueues[str] = PriorityQueues()
    return LoadSnapshot(
        queues=queues.statistics(NOW),
        free_slots=dict.fromkeys(BANDS, 64),
        free_kv_blocks=1_000_000,
        total_kv_blocks=1_000_000,
    )


def _budgeted() -> AdmissionPolicy:
    limits = TenantLimits(token_rate_per_s=RATE, burst_s=BURST_S)
    return AdmissionPolicy(AdmissionConfig(tenants={"acme": limits, "evil": limits}))


def _request(tokens: int, *, tenant: str = "acme", ticket: int | None = None) -> AdmissionRequest:
    return AdmissionRequest(
        tenant=tenant, prompt_tokens=tokens, p95_output_tokens=0, max_tokens=0, ticket=ticket
    )


def test_a_budget_ticket_lets_in_at_most_the_tokens_it_was_issued_for() -> None:
    policy, load = _budgeted(), _open_load()
    assert not isinstance(policy.decide(NOW, _request(3000), load), Shed)
    shed = policy.decide(NOW, _request(3000), load)
    assert isinstance(shed, Shed) and shed.reason is ShedReason.TENANT_TOKEN_RATE
    assert shed.ticket is not None and shed.retry_after_s is not None
    back = NOW + shed.retry_after_s
    # The retry grew to 3,900 tokens: the ticket does not cover it, so it is judged as a
    # fresh request (refused: 3,000 tokens have refilled), and nothing is taken on credit.
    bigger = policy.decide(back, _request(3900, ticket=shed.ticket), load)
    assert isinstance(bigger, Shed) and bigger.reason is ShedReason.TENANT_TOKEN_RATE
    assert policy.tokens_available(back, "acme") == 3000.0
    assert policy.tickets_honoured == 0
    # A ticket of another tenant does nothing for it either.
    assert not isinstance(policy.decide(NOW, _request(3000, tenant="evil"), load), Shed)
    theirs = policy.decide(NOW, _request(3000, tenant="evil"), load)
    assert isinstance(theirs, Shed) and theirs.ticket is not None
    assert isinstance(policy.decide(back, _request(3900, ticket=theirs.ticket), load), Shed)


def test_tickets_of_small_requests_do_not_admit_large_ones() -> None:
    # Issue 15: three tickets of 3,000-token requests let three 20,000-token requests in
    # against a 4,000-token bucket (the bucket went to -50,890).
    policy, load = _budgeted(), _open_load()
    assert not isinstance(policy.decide(NOW, _request(3000), load), Shed)
    sheds = []
    for _ in range(3):
        shed = policy.decide(NOW, _request(3000), load)
        assert isinstance(shed, Shed) and shed.reason is ShedReason.TENANT_TOKEN_RATE
        sheds.append(shed)
    # One ticket fits the bucket; the refusals after it name no time (no turn is left).
    assert [s.ticket is not None for s in sheds] == [True, False, False]
    assert all(s.client_backoff and s.retry_after_s is None for s in sheds[1:])
    shed = sheds[0]
    back = NOW + (shed.retry_after_s or 0.0)
    huge = policy.decide(back, _request(20_000, ticket=shed.ticket), load)
    assert isinstance(huge, Shed) and huge.retry_after_s is None  # it can never fit
    assert not huge.client_backoff
    level = policy.tokens_available(back, "acme")
    assert level is not None and level >= 0.0


def test_a_request_larger_than_the_whole_bucket_is_refused_as_impossible() -> None:
    policy, load = _budgeted(), _open_load()
    huge = AdmissionRequest(
        tenant="acme", prompt_tokens=120, p95_output_tokens=256, max_tokens=100_000
    )
    shed = policy.decide(NOW, huge, load)
    assert isinstance(shed, Shed) and shed.reason is ShedReason.TENANT_TOKEN_RATE
    assert shed.retry_after_s is None and shed.ticket is None
    assert "max_tokens=100000" in shed.detail and "4000 tokens" in shed.detail
    assert "lower max_tokens" in shed.detail
    assert policy.tokens_available(NOW, "acme") == BURST


def _full_band(bound: int) -> PriorityQueues[str]:
    queues: PriorityQueues[str] = PriorityQueues(
        QueueConfig(interactive=BandConfig(max_queued_requests=bound), max_queued_per_tenant=64)
    )
    running = dict.fromkeys(BANDS, 0)
    for i in range(bound):
        queues.push(NOW - 10 + i, f"old{i}", band="interactive", tenant="other", cost_tokens=10)
    assert queues.try_pop(NOW - 2, total_slots=8, running=running) is not None  # 1/s drain
    queues.push(NOW - 1, "last", band="interactive", tenant="other", cost_tokens=10)
    assert queues.statistics(NOW).bands["interactive"].full
    return queues


def _load(queues: PriorityQueues[str], now: float) -> LoadSnapshot:
    return LoadSnapshot(
        queues=queues.statistics(now),
        free_slots=dict.fromkeys(BANDS, 0),
        free_kv_blocks=1000,
        total_kv_blocks=1000,
    )


def test_queue_tickets_redeemed_in_bulk_fill_a_queue_to_twice_its_bound_no_more() -> None:
    bound = 3
    queues = _full_band(bound)
    # Tickets are promised places one drain apart, so to hold many valid at once an
    # attacker needs a long horizon and a long grace: give it both.
    policy = AdmissionPolicy(AdmissionConfig(max_retry_after_s=600.0, ticket_grace_s=1000.0))
    sheds = [policy.decide(NOW, _request(50), _load(queues, NOW)) for _ in range(10)]
    assert all(isinstance(s, Shed) and s.reason is ShedReason.QUEUE_FULL for s in sheds)
    tickets = [s.ticket for s in sheds if isinstance(s, Shed) and s.ticket is not None]
    assert len(tickets) == 10
    back = NOW + max(s.retry_after_s or 0.0 for s in sheds if isinstance(s, Shed))
    queued = 0
    for ticket in tickets:
        request = _request(50, ticket=ticket)
        decision = policy.decide(back, request, _load(queues, back))
        if isinstance(decision, Enqueue):
            assert decision.front
            assert policy.enqueue(back, queues, f"t{ticket}", request, decision) is None
            queued += 1
        else:
            assert decision.reason is ShedReason.QUEUE_FULL and "twice" in decision.detail
    assert queued == bound  # the queue held `bound`: as many again came in at the front
    assert queues.statistics(back).bands["interactive"].queued_requests == 2 * bound
    # The queue itself refuses a front push beyond twice its bound, whoever calls.
    refused = queues.push(back, "x", band="interactive", tenant="acme", cost_tokens=1, front=True)
    assert isinstance(refused, Shed) and refused.reason is ShedReason.QUEUE_FULL


def test_a_queue_ticket_is_bound_to_its_size_and_band() -> None:
    queues = _full_band(2)
    policy = AdmissionPolicy()
    shed = policy.decide(NOW, _request(50), _load(queues, NOW))
    assert isinstance(shed, Shed) and shed.ticket is not None and shed.retry_after_s is not None
    back = NOW + shed.retry_after_s
    bigger = policy.decide(back, _request(51, ticket=shed.ticket), _load(queues, back))
    assert isinstance(bigger, Shed) and bigger.reason is ShedReason.QUEUE_FULL
    assert policy.tickets_honoured == 0 and shed.ticket not in (bigger.ticket,)
    # The ticket was dropped: presenting it again with the right size does nothing.
    again = policy.decide(back, _request(50, ticket=shed.ticket), _load(queues, back))
    assert isinstance(again, Shed)


_STEP = st.tuples(
    st.floats(min_value=0.0, max_value=8.0),  # seconds since the previous request
    st.integers(min_value=1, max_value=int(BURST * 1.3)),  # its tokens
    st.sampled_from(["none", "last", "any", "bogus"]),  # which ticket it presents
    st.integers(min_value=0, max_value=1_000),
)


@given(st.lists(_STEP, min_size=1, max_size=60))
def test_no_sequence_of_requests_and_tickets_takes_a_tenant_past_its_budget(
    steps: list[tuple[float, int, str, int]],
) -> None:
    """Over every window, the tokens admitted are at most burst + rate x window."""
    policy, load = _budgeted(), _open_load()
    now = NOW
    issued: list[int] = []
    admitted: list[tuple[float, int]] = []
    for dt, tokens, which, pick in steps:
        now += dt
        ticket = None
        if which == "last" and issued:
            ticket = issued[-1]
        elif which == "any" and issued:
            ticket = issued[pick % len(issued)]
        elif which == "bogus":
            ticket = 10_000 + pick
        decision = policy.decide(now, _request(tokens, ticket=ticket), load)
        if isinstance(decision, Shed):
            if decision.ticket is not None:
                issued.append(decision.ticket)
        else:
            admitted.append((now, tokens))
        level = policy.tokens_available(now, "acme")
        assert level is not None and level >= -1e-6, f"the bucket went to {level}"
    for i, (start, _) in enumerate(admitted):
        total = 0
        for end, tokens in admitted[i:]:
            total += tokens
            assert total <= BURST + RATE * (end - start) + 1e-6
