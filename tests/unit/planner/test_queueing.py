"""Queueing formulas against textbook values and against each other."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headway.core import queueing


@pytest.mark.parametrize(
    ("rho", "mean_s", "p95_s"),
    [
        (0.5, 2.00, 5.99),
        (0.8, 5.00, 14.98),
        (0.9, 10.00, 29.96),
        (0.95, 20.00, 59.91),
        (0.99, 100.00, 299.57),
    ],
)
def test_mm1_reproduces_seed_002_table(rho: float, mean_s: float, p95_s: float) -> None:
    q = queueing.mm1(rho, 1.0)
    assert q.mean_s == pytest.approx(mean_s, abs=0.005)
    assert q.p95_s == pytest.approx(p95_s, abs=0.005)


def test_unstable_queue_has_no_latency() -> None:
    for q in (queueing.mm1(2, 1), queueing.mmc(5, 1, 4), queueing.mg1(1, 1, 0.5)):
        assert not q.stable and q.mean_s is None and q.utilization >= 1


def test_erlang_c_known_values() -> None:
    # Classic call-centre example: 10 agents, 8 Erlangs offered -> P(wait) ~ 0.409.
    assert queueing.erlang_c(10, 8.0) == pytest.approx(0.4092, abs=1e-4)
    assert queueing.erlang_c(1, 0.7) == pytest.approx(0.7)


def test_mmc_with_one_server_is_mm1() -> None:
    a, b = queueing.mm1(13.8, 18), queueing.mmc(13.8, 18, 1)
    assert b.mean_s == pytest.approx(a.mean_s) and b.p95_s == pytest.approx(a.p95_s, rel=1e-9)


def test_mmc_quantile_matches_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    lam, mu, c = 7.0, 1.0, 9
    q = queueing.mmc(lam, mu, c)
    n = 200_000
    arrivals = np.cumsum(rng.exponential(1 / lam, n))
    service = rng.exponential(1 / mu, n)
    free = np.zeros(c)
    response = np.empty(n)
    for i in range(n):  # FCFS to the earliest free server
        k = int(np.argmin(free))
        start = max(arrivals[i], free[k])
        free[k] = start + service[i]
        response[i] = free[k] - arrivals[i]
    warm = response[n // 10 :]
    assert q.mean_s == pytest.approx(warm.mean(), rel=0.03)
    assert q.p95_s == pytest.approx(np.quantile(warm, 0.95), rel=0.04)


def test_mg1_exponential_equals_mm1_and_deterministic_halves_the_wait() -> None:
    mm1, mg1 = queueing.mm1(0.6, 1), queueing.mg1(0.6, 1, 1.0)
    assert mg1.mean_s == pytest.approx(mm1.mean_s)
    assert mg1.p95_s == pytest.approx(mm1.p95_s, rel=1e-3)
    md1 = queueing.mg1(0.6, 1, 0.0)
    assert md1.mean_wait_s == pytest.approx(mm1.mean_wait_s / 2)  # Pollaczek-Khinchine


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="service_per_s"):
        queueing.mm1(1, 0)
    with pytest.raises(ValueError, match="arrival_per_s"):
        queueing.mm1(math.nan, 1)
