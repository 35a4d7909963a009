"""The sliding-window counter and the token bucket: exact arithmetic."""

from __future__ import annotations

import pytest

from headway.core.policy.rates import TokenBucket, WindowCounter


def test_token_bucket_refills_from_now() -> None:
    bucket = TokenBucket(rate_per_s=50.0, capacity_tokens=200.0, now=10.0)
    assert bucket.level(10.0) == 200.0
    assert bucket.try_take(10.0, 150.0)
    assert bucket.level(10.0) == pytest.approx(50.0)
    assert bucket.level(11.0) == pytest.approx(100.0)  # + 50 per second
    assert bucket.level(100.0) == pytest.approx(200.0)  # never above the capacity


def test_token_bucket_wait_is_the_refill_time_of_the_shortfall() -> None:
    bucket = TokenBucket(rate_per_s=20.0, capacity_tokens=100.0, now=0.0, level_tokens=30.0)
    assert bucket.wait_s(0.0, 30.0) == 0.0
    assert bucket.wait_s(0.0, 90.0) == pytest.approx(3.0)  # 60 short at 20/s
    assert not bucket.try_take(2.99, 90.0)
    assert bucket.try_take(3.0, 90.0)
    assert bucket.wait_s(3.0, 100.0) == pytest.approx(5.0)  # empty after the take
    assert bucket.wait_s(3.0, 100.01) is None  # larger than the bucket


def test_token_bucket_give_back_is_capped() -> None:
    bucket = TokenBucket(rate_per_s=1.0, capacity_tokens=10.0, now=0.0, level_tokens=0.0)
    bucket.give_back(0.0, 4.0)
    assert bucket.level(0.0) == pytest.approx(4.0)
    bucket.give_back(0.0, 100.0)
    assert bucket.level(0.0) == pytest.approx(10.0)


def test_time_going_backwards_is_an_error() -> None:
    bucket = TokenBucket(rate_per_s=1.0, capacity_tokens=10.0, now=5.0)
    with pytest.raises(ValueError, match="backwards"):
        bucket.level(4.0)
    counter = WindowCounter(10.0)
    counter.add(5.0)
    with pytest.raises(ValueError, match="backwards"):
        counter.total(4.0)


def test_window_counter_is_half_open() -> None:
    counter = WindowCounter(10.0)
    counter.add(0.0, 2.0)
    counter.add(5.0, 3.0)
    counter.add(5.0, 1.0)  # same time merges
    assert counter.total(9.999) == pytest.approx(6.0)
    assert counter.total(10.0) == pytest.approx(4.0)  # the amount at 0.0 left at 10.0
    assert counter.total(15.0) == 0.0


def test_window_rate_uses_the_time_observed_until_a_window_has_passed() -> None:
    counter = WindowCounter(10.0, start_s=0.0)
    for k in range(1, 21):
        counter.add(k * 0.5)  # 2 per second
        if k == 10:
            assert counter.rate_per_s(5.0) == pytest.approx(2.0)  # 10 in the 5 s observed
    assert counter.rate_per_s(10.0) == pytest.approx(2.0)
    assert counter.rate_per_s(12.0) == pytest.approx(16 / 10.0)
    assert WindowCounter(1.0).rate_per_s(3.0) == 0.0
