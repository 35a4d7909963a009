"""Property tests of the overload policies: the retry budget under a storm, jitter bounds,
the token bucket's defining inequality, fair shares, and a stateful model of the queues
(slots, caps, expiry and conservation)."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headway.core.policy.queues import BANDS, BandConfig, PriorityQueues, QueueConfig, Queued
from headway.core.policy.rates import TokenBucket
from headway.core.policy.retries import (
    AttemptOutcome,
    FailureKind,
    RetryAfter,
    RetryConfig,
    RetryPolicy,
)

FAST = settings(max_examples=40, deadline=None)
ERROR = AttemptOutcome(kind=FailureKind.UPSTREAM_ERROR)


# -------------------------------------------------------------------------- retries


@FAST
@given(
    ratio=st.sampled_from([0.0, 0.1, 0.2, 0.5]),
    min_retries=st.integers(0, 5),
    events=st.lists(
        st.tuples(st.floats(0.0, 2.0), st.booleans(), st.integers(0, 6)), min_size=1, max_size=150
    ),
)
def test_retry_budget_caps_retries_per_window_under_a_storm(
    ratio: float, min_retries: int, events: list[tuple[float, bool, int]]
) -> None:
    """Whatever the arrival pattern, at every granted retry the retries in the trailing
    window are at most ``max(budget_min_retries, budget_ratio * requests in it)``."""
    window_s = 5.0
    config = RetryConfig(
        max_attempts=100,
        budget_ratio=ratio,
        budget_min_retries=min_retries,
        budget_window_s=window_s,
    )
    policy = RetryPolicy(config)
    rng = np.random.default_rng(0)
    t = 0.0
    requests: list[float] = []
    retries: list[float] = []
    for gap_s, new_request, failures in events:
        t += gap_s
        if new_request:
            policy.record_request(t)
            requests.append(t)
        for _ in range(failures):  # a storm: every failure asks for a retry
            if isinstance(policy.next_attempt(t, 1, ERROR, None, rng), RetryAfter):
                retries.append(t)
                in_window = sum(1 for r in requests if r > t - window_s)
                granted = sum(1 for r in retries if r > t - window_s)
                assert granted <= max(min_retries, ratio * in_window) + 1e-9


def test_a_steady_storm_adds_at_most_the_budget_ratio() -> None:
    policy = RetryPolicy(RetryConfig(max_attempts=100, budget_ratio=0.2, budget_min_retries=3))
    rng = np.random.default_rng(1)
    requests = retries = 0
    for k in range(6000):  # 100 requests/s for 60 s; every attempt fails and asks again
        t = k * 0.01
        policy.record_request(t)
        requests += 1
        for attempt in range(1, 4):
            if isinstance(policy.next_attempt(t, attempt, ERROR, None, rng), RetryAfter):
                retries += 1
    windows = 60 / 10 + 1
    assert retries / requests <= 0.2 + 3 * windows / requests
    assert retries / requests >= 0.19  # the budget is used, not just refused


@FAST
@given(
    base_s=st.floats(0.0, 5.0),
    extra_s=st.floats(0.0, 60.0),
    attempt=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_full_jitter_delays_lie_within_zero_and_the_backoff(
    base_s: float, extra_s: float, attempt: int, seed: int
) -> None:
    policy = RetryPolicy(
        RetryConfig(
            max_attempts=100,
            backoff_base_s=base_s,
            backoff_max_s=base_s + extra_s,
            jitter="full",
            budget_min_retries=1000,
        )
    )
    decision = policy.next_attempt(0.0, attempt, ERROR, None, np.random.default_rng(seed))
    assert isinstance(decision, RetryAfter)
    assert 0.0 <= decision.delay_s <= policy.backoff_s(attempt)
    assert policy.backoff_s(attempt) <= base_s + extra_s


# -------------------------------------------------------------------------- token bucket


@FAST
@given(
    rate=st.floats(0.5, 1000.0),
    capacity=st.floats(1.0, 10_000.0),
    takes=st.lists(st.tuples(st.floats(0.0, 3.0), st.floats(0.0, 2000.0)), max_size=60),
)
def test_token_bucket_never_grants_more_than_burst_plus_refill(
    rate: float, capacity: float, takes: list[tuple[float, float]]
) -> None:
    bucket = TokenBucket(rate_per_s=rate, capacity_tokens=capacity, now=0.0)
    t = taken = 0.0
    for gap_s, tokens in takes:
        t += gap_s
        wait = bucket.wait_s(t, tokens)
        took = bucket.try_take(t, tokens)
        assert took == (wait == 0.0)
        if took:
            taken += tokens
        assert -1e-9 <= bucket.level(t) <= capacity + 1e-9
        assert taken <= capacity + rate * t + 1e-6 * (1 + taken)


# -------------------------------------------------------------------------- fairness


@settings(max_examples=15, deadline=None)
@given(
    weights=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    seed=st.integers(0, 1000),
)
def test_backlogged_tenants_get_tokens_in_proportion_to_weight(
    weights: tuple[int, int], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    config = QueueConfig(
        interactive=BandConfig(max_queued_requests=1000),
        tenant_weights={"a": float(weights[0]), "b": float(weights[1])},
    )
    queues = PriorityQueues[str](config)
    for tenant in ("a", "b"):
        for _ in range(20):
            queues.push(
                0.0,
                tenant,
                band="interactive",
                tenant=tenant,
                cost_tokens=int(rng.integers(1, 500)),
            )
    served: Counter[str] = Counter()
    # A pop every 50 ms: each request waits about 2 s behind the 40 queued, past the
    # queues' fair_after_s, so the band is contended and fair-queued (a band whose
    # requests all leave within fair_after_s keeps arrival order instead).
    for k in range(2000):
        got = queues.try_pop(k * 0.05, total_slots=10, running={})
        assert got is not None
        served[got.tenant] += got.cost_tokens
        queues.push(
            k * 0.05,
            got.tenant,
            band="interactive",
            tenant=got.tenant,
            cost_tokens=int(rng.integers(1, 500)),
        )
    expected = weights[1] / weights[0]
    assert abs(served["b"] / served["a"] - expected) <= 0.05 * expected


# -------------------------------------------------------------------------- the queues


class QueuesMachine(RuleBasedStateMachine):
    """Requests pushed, popped into slots, finished and expired in random order; a model
    checks that none is lost or duplicated, none leaves after its deadline, and the slot
    rules hold at every step."""

    TOTAL_SLOTS = 8

    def __init__(self) -> None:
        super().__init__()
        self.config = QueueConfig(
            critical=BandConfig(max_queued_requests=6),
            interactive=BandConfig(max_queued_requests=10, max_wait_s=3.0),
            background=BandConfig(max_queued_requests=10, max_wait_s=5.0),
            max_queued_per_tenant=8,
            tenant_weights={"t0": 2.0},
            critical_reserved_slots=2,
            background_max_share=0.25,
        )
        self.queues = PriorityQueues[int](self.config)
        self.now = 0.0
        self.next_id = 0
        self.deadline: dict[int, float | None] = {}
        self.queued: set[int] = set()
        self.running: list[Queued[int]] = []
        self.gone: set[int] = set()

    def _running_by_band(self) -> Counter[str]:
        return Counter(q.band for q in self.running)

    @rule(
        band=st.sampled_from(BANDS),
        tenant=st.sampled_from(["t0", "t1", "t2"]),
        cost=st.integers(0, 3000),
        ttl=st.none() | st.floats(0.0, 10.0),
    )
    def push(self, band: str, tenant: str, cost: int, ttl: float | None) -> None:
        item = self.next_id
        self.next_id += 1
        deadline = None if ttl is None else self.now + ttl
        shed = self.queues.push(
            self.now, item, band=band, tenant=tenant, cost_tokens=cost, deadline_s=deadline
        )
        if shed is None:
            self.queued.add(item)
            self.deadline[item] = deadline
        else:
            assert shed.retry_after_s is None or shed.retry_after_s >= 0

    @rule(dt=st.floats(0.0, 4.0))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule()
    def pop(self) -> None:
        got = self.queues.try_pop(
            self.now, total_slots=self.TOTAL_SLOTS, running=self._running_by_band()
        )
        if got is None:
            return
        assert got.item in self.queued, "popped something not queued (or twice)"
        deadline = self.deadline[got.item]
        assert deadline is None or deadline > self.now, "dispatched after its deadline"
        self.queued.remove(got.item)
        self.running.append(got)

    @precondition(lambda self: bool(self.running))
    @rule(index=st.integers(0, 100))
    def finish(self, index: int) -> None:
        self.running.pop(index % len(self.running))

    @rule()
    def expire(self) -> None:
        for gone in self.queues.expire(self.now):
            assert gone.item in self.queued, "expired something not queued (or twice)"
            deadline = self.deadline[gone.item]
            assert deadline is not None
            assert deadline <= self.now
            self.queued.remove(gone.item)
            self.gone.add(gone.item)
        late = [i for i in self.queued if (d := self.deadline[i]) is not None and d <= self.now]
        assert not late, f"still queued past their deadline: {late}"

    @invariant()
    def bookkeeping_agrees(self) -> None:
        self.queues.check_invariants()
        stats = self.queues.statistics(self.now)
        assert stats.pushed == stats.dispatched + stats.expired + stats.queued_requests
        set_aside = stats.expired - len(self.gone)  # expired, not yet returned by expire()
        assert len(self.queues) + set_aside == len(self.queued)

    @invariant()
    def slot_rules_hold(self) -> None:
        running = self._running_by_band()
        assert sum(running.values()) <= self.TOTAL_SLOTS
        non_critical = running["interactive"] + running["background"]
        assert non_critical <= self.TOTAL_SLOTS - self.config.critical_reserved_slots
        assert running["background"] <= self.config.background_cap_slots(self.TOTAL_SLOTS)


QueuesMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestQueues = QueuesMachine.TestCase
