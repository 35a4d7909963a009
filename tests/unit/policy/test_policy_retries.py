"""Retries: never after the first token or for non-idempotent work, bounded attempts,
backoff and jitter, Retry-After, deadlines and the budget."""

from __future__ import annotations

import numpy as np
import pytest

from headway.core.policy.decisions import Shed, ShedReason
from headway.core.policy.retries import (
    AttemptOutcome,
    FailureKind,
    GiveUp,
    GiveUpReason,
    RetryAfter,
    RetryConfig,
    RetryPolicy,
    refusal_kind,
)

ERROR = AttemptOutcome(kind=FailureKind.UPSTREAM_ERROR)


def _rng() -> np.random.Generator:
    return np.random.default_rng(3)


def _policy(**fields: object) -> RetryPolicy:
    base: dict[str, object] = {"max_attempts": 5, "budget_min_retries": 1000}
    base.update(fields)
    policy = RetryPolicy(RetryConfig(**base))  # type: ignore[arg-type]
    policy.record_request(0.0)
    return policy


def _gave_up(decision: object, reason: GiveUpReason) -> None:
    assert isinstance(decision, GiveUp), decision
    assert decision.reason is reason, decision


def test_never_after_the_first_token_of_a_stream() -> None:
    outcome = AttemptOutcome(kind=FailureKind.UPSTREAM_ERROR, first_token_received=True)
    _gave_up(_policy().next_attempt(1.0, 1, outcome, None, _rng()), GiveUpReason.STREAM_STARTED)
    assert isinstance(_policy().next_attempt(1.0, 1, ERROR, None, _rng()), RetryAfter)


@pytest.mark.parametrize("kind", list(FailureKind))
def test_never_for_a_non_idempotent_operation(kind: FailureKind) -> None:
    outcome = AttemptOutcome(kind=kind, idempotent=False)
    _gave_up(_policy().next_attempt(1.0, 1, outcome, 1.0, _rng()), GiveUpReason.NOT_IDEMPOTENT)


def test_invalid_requests_and_hopeless_refusals_are_not_retried() -> None:
    invalid = AttemptOutcome(kind=FailureKind.INVALID)
    _gave_up(_policy().next_attempt(1.0, 1, invalid, None, _rng()), GiveUpReason.NOT_RETRYABLE)
    refused = AttemptOutcome(kind=FailureKind.REFUSED)
    _gave_up(_policy().next_attempt(1.0, 1, refused, None, _rng()), GiveUpReason.NOT_RETRYABLE)
    assert isinstance(_policy().next_attempt(1.0, 1, refused, 2.0, _rng()), RetryAfter)


def test_attempts_are_bounded() -> None:
    policy = _policy(max_attempts=3)
    assert isinstance(policy.next_attempt(1.0, 2, ERROR, None, _rng()), RetryAfter)
    _gave_up(policy.next_attempt(1.0, 3, ERROR, None, _rng()), GiveUpReason.ATTEMPTS_EXHAUSTED)
    _gave_up(
        _policy(max_attempts=1).next_attempt(1.0, 1, ERROR, None, _rng()),
        GiveUpReason.ATTEMPTS_EXHAUSTED,
    )


def test_backoff_doubles_and_is_capped() -> None:
    policy = _policy(backoff_base_s=0.5, backoff_max_s=3.0)
    assert [policy.backoff_s(a) for a in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy.backoff_s(5000) == 3.0


def test_no_jitter_waits_exactly_the_backoff_and_equal_jitter_at_least_half() -> None:
    none = _policy(jitter="none", backoff_base_s=0.5, max_attempts=10)
    assert none.next_attempt(1.0, 3, ERROR, None, _rng()) == RetryAfter(2.0)
    equal = _policy(jitter="equal", backoff_base_s=0.5, max_attempts=10)
    rng = _rng()
    delays = []
    for _ in range(200):
        decision = equal.next_attempt(1.0, 3, ERROR, None, rng)
        assert isinstance(decision, RetryAfter)
        delays.append(decision.delay_s)
    assert min(delays) >= 1.0
    assert max(delays) <= 2.0
    assert np.std(delays) > 0.1


def test_full_jitter_spreads_over_the_whole_backoff() -> None:
    policy = _policy(jitter="full", backoff_base_s=1.0, backoff_max_s=1.0, max_attempts=10)
    rng = _rng()
    delays = []
    for _ in range(400):
        decision = policy.next_attempt(1.0, 1, ERROR, None, rng)
        assert isinstance(decision, RetryAfter)
        delays.append(decision.delay_s)
    assert 0.0 <= min(delays) < 0.05
    assert 0.95 < max(delays) <= 1.0
    assert np.mean(delays) == pytest.approx(0.5, abs=0.05)


def test_retry_after_is_honoured_when_configured() -> None:
    shed = AttemptOutcome(kind=FailureKind.REFUSED)
    honour = _policy(jitter="none", backoff_base_s=0.5)
    assert honour.next_attempt(1.0, 1, shed, 7.5, _rng()) == RetryAfter(7.5)
    assert honour.next_attempt(1.0, 1, shed, 0.1, _rng()) == RetryAfter(0.5)
    ignore = _policy(jitter="none", backoff_base_s=0.5, honour_retry_after=False)
    assert ignore.next_attempt(1.0, 1, shed, 7.5, _rng()) == RetryAfter(0.5)


def test_no_retry_that_would_start_after_the_deadline() -> None:
    policy = _policy(jitter="none", backoff_base_s=2.0)
    late = AttemptOutcome(kind=FailureKind.TIMEOUT, deadline_s=12.0)
    _gave_up(policy.next_attempt(10.0, 1, late, None, _rng()), GiveUpReason.DEADLINE)
    assert policy.next_attempt(9.9, 1, late, None, _rng()) == RetryAfter(2.0)
    # a Retry-After past the deadline also gives up
    _gave_up(policy.next_attempt(1.0, 1, late, 11.0, _rng()), GiveUpReason.DEADLINE)


def test_budget_allows_the_ratio_of_recent_requests_then_refuses() -> None:
    policy = RetryPolicy(RetryConfig(budget_ratio=0.2, budget_min_retries=0, budget_window_s=10.0))
    for k in range(50):
        policy.record_request(k * 0.1)  # 50 requests in 5 s
    granted = sum(
        isinstance(policy.next_attempt(5.0, 1, ERROR, None, _rng()), RetryAfter) for _ in range(30)
    )
    assert granted == 10  # 20% of 50
    _gave_up(policy.next_attempt(5.0, 1, ERROR, None, _rng()), GiveUpReason.BUDGET_EXHAUSTED)
    # the requests leave the window at t = 10.0 + k * 0.1; the retries at 15.0
    assert policy.budget(14.95)[0] == pytest.approx(0)
    policy.record_request(15.0)
    assert policy.budget(15.0) == (1.0, 0.0, pytest.approx(0.2))


def test_the_budget_floor_lets_a_quiet_service_retry() -> None:
    policy = RetryPolicy(RetryConfig(budget_ratio=0.2, budget_min_retries=3))
    policy.record_request(0.0)
    granted = [
        isinstance(policy.next_attempt(0.0, 1, ERROR, None, _rng()), RetryAfter) for _ in range(4)
    ]
    assert granted == [True, True, True, False]


def test_a_refusal_spends_no_budget() -> None:
    policy = RetryPolicy(RetryConfig(budget_ratio=0.0, budget_min_retries=1))
    stream = AttemptOutcome(kind=FailureKind.UPSTREAM_ERROR, first_token_received=True)
    for _ in range(5):
        policy.next_attempt(0.0, 1, stream, None, _rng())
    assert isinstance(policy.next_attempt(0.0, 1, ERROR, None, _rng()), RetryAfter)


def test_same_seed_same_delays() -> None:
    def delays(seed: int) -> list[float]:
        policy = _policy(max_attempts=10)
        rng = np.random.default_rng(seed)
        out = []
        for a in range(1, 8):
            decision = policy.next_attempt(1.0, a, ERROR, None, rng)
            assert isinstance(decision, RetryAfter)
            out.append(decision.delay_s)
        return out

    assert delays(11) == delays(11)
    assert delays(11) != delays(12)


def test_attempt_must_count_attempts_made() -> None:
    with pytest.raises(ValueError, match="attempt"):
        _policy().next_attempt(1.0, 0, ERROR, None, _rng())


def test_without_a_budget_every_allowed_attempt_is_retried() -> None:
    """Clients with no budget (most deployments today) retry everything the attempts allow."""
    policy = RetryPolicy(RetryConfig(budget=False, budget_ratio=0.2, budget_min_retries=0))
    for k in range(50):
        policy.record_request(k * 0.1)
    granted = sum(
        isinstance(policy.next_attempt(5.0, 1, ERROR, None, _rng()), RetryAfter) for _ in range(30)
    )
    assert granted == 30  # the budgeted policy above grants 10 of the same 30


def test_a_refusal_that_names_no_time_but_invites_a_retry_is_paced_by_the_backoff() -> None:
    # A budget's 429 without Retry-After (every promisable turn taken) is not "no retry
    # can help": the client retries on its own jittered backoff.
    throttled = AttemptOutcome(kind=FailureKind.THROTTLED)
    policy = _policy(jitter="none", backoff_base_s=0.5)
    first = policy.next_attempt(1.0, 1, throttled, None, _rng())
    assert isinstance(first, RetryAfter) and first.delay_s == 0.5
    second = policy.next_attempt(2.0, 2, throttled, None, _rng())
    assert isinstance(second, RetryAfter) and second.delay_s == 1.0
    # The core says which a shed is, for every driver.
    assert refusal_kind(Shed(ShedReason.TENANT_TOKEN_RATE, None, client_backoff=True)) is (
        FailureKind.THROTTLED
    )
    assert refusal_kind(Shed(ShedReason.TENANT_TOKEN_RATE, None)) is FailureKind.REFUSED
    # Its delay is the jittered backoff (full jitter: within the backoff, spread).
    delays = [_policy().delay_s(2, np.random.default_rng(seed)) for seed in range(50)]
    assert all(0 <= d <= 1.0 for d in delays) and len(set(delays)) == 50
