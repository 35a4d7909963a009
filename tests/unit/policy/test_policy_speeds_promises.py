"""Service speeds (a prior refined by whole and streamed answers), Retry-After before any
drain is measured, queue tickets that are never oversold, and the default critical
reserve of small pools (issue 15 defect 5, issue 14 defect 6)."""

from __future__ import annotations

import math

import pytest

from headway.core.engine.steptime import AffineStepTime
from headway.core.policy.admission import (
    AdmissionConfig,
    AdmissionPolicy,
    AdmissionRequest,
    LoadSnapshot,
)
from headway.core.policy.decisions import Enqueue, Shed, ShedReason
from headway.core.policy.queues import BANDS, PriorityQueues, QueueConfig
from headway.core.policy.speeds import ServiceSpeeds, SpeedPrior, prior_from_step_time

NOW = 50.0


def _request(**fields: object) -> AdmissionRequest:
    base: dict[str, object] = {"tenant": "acme", "prompt_tokens": 100, "p95_output_tokens": 100}
    base.update(fields)
    return AdmissionRequest(**base)  # type: ignore[arg-type]


def _snapshot(queues: PriorityQueues[int], now: float, **fields: object) -> LoadSnapshot:
    base: dict[str, object] = {
        "queues": queues.statistics(now),
        "free_slots": {},
        "free_kv_blocks": 10_000,
        "total_kv_blocks": 10_000,
        "prefill_tokens_per_s": math.inf,
        "tpot_s": 0.01,  # 100 output tokens: 1 s of service
        "dispatch_slots": 4,
    }
    base.update(fields)
    return LoadSnapshot(**base)  # type: ignore[arg-type]


def _full_queue(bound: int = 8) -> PriorityQueues[int]:
    config = QueueConfig(max_queued_per_tenant=bound)
    queues = PriorityQueues[int](config)
    for i in range(bound):
        assert queues.push(NOW, i, band="interactive", tenant="acme", cost_tokens=200) is None
    return queues


def test_whole_answers_scale_both_speeds_and_streams_separate_them() -> None:
    speeds = ServiceSpeeds(SpeedPrior(tpot_s=0.01, prefill_tokens_per_s=1000.0), weight=1.0)
    assert speeds.service_s(1000, 100) == pytest.approx(2.0)
    speeds.observe_whole(1000, 100, 4.0)  # twice the prediction: both halve in speed
    assert speeds.tpot_s == pytest.approx(0.02)
    assert speeds.prefill_tokens_per_s == pytest.approx(500.0)
    speeds.observe_stream(1000, 101, 0.25, 1.25)  # 4,000 prompt tokens/s, 10 ms per token
    assert speeds.tpot_s == pytest.approx(0.01)
    assert speeds.prefill_tokens_per_s == pytest.approx(4000.0)
    for bad in (math.nan, -1.0, 0.0):
        speeds.observe_whole(1000, 100, bad)
    assert speeds.samples == 2
    unknown = ServiceSpeeds()
    assert unknown.service_s(10, 10) is None
    unknown.observe_whole(1000, 100, 1.0)  # no split known: all decode
    assert unknown.tpot_s == pytest.approx(0.01)
    assert unknown.prefill_tokens_per_s == math.inf


def test_the_prior_of_a_step_time_model_is_its_full_batch() -> None:
    step = AffineStepTime(overhead_s=0.01, per_prefill_token_s=1e-4, per_prefill_pair_s=0.0,
                          per_decode_seq_s=1e-3, per_decode_kv_token_s=0.0)  # fmt: skip
    prior = prior_from_step_time(step, num_seqs=10, prompt_tokens=500)
    assert prior.tpot_s == pytest.approx(0.01 + 10 * 1e-3)
    assert prior.prefill_tokens_per_s == pytest.approx(500 / (0.01 + 500 * 1e-4 + 9 * 1e-3))
    with pytest.raises(ValueError, match="tpot_s"):
        SpeedPrior(tpot_s=0.0)


def test_retry_after_before_any_drain_is_measured_comes_from_the_service_estimate() -> None:
    """Nothing has drained yet: a full queue's Retry-After was the cap (60 s) though the
    queue drains in 8 requests × 1 s / 4 slots = 2 s (issue 14, defect 6)."""
    queues = _full_queue(8)
    shed = AdmissionPolicy().decide(NOW, _request(), _snapshot(queues, NOW))
    assert isinstance(shed, Shed)
    assert shed.reason is ShedReason.QUEUE_FULL
    assert shed.retry_after_s == pytest.approx(8 * 1.0 / 4)
    assert shed.ticket is not None


def test_a_queue_that_drained_little_still_drains_at_the_slots_pace() -> None:
    """A queue that was mostly empty measured the rate requests reached it (here 1 in 5 s),
    not the rate the slots take them: a full queue's promise is its requests over the
    faster of the two (8 × 1 s / 4 slots = 2 s), not 8 / 0.2 requests/s = 40 s. At 2.5x
    overload the slow measure promised turns of 150-300 s for a backlog of seconds, so
    clients gave up (issue 15, defect 5)."""
    queues = PriorityQueues[int](QueueConfig(max_queued_per_tenant=8))
    assert queues.push(NOW - 5.0, -1, band="interactive", tenant="acme", cost_tokens=200) is None
    assert queues.try_pop(NOW - 5.0, total_slots=4, running={}) is not None
    for i in range(8):
        assert queues.push(NOW, i, band="interactive", tenant="acme", cost_tokens=200) is None
    stats = queues.statistics(NOW).bands["interactive"]
    assert 0 < stats.drain_requests_per_s <= 0.2
    shed = AdmissionPolicy().decide(NOW, _request(), _snapshot(queues, NOW))
    assert isinstance(shed, Shed) and shed.reason is ShedReason.QUEUE_FULL
    assert shed.retry_after_s == pytest.approx(8 * 1.0 / 4)
    # A measured drain faster than the slots' pace (answers quicker than predicted) wins.
    slow = _snapshot(queues, NOW, tpot_s=1.0)  # 100 s of service: 0.04 requests/s
    shed = AdmissionPolicy().decide(NOW, _request(), slow)
    assert isinstance(shed, Shed)
    assert shed.retry_after_s == pytest.approx(8 / stats.drain_requests_per_s)


def test_queue_tickets_are_never_oversold() -> None:
    """Each ticket promises a place: the next shed's Retry-After counts the retries
    already promised (one more second per four), and once the promise would pass
    ``promise_horizon_s`` the shed says to come back at the cap, with no ticket."""
    queues = _full_queue(8)
    policy = AdmissionPolicy(AdmissionConfig(max_retry_after_s=4.0, promise_horizon_s=4.0))
    waits = []
    for k in range(12):
        shed = policy.decide(NOW, _request(), _snapshot(queues, NOW))
        assert isinstance(shed, Shed)
        waits.append(shed.retry_after_s)
        assert (shed.ticket is None) == (k >= 9)
        assert ("no ticket" in shed.detail) == (k >= 9)
    assert waits == pytest.approx([(8 + k) / 4 for k in range(9)] + [4.0, 4.0, 4.0])
    assert policy.tickets_outstanding == 9
    # A promise counts until its Retry-After: a retry back by then waits in the queue,
    # one that never comes back stops holding a place.
    later = NOW + 4.0
    shed = policy.decide(later, _request(), _snapshot(queues, later))
    assert isinstance(shed, Shed)
    assert shed.retry_after_s == pytest.approx(8 / 4)


def test_a_promise_within_the_horizon_is_kept_past_the_retry_after_cap() -> None:
    """A turn 20 s away, past ``max_retry_after_s`` (4 s here; 60 s by default) but
    within ``promise_horizon_s``, is promised with a ticket and its own time: capped at
    4 s without a ticket (as at 3c8fc1a, where the cap was the horizon), its retry came
    back while the promised places were still ahead and was refused (issue 15, defect
    5: a fifth of the refused calls at 2.5x overload for 40 s)."""
    queues = _full_queue(8)
    policy = AdmissionPolicy(AdmissionConfig(max_retry_after_s=4.0, promise_horizon_s=20.0))
    sheds = [policy.decide(NOW, _request(), _snapshot(queues, NOW)) for _ in range(80)]
    assert all(isinstance(shed, Shed) for shed in sheds)
    waits = [shed.retry_after_s for shed in sheds if isinstance(shed, Shed)]
    tickets = [shed.ticket for shed in sheds if isinstance(shed, Shed)]
    promised = [(8 + k) / 4 for k in range(73)]  # turns up to 20 s away
    assert waits == pytest.approx(promised + [4.0] * 7)
    assert all(t is not None for t in tickets[:73]) and not any(tickets[73:])
    # The retry promised 20 s ahead is let in then, at the front of its line.
    later = NOW + promised[-1]
    retry = _request(ticket=tickets[72])
    decision = policy.decide(later, retry, _snapshot(queues, later))
    assert isinstance(decision, Enqueue) and decision.front
    with pytest.raises(ValueError, match="promise_horizon_s"):
        AdmissionConfig(promise_horizon_s=-1.0)


def test_a_deadline_shed_promises_a_retry_that_fits_its_deadline() -> None:
    """A queue whose wait exceeds the deadline: the retry is told to come back when the
    wait ahead of it (promises included) is half the slack its deadline leaves."""
    queues = PriorityQueues[int](QueueConfig(max_queued_per_tenant=100))
    for i in range(40):  # 40 × 1 s / 4 slots = 10 s of wait
        assert queues.push(NOW, i, band="interactive", tenant="acme", cost_tokens=200) is None
    policy = AdmissionPolicy()
    request = _request(deadline_s=NOW + 5.0, deadline_renews_on_retry=True)
    first = policy.decide(NOW, request, _snapshot(queues, NOW))
    second = policy.decide(NOW, request, _snapshot(queues, NOW))
    assert isinstance(first, Shed)
    assert isinstance(second, Shed)
    assert first.reason is ShedReason.DEADLINE_UNMEETABLE
    # wait 10 s + service 1 s - 5 s left = 6 s of excess, + (5 - 1) / 2 s of margin
    assert first.retry_after_s == pytest.approx(6.0 + 2.0)
    assert second.retry_after_s == pytest.approx(first.retry_after_s + 1 / 4)  # one promise
    # Back at its Retry-After with its ticket, it is let in at the front.
    later = NOW + first.retry_after_s
    retry = AdmissionRequest(
        tenant="acme", prompt_tokens=100, p95_output_tokens=100, deadline_s=later + 5.0,
        deadline_renews_on_retry=True, ticket=first.ticket,
    )  # fmt: skip
    decision = policy.decide(later, retry, _snapshot(queues, later))
    assert isinstance(decision, Enqueue)
    assert decision.front


def test_redeemed_tickets_keep_their_order_at_the_front() -> None:
    queues = PriorityQueues[str](QueueConfig())
    queues.push(NOW, "old", band="interactive", tenant="acme", cost_tokens=10)
    queues.push(NOW, "ticket-1", band="interactive", tenant="acme", cost_tokens=10, front=True)
    queues.push(NOW, "ticket-2", band="interactive", tenant="acme", cost_tokens=10, front=True)
    order = []
    while (got := queues.try_pop(NOW, total_slots=8, running={})) is not None:
        order.append(got.item)
    assert order == ["ticket-1", "ticket-2", "old"]
    queues.check_invariants()


@pytest.mark.parametrize(
    ("slots", "reserved"), [(1, 0), (4, 0), (15, 0), (16, 1), (31, 1), (32, 2), (64, 2), (512, 2)]
)
def test_the_default_critical_reserve_scales_with_the_slots(slots: int, reserved: int) -> None:
    """``critical_reserved_slots: 2`` of 4 slots left interactive work 2 (issue 14, defect
    6): by default a small pool reserves nothing, and no pool more than a sixteenth."""
    config = QueueConfig()
    assert config.reserved_slots(slots) == reserved
    queues = PriorityQueues[int](config)
    free = queues.free_slots_by_band(total_slots=slots, running={})
    assert free["interactive"] == slots - reserved
    assert free["critical"] == slots
    assert QueueConfig(critical_reserved_slots=1).reserved_slots(slots) == 1
    assert set(free) == set(BANDS)
