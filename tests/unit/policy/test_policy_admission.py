"""Admission: every shed reason, retry_after from state, the order of checks, the buckets."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from headway.core.policy.admission import (
    AdmissionConfig,
    AdmissionPolicy,
    AdmissionRequest,
    LoadSnapshot,
    TenantLimits,
    TenantLoad,
)
from headway.core.policy.decisions import Admit, Enqueue, Shed, ShedReason
from headway.core.policy.queues import (
    BANDS,
    BandConfig,
    PriorityQueues,
    QueueConfig,
    QueuesStatistics,
    QueueStatistics,
)

NOW = 100.0


def _queue(
    queued: int = 0,
    tokens: int | None = None,
    bound: int = 100,
    drain_per_s: float = 0.0,
    drain_tokens_per_s: float = 0.0,
) -> QueueStatistics:
    return QueueStatistics(
        queued_requests=queued,
        queued_tokens=queued * 1000 if tokens is None else tokens,
        max_queued_requests=bound,
        drain_requests_per_s=drain_per_s,
        drain_tokens_per_s=drain_tokens_per_s,
        oldest_wait_s=0.0,
    )


def _snapshot(
    bands: dict[str, QueueStatistics] | None = None,
    tenant_queues: dict[str, QueueStatistics] | None = None,
    **fields: object,
) -> LoadSnapshot:
    all_bands = {b: _queue() for b in BANDS}
    all_bands.update(bands or {})
    queues = QueuesStatistics(
        bands=all_bands,  # type: ignore[arg-type]
        tenants=tenant_queues or {},
        pushed=0,
        rejected=0,
        dispatched=0,
        expired=0,
    )
    base: dict[str, object] = {
        "queues": queues,
        "free_slots": dict.fromkeys(BANDS, 4),
        "free_kv_blocks": 1000,
        "total_kv_blocks": 1000,
        "prefill_tokens_per_s": 10_000.0,
        "tpot_s": 0.02,
    }
    base.update(fields)
    return LoadSnapshot(**base)  # type: ignore[arg-type]


def _request(**fields: object) -> AdmissionRequest:
    base: dict[str, object] = {"tenant": "acme", "prompt_tokens": 1000, "p95_output_tokens": 200}
    base.update(fields)
    return AdmissionRequest(**base)  # type: ignore[arg-type]


def _shed(decision: object, reason: ShedReason) -> Shed:
    assert isinstance(decision, Shed), decision
    assert decision.reason is reason, decision
    return decision


# -------------------------------------------------------------------------- the happy paths


def test_admit_when_a_slot_is_free_nothing_waits_and_blocks_fit() -> None:
    assert AdmissionPolicy().decide(NOW, _request(), _snapshot()) == Admit()


def test_enqueue_when_no_slot_is_free() -> None:
    decision = AdmissionPolicy().decide(NOW, _request(), _snapshot(free_slots={}))
    assert isinstance(decision, Enqueue)
    assert decision.queue == "interactive"


def test_enqueue_behind_a_higher_band_that_waits_even_with_a_free_slot() -> None:
    snap = _snapshot({"critical": _queue(queued=1, drain_tokens_per_s=1e6)})
    assert isinstance(AdmissionPolicy().decide(NOW, _request(), snap), Enqueue)
    # a lower band waiting does not hold an interactive request back
    snap = _snapshot({"background": _queue(queued=5)})
    assert AdmissionPolicy().decide(NOW, _request(), snap) == Admit()


def test_enqueue_when_blocks_do_not_fit_now_but_the_queue_has_room() -> None:
    # 1200 tokens -> 75 blocks; 70 free - ceil(0.05 * 1000) = 20 usable
    snap = _snapshot(free_kv_blocks=70)
    decision = AdmissionPolicy().decide(NOW, _request(), snap)
    assert isinstance(decision, Enqueue)
    assert AdmissionPolicy().decide(NOW, _request(), _snapshot(free_kv_blocks=125)) == Admit()


def test_projection_uses_p95_output_only_without_max_tokens() -> None:
    policy = AdmissionPolicy(AdmissionConfig(block_size=16))
    assert policy.projected_kv_blocks(_request(prompt_tokens=1000, p95_output_tokens=200)) == 75
    assert policy.projected_kv_blocks(_request(prompt_tokens=1000, max_tokens=9)) == 64
    assert policy.projected_kv_blocks(_request(prompt_tokens=1008, max_tokens=0)) == 63


# -------------------------------------------------------------------------- each shed reason


def test_queue_full_retry_after_is_queue_length_over_drain_rate() -> None:
    snap = _snapshot({"interactive": _queue(queued=10, bound=10, drain_per_s=4.0)}, free_slots={})
    shed = _shed(AdmissionPolicy().decide(NOW, _request(), snap), ShedReason.QUEUE_FULL)
    assert shed.retry_after_s == pytest.approx(10 / 4.0)


def test_tenant_queue_full_uses_the_tenant_drain_rate() -> None:
    snap = _snapshot(
        tenant_queues={"acme": _queue(queued=6, bound=6, drain_per_s=1.5)}, free_slots={}
    )
    shed = _shed(AdmissionPolicy().decide(NOW, _request(), snap), ShedReason.QUEUE_FULL)
    assert shed.retry_after_s == pytest.approx(6 / 1.5)
    assert "acme" in shed.detail


def test_retry_after_is_capped_when_nothing_has_drained() -> None:
    config = AdmissionConfig(max_retry_after_s=42.0)
    snap = _snapshot({"interactive": _queue(queued=10, bound=10)}, free_slots={})
    shed = _shed(AdmissionPolicy(config).decide(NOW, _request(), snap), ShedReason.QUEUE_FULL)
    assert shed.retry_after_s == 42.0


def test_kv_projection_when_blocks_do_not_fit_and_the_queue_is_full() -> None:
    snap = _snapshot(
        {"interactive": _queue(queued=8, bound=8, drain_per_s=2.0)},
        free_kv_blocks=60,
    )
    shed = _shed(AdmissionPolicy().decide(NOW, _request(), snap), ShedReason.KV_PROJECTION)
    assert shed.retry_after_s == pytest.approx(4.0)


def test_too_large_for_any_replica_is_never_retryable() -> None:
    # 95 usable blocks of 100 (5% reserve): 95 * 16 = 1520 tokens fit, 1521 do not
    snap = _snapshot(free_kv_blocks=100, total_kv_blocks=100)
    policy = AdmissionPolicy()
    assert policy.decide(NOW, _request(prompt_tokens=1520, max_tokens=0), snap) == Admit()
    shed = _shed(
        policy.decide(NOW, _request(prompt_tokens=1521, max_tokens=0), snap), ShedReason.TOO_LARGE
    )
    assert shed.retry_after_s is None


def test_deadline_without_slack_is_shed_with_no_retry() -> None:
    # service = 20_000 / 10_000 + 200 * 0.02 = 6 s, 5 s left
    request = _request(prompt_tokens=20_000, deadline_s=NOW + 5.0)
    snap = _snapshot(free_kv_blocks=10_000, total_kv_blocks=10_000)
    shed = _shed(AdmissionPolicy().decide(NOW, request, snap), ShedReason.DEADLINE_UNMEETABLE)
    assert shed.retry_after_s is None
    expired = _request(deadline_s=NOW - 0.001)
    shed = _shed(
        AdmissionPolicy().decide(NOW, expired, _snapshot()), ShedReason.DEADLINE_UNMEETABLE
    )
    assert shed.retry_after_s is None


def test_without_deadline_checks_only_a_passed_deadline_is_shed() -> None:
    policy = AdmissionPolicy(AdmissionConfig(check_deadlines=False))
    snap = _snapshot(free_kv_blocks=10_000, total_kv_blocks=10_000)
    hopeless = _request(prompt_tokens=20_000, deadline_s=NOW + 5.0)
    assert policy.decide(NOW, hopeless, snap) == Admit()
    passed = _request(deadline_s=NOW)
    _shed(policy.decide(NOW, passed, snap), ShedReason.DEADLINE_UNMEETABLE)


def test_deadline_unmeetable_after_the_predicted_wait() -> None:
    # wait = 10_000 tokens / 5_000 per s = 2 s; service = 0.1 + 4 = 4.1 s; 5 s left
    snap = _snapshot(
        {"interactive": _queue(queued=5, tokens=10_000, drain_tokens_per_s=5000.0)},
        free_slots={},
    )
    fixed = _request(deadline_s=NOW + 5.0)
    shed = _shed(AdmissionPolicy().decide(NOW, fixed, snap), ShedReason.DEADLINE_UNMEETABLE)
    assert shed.retry_after_s is None  # a retry spends the same deadline
    renewing = replace(fixed, deadline_renews_on_retry=True)
    shed = _shed(AdmissionPolicy().decide(NOW, renewing, snap), ShedReason.DEADLINE_UNMEETABLE)
    # The excess wait, plus half the slack left beside the service: the retry returns
    # when the wait ahead of it is half what its deadline allows.
    assert shed.retry_after_s == pytest.approx((2.0 + 4.1 - 5.0) + (5.0 - 4.1) / 2)
    roomy = _request(deadline_s=NOW + 6.2)
    decision = AdmissionPolicy().decide(NOW, roomy, snap)
    assert isinstance(decision, Enqueue)
    assert decision.predicted_wait_s == pytest.approx(2.0)


def test_deadline_wait_by_requests_when_configured() -> None:
    snap = _snapshot(
        {"interactive": _queue(queued=6, tokens=1, drain_per_s=2.0, drain_tokens_per_s=1e9)},
        free_slots={},
    )
    request = _request(deadline_s=NOW + 5.0)  # 3 s wait + 4.1 s service by requests
    assert isinstance(AdmissionPolicy().decide(NOW, request, snap), Enqueue)
    by_requests = AdmissionPolicy(AdmissionConfig(wait_basis="requests"))
    _shed(by_requests.decide(NOW, request, snap), ShedReason.DEADLINE_UNMEETABLE)


def test_unknown_wait_does_not_shed_for_the_deadline() -> None:
    snap = _snapshot({"interactive": _queue(queued=50)}, free_slots={})  # nothing drained
    decision = AdmissionPolicy().decide(NOW, _request(deadline_s=NOW + 5), snap)
    assert isinstance(decision, Enqueue)
    assert decision.predicted_wait_s is None  # unknown, not zero


def test_a_snapshot_without_the_request_band_is_a_driver_error() -> None:
    snap = _snapshot()
    bands = {b: s for b, s in snap.queues.bands.items() if b != "background"}
    broken = replace(snap, queues=replace(snap.queues, bands=bands))
    with pytest.raises(ValueError, match="no statistics for band 'background'"):
        AdmissionPolicy().decide(NOW, _request(priority="background"), broken)


def test_draining_retry_after_is_the_replacement_time_or_now() -> None:
    shed = _shed(
        AdmissionPolicy().decide(NOW, _request(), _snapshot(draining=True)), ShedReason.DRAINING
    )
    assert shed.retry_after_s == 0.0
    snap = _snapshot(draining=True, replacement_ready_s=NOW + 30.0)
    shed = _shed(AdmissionPolicy().decide(NOW, _request(), snap), ShedReason.DRAINING)
    assert shed.retry_after_s == pytest.approx(30.0)


def test_downstream_unhealthy_retry_after_is_the_next_probe() -> None:
    snap = _snapshot(downstream_health=0.2, downstream_next_probe_s=NOW + 7.0)
    shed = _shed(AdmissionPolicy().decide(NOW, _request(), snap), ShedReason.DOWNSTREAM_UNHEALTHY)
    assert shed.retry_after_s == pytest.approx(7.0)
    assert AdmissionPolicy().decide(NOW, _request(), _snapshot(downstream_health=0.5)) == Admit()


def test_tenant_concurrency_retry_after_from_its_completion_rate() -> None:
    config = AdmissionConfig(tenants={"acme": TenantLimits(max_concurrency=4)})
    snap = _snapshot(tenants={"acme": TenantLoad(in_flight_requests=5, completions_per_s=2.0)})
    shed = _shed(
        AdmissionPolicy(config).decide(NOW, _request(), snap), ShedReason.TENANT_CONCURRENCY
    )
    assert shed.retry_after_s == pytest.approx((5 - 4 + 1) / 2.0)
    # without a measured rate: the service estimate of a request its size (0.1 + 4 s)
    snap = _snapshot(tenants={"acme": TenantLoad(in_flight_requests=4)})
    shed = _shed(
        AdmissionPolicy(config).decide(NOW, _request(), snap), ShedReason.TENANT_CONCURRENCY
    )
    assert shed.retry_after_s == pytest.approx(4.1)
    other = _request(tenant="other")
    assert AdmissionPolicy(config).decide(NOW, other, snap) == Admit()


def test_tenant_token_rate_retry_after_is_the_refill_time() -> None:
    limits = TenantLimits(token_rate_per_s=100.0, burst_s=10.0)  # a 1000-token bucket
    policy = AdmissionPolicy(AdmissionConfig(tenants={"acme": limits}))
    small = _request(prompt_tokens=400, max_tokens=50)  # 450 tokens
    assert policy.decide(NOW, small, _snapshot()) == Admit()
    assert policy.decide(NOW, small, _snapshot()) == Admit()
    assert policy.tokens_available(NOW, "acme") == pytest.approx(100.0)
    shed = _shed(policy.decide(NOW, small, _snapshot()), ShedReason.TENANT_TOKEN_RATE)
    assert shed.retry_after_s == pytest.approx((450 - 100) / 100.0)
    # a client that waits exactly retry_after finds the tokens
    assert policy.decide(NOW + shed.retry_after_s, small, _snapshot()) == Admit()


def test_a_request_larger_than_the_bucket_is_never_retryable() -> None:
    limits = TenantLimits(token_rate_per_s=10.0, burst_s=10.0)  # 100 tokens
    policy = AdmissionPolicy(AdmissionConfig(tenants={"acme": limits}))
    shed = _shed(policy.decide(NOW, _request(), _snapshot()), ShedReason.TENANT_TOKEN_RATE)
    assert shed.retry_after_s is None
    assert "burst_s" in shed.detail


def test_the_bucket_is_charged_only_for_admitted_or_enqueued_requests() -> None:
    limits = TenantLimits(token_rate_per_s=1.0, burst_s=10_000.0)
    policy = AdmissionPolicy(AdmissionConfig(tenants={"acme": limits}))
    full = _snapshot({"interactive": _queue(queued=3, bound=3, drain_per_s=1.0)}, free_slots={})
    _shed(policy.decide(NOW, _request(), full), ShedReason.QUEUE_FULL)
    assert policy.tokens_available(NOW, "acme") == pytest.approx(10_000.0)
    assert isinstance(policy.decide(NOW, _request(), _snapshot(free_slots={})), Enqueue)
    assert policy.tokens_available(NOW, "acme") == pytest.approx(10_000.0 - 1200)
    policy.refund(NOW, "acme", 200)
    assert policy.tokens_available(NOW, "acme") == pytest.approx(10_000.0 - 1000)
    assert policy.tokens_available(NOW, "nobody") is None


# -------------------------------------------------------------------------- order of checks


def test_order_impossible_first_then_instance_then_tenant_then_queue() -> None:
    limits = TenantLimits(max_concurrency=1)
    policy = AdmissionPolicy(AdmissionConfig(tenants={"acme": limits}))
    everything = _snapshot(
        {"interactive": _queue(queued=1, bound=1, drain_per_s=1.0)},
        free_slots={},
        free_kv_blocks=100,
        total_kv_blocks=100,
        draining=True,
        downstream_health=0.0,
        tenants={"acme": TenantLoad(in_flight_requests=3)},
    )
    too_big = _request(prompt_tokens=5000)
    _shed(policy.decide(NOW, too_big, everything), ShedReason.TOO_LARGE)
    ok_size = _request(prompt_tokens=100, max_tokens=100)
    _shed(
        policy.decide(NOW, replace(ok_size, deadline_s=NOW), everything),
        ShedReason.DEADLINE_UNMEETABLE,
    )
    _shed(policy.decide(NOW, ok_size, everything), ShedReason.DRAINING)
    no_drain = replace(everything, draining=False)
    _shed(policy.decide(NOW, ok_size, no_drain), ShedReason.DOWNSTREAM_UNHEALTHY)
    healthy = replace(no_drain, downstream_health=1.0)
    _shed(policy.decide(NOW, ok_size, healthy), ShedReason.TENANT_CONCURRENCY)
    calm = replace(healthy, tenants={})
    _shed(policy.decide(NOW, ok_size, calm), ShedReason.QUEUE_FULL)


def test_every_shed_carries_a_finite_retry_after_unless_no_retry_helps() -> None:
    cases = [
        _snapshot({"interactive": _queue(queued=3, bound=3, drain_per_s=0.5)}, free_slots={}),
        _snapshot(draining=True),
        _snapshot(downstream_health=0.0),
    ]
    for snap in cases:
        shed = AdmissionPolicy().decide(NOW, _request(), snap)
        assert isinstance(shed, Shed)
        assert shed.retry_after_s is not None
        assert math.isfinite(shed.retry_after_s)


# -------------------------------------------------------------------------- with real queues


def test_a_client_waiting_retry_after_finds_room_in_a_steady_state() -> None:
    """A full queue drained at 10/s; arrivals then fall to 5/s. The shed client's
    retry_after is the measured time for the backlog to drain: by then every request that
    was queued when it was shed has been dispatched, and its retry is accepted."""
    queues = PriorityQueues[int](
        QueueConfig(interactive=BandConfig(max_queued_requests=20), max_queued_per_tenant=1000)
    )
    policy = AdmissionPolicy(AdmissionConfig(retry_tickets=False))  # no promises ahead
    tick_s, t, n = 0.1, 0.0, 0
    dispatched: set[int] = set()
    enqueued: set[int] = set()

    def offer(now: float, item: int) -> object:
        snap = _snapshot(
            dict(queues.statistics(now).bands),
            free_slots={},
        )
        decision = policy.decide(now, _request(), snap)
        if isinstance(decision, Enqueue):
            assert (
                queues.push(now, item, band="interactive", tenant="acme", cost_tokens=1200) is None
            )
            enqueued.add(item)
        return decision

    for step in range(1, 31):  # 20/s offered against a 10/s drain: the queue fills
        t = step * tick_s
        got = queues.try_pop(t, total_slots=10, running={})
        if got is not None:
            dispatched.add(got.item)
        for _ in range(2):
            n += 1
            offer(t, n)
    shed = offer(t, -1)
    backlog = enqueued - dispatched
    assert len(backlog) == 20
    assert isinstance(shed, Shed)
    assert shed.reason is ShedReason.QUEUE_FULL
    assert shed.retry_after_s is not None
    assert shed.retry_after_s == pytest.approx(20 / 10.0, rel=0.1)
    retry_at = t + shed.retry_after_s  # the backlog drains by then: 20 / 10 per s
    step = 30
    while True:
        step += 1
        t = step * tick_s
        if t > retry_at + 1e-9:
            break
        got = queues.try_pop(t, total_slots=10, running={})
        if got is not None:
            dispatched.add(got.item)
        if step % 2 == 0:  # 5/s: below the drain rate
            n += 1
            offer(t, n)
    assert backlog <= dispatched, "retry_after was shorter than the backlog's drain"
    assert not isinstance(offer(retry_at, -1), Shed)


def test_a_work_conserving_budget_lends_idle_capacity_and_binds_under_contention() -> None:
    """Over its bucket, a tenant with a work-conserving budget is admitted while nobody
    else is kept waiting; refused once another tenant's call has waited
    ``contended_after_s``. Full dispatch slots while another tenant runs are not yet
    contention (a burst the engines hold fills them): the call waits its turn."""
    limits = TenantLimits(token_rate_per_s=100.0, burst_s=1.0, work_conserving=True)
    other = TenantLimits(token_rate_per_s=10_000.0, burst_s=1.0, work_conserving=True)
    policy = AdmissionPolicy(AdmissionConfig(tenants={"acme": limits, "initech": other}))
    big = _request(prompt_tokens=1000, p95_output_tokens=200)  # 1,200 > the 100-token bucket
    assert policy.decide(NOW, big, _snapshot()) == Admit()
    assert policy.decide(NOW, big, _snapshot()) == Admit()  # again: idle capacity is lent
    waited = replace(_queue(queued=1), oldest_wait_s=0.6)
    contended = _snapshot(tenant_queues={"initech": waited})
    shed = _shed(policy.decide(NOW, big, contended), ShedReason.TENANT_TOKEN_RATE)
    assert shed.retry_after_s is not None and 0 < shed.retry_after_s <= 1.0
    briefly = _snapshot(tenant_queues={"initech": replace(waited, oldest_wait_s=0.1)})
    assert policy.decide(NOW, big, briefly) == Admit()  # a moment's wait is not contention
    full = _snapshot(free_slots={}, tenants={"initech": TenantLoad(in_flight_requests=3)})
    assert isinstance(policy.decide(NOW, big, full), Enqueue)
    full_and_waiting = _snapshot(
        free_slots={},
        tenants={"initech": TenantLoad(in_flight_requests=3)},
        tenant_queues={"initech": waited},
    )
    _shed(policy.decide(NOW, big, full_and_waiting), ShedReason.TENANT_TOKEN_RATE)
    no_kv = _snapshot(free_kv_blocks=0, tenants={"initech": TenantLoad(in_flight_requests=3)})
    _shed(policy.decide(NOW, big, no_kv), ShedReason.TENANT_TOKEN_RATE)  # memory others use
    alone = _snapshot(free_slots={})
    assert isinstance(policy.decide(NOW, big, alone), Enqueue)  # nobody to protect: it waits
    hard = AdmissionPolicy(AdmissionConfig(tenants={"acme": TenantLimits(
        token_rate_per_s=100.0, burst_s=1.0)}))  # fmt: skip
    _shed(hard.decide(NOW, big, _snapshot()), ShedReason.TENANT_TOKEN_RATE)  # never passes


def test_a_refusal_for_load_is_contention_for_a_work_conserving_budget() -> None:
    """A call refused as late (at the speeds the engines now run at, or behind the queue)
    or for a full queue shows that no capacity is idle: for ``contended_after_s`` after
    it, a tenant over its own bucket is not lent the pool, whoever was refused. A
    deadline already past at arrival says nothing about the load and does not count."""
    acme = TenantLimits(
        token_rate_per_s=100.0, burst_s=1.0, work_conserving=True, contended_after_s=1.5
    )
    initech = TenantLimits(token_rate_per_s=100_000.0, burst_s=1.0, work_conserving=True)
    policy = AdmissionPolicy(AdmissionConfig(tenants={"acme": acme, "initech": initech}))
    big = _request(prompt_tokens=1000, p95_output_tokens=200)  # 1,200 > the 100-token bucket
    assert policy.decide(NOW, big, _snapshot()) == Admit()  # idle capacity is lent
    expired = replace(big, tenant="initech", deadline_s=NOW - 1.0)
    _shed(policy.decide(NOW, expired, _snapshot()), ShedReason.DEADLINE_UNMEETABLE)
    assert policy.decide(NOW, big, _snapshot()) == Admit()  # a client's past deadline
    late = replace(big, tenant="initech", deadline_s=NOW + 2.0)  # service needs 4.1 s
    _shed(policy.decide(NOW, late, _snapshot()), ShedReason.DEADLINE_UNMEETABLE)
    _shed(policy.decide(NOW + 1.0, big, _snapshot()), ShedReason.TENANT_TOKEN_RATE)
    assert policy.decide(NOW + 1.6, big, _snapshot()) == Admit()  # lent again
    full = _snapshot(bands={"interactive": _queue(queued=5, bound=5)}, free_slots={})
    _shed(policy.decide(NOW + 2.0, replace(big, tenant="initech"), full), ShedReason.QUEUE_FULL)
    _shed(policy.decide(NOW + 2.5, big, _snapshot()), ShedReason.TENANT_TOKEN_RATE)


def test_a_work_conserving_budget_borrows_only_the_capacity_the_others_leave() -> None:
    """The budgets' pool (their rates summed, the capacity their shares split) lends a
    tenant over its own bucket only what it holds: a flood drains it within its burst
    and then meets its own budget though nobody waits yet, while a tenant within its
    share still passes on its own bucket; the pool refills at the capacity's rate."""
    acme = TenantLimits(token_rate_per_s=100.0, burst_s=1.0, work_conserving=True)
    initech = TenantLimits(token_rate_per_s=2_400.0, burst_s=1.0, work_conserving=True)
    policy = AdmissionPolicy(AdmissionConfig(tenants={"acme": acme, "initech": initech}))
    big = _request(prompt_tokens=1000, p95_output_tokens=200)  # 1,200 tokens
    assert policy.decide(NOW, big, _snapshot()) == Admit()  # the pool: 2,400 -> 1,200
    assert policy.decide(NOW, big, _snapshot()) == Admit()  # -> 0
    shed = _shed(policy.decide(NOW, big, _snapshot()), ShedReason.TENANT_TOKEN_RATE)
    assert shed.retry_after_s is not None and shed.retry_after_s > 0
    mine = replace(big, tenant="initech")
    assert policy.decide(NOW, mine, _snapshot()) == Admit()  # its own share: never lent away
    assert policy.decide(NOW + 1.0, big, _snapshot()) == Admit()  # refilled by 2,500


def test_the_budgets_pool_holds_the_largest_burst_not_their_sum() -> None:
    """Unused capacity does not keep: a tenant over its own bucket may borrow at once at
    most the largest tenant's burst (the least tc-htb(8) allows a parent class), not every
    tenant's stored burst together. With their sum, a flood put ten seconds of the
    cluster's work into the engines at its start, and the light tenants' TTFT p99 was
    set by those seconds (issue 17)."""
    limits = TenantLimits(token_rate_per_s=1_000.0, burst_s=1.0, work_conserving=True)
    policy = AdmissionPolicy(AdmissionConfig(tenants=dict.fromkeys(("a", "b", "c"), limits)))
    half = _request(prompt_tokens=300, p95_output_tokens=200)  # 500 tokens
    flood = replace(half, tenant="a")
    assert policy.decide(NOW, flood, _snapshot()) == Admit()  # its own bucket: 1,000 -> 500
    assert policy.decide(NOW, flood, _snapshot()) == Admit()  # -> 0; the pool: 1,000 -> 0
    # The sum of the bursts (3,000) would lend it 2,000 more now; the largest burst is spent.
    _shed(policy.decide(NOW, flood, _snapshot()), ShedReason.TENANT_TOKEN_RATE)
    assert policy.decide(NOW, replace(half, tenant="b"), _snapshot()) == Admit()  # its own
    # The pool (-500 after b's call) refills at the capacity's rate, 3,000/s: at 0.4 s
    # it holds 700 and lends a what its own bucket (400) lacks.
    assert policy.decide(NOW + 0.4, flood, _snapshot()) == Admit()


def test_the_budgets_pool_is_charged_with_the_work_of_tenants_without_a_budget() -> None:
    """The pool is the capacity of the whole cluster, so what tenants without a budget
    are admitted (a backfill, an operations tenant) takes from it as well: it is not
    idle capacity to lend. Charged only with the budgeted tenants' work, the pool lent
    a flood the capacity a backfill was using, and at the knee the light tenants' TTFT
    p99 more than doubled (issue 17). Refunds go back to it likewise."""
    acme = TenantLimits(token_rate_per_s=100.0, burst_s=1.0, work_conserving=True)
    initech = TenantLimits(token_rate_per_s=2_400.0, burst_s=1.0, work_conserving=True)
    policy = AdmissionPolicy(AdmissionConfig(tenants={"acme": acme, "initech": initech}))
    big = _request(prompt_tokens=1000, p95_output_tokens=200)  # 1,200 tokens
    backfill = replace(big, tenant="ingest")  # no budget: always admitted on its own
    assert policy.decide(NOW, backfill, _snapshot()) == Admit()  # the pool: 2,400 -> 1,200
    assert policy.decide(NOW, backfill, _snapshot()) == Admit()  # -> 0
    _shed(policy.decide(NOW, big, _snapshot()), ShedReason.TENANT_TOKEN_RATE)  # nothing idle
    policy.refund(NOW, "ingest", 1_200)  # a shorter answer than planned
    assert policy.decide(NOW, big, _snapshot()) == Admit()  # lent what came back


def test_the_budgets_pool_takes_refunds_and_keeps_its_level_across_a_reload() -> None:
    """Tokens charged but not used (a shorter answer, an expiry) go back to the pool as to
    the tenant's bucket, so they can be lent again; a reload keeps what the pool held (no
    fresh burst to borrow from)."""
    acme = TenantLimits(token_rate_per_s=100.0, burst_s=1.0, work_conserving=True)
    initech = TenantLimits(token_rate_per_s=2_400.0, burst_s=1.0, work_conserving=True)
    config = AdmissionConfig(tenants={"acme": acme, "initech": initech})
    policy = AdmissionPolicy(config)
    big = _request(prompt_tokens=1000, p95_output_tokens=200)  # 1,200 tokens
    assert policy.decide(NOW, big, _snapshot()) == Admit()
    assert policy.decide(NOW, big, _snapshot()) == Admit()  # the pool is empty now
    policy.reconfigure(NOW, config)
    _shed(policy.decide(NOW, big, _snapshot()), ShedReason.TENANT_TOKEN_RATE)
    policy.refund(NOW, "acme", 1_200)
    assert policy.decide(NOW, big, _snapshot()) == Admit()  # lent again


def test_a_shed_that_names_no_time_is_a_budgets_without_a_time_or_a_ticket() -> None:
    assert Shed(ShedReason.TENANT_TOKEN_RATE, None, client_backoff=True).client_backoff
    with pytest.raises(ValueError, match="retry_after_s must be None"):
        Shed(ShedReason.TENANT_TOKEN_RATE, 2.0, client_backoff=True)
    with pytest.raises(ValueError, match="got queue_full"):
        Shed(ShedReason.QUEUE_FULL, None, client_backoff=True)
    with pytest.raises(ValueError, match="carries no ticket"):
        Shed(ShedReason.TENANT_TOKEN_RATE, None, ticket=7, client_backoff=True)


def test_a_work_conserving_request_larger_than_the_pool_can_never_pass() -> None:
    """A work-conserving budget lends a request over its own bucket only from the pool,
    whose level never passes its capacity (the largest burst): one larger than that is
    refused as never fitting (no Retry-After, a 400 at the gateway), not sent back to
    retry forever."""
    acme = TenantLimits(token_rate_per_s=100.0, burst_s=1.0, work_conserving=True)
    initech = TenantLimits(token_rate_per_s=2_000.0, burst_s=1.0, work_conserving=True)
    policy = AdmissionPolicy(AdmissionConfig(tenants={"acme": acme, "initech": initech}))
    fits = _request(prompt_tokens=1500, p95_output_tokens=400)  # 1,900: the pool holds it
    assert policy.decide(NOW, fits, _snapshot()) == Admit()
    huge = _request(prompt_tokens=1800, p95_output_tokens=400)  # 2,200 > the pool's 2,000
    shed = _shed(policy.decide(NOW + 60.0, huge, _snapshot()), ShedReason.TENANT_TOKEN_RATE)
    assert shed.retry_after_s is None and not shed.client_backoff and shed.ticket is None
    assert "2000 tokens" in shed.detail and "lower max_tokens" in shed.detail


def test_a_budget_refusal_past_the_promise_horizon_keeps_its_capped_time() -> None:
    """Turns left in the bucket but further off than ``promise_horizon_s``: the capped
    Retry-After without a ticket (as for a queue), not the no-time answer that is kept
    for a tenant whose every turn is promised."""
    limits = TenantLimits(token_rate_per_s=10.0, burst_s=100.0)  # 1,000 tokens, 100 s
    config = AdmissionConfig(tenants={"acme": limits}, promise_horizon_s=5.0)
    policy = AdmissionPolicy(config)
    request = _request(prompt_tokens=300, p95_output_tokens=200)  # 500 tokens
    assert policy.decide(NOW, request, _snapshot()) == Admit()
    assert policy.decide(NOW, request, _snapshot()) == Admit()  # the bucket is empty
    shed = _shed(policy.decide(NOW, request, _snapshot()), ShedReason.TENANT_TOKEN_RATE)
    assert shed.ticket is None and not shed.client_backoff
    assert shed.retry_after_s == pytest.approx(50.0)  # the refill time, a hint
