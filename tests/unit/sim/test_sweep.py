"""The knee search on synthetic attainment curves (no simulation needed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from headway.sim.sweep import SweepPoint, search_knee


def _runner(
    attainment: Callable[[float], float], calls: list[int], capacity_calls_per_s: float = 1e12
) -> Callable[[Sequence[float]], list[SweepPoint]]:
    """Points of 12 calls/s per unit of load, completed up to ``capacity_calls_per_s``."""

    def run(factors: Sequence[float]) -> list[SweepPoint]:
        calls.append(len(factors))
        return [
            SweepPoint(
                load_factor=f,
                seed=0,
                offered_tasks_per_s=10 * f,
                offered_calls_per_s=12 * f,
                slo_attainment=attainment(f),
                goodput_per_s=0.0,
                task_attainment=0.0,
                ttft_p99_s=None,
                tpot_p99_s=None,
                e2e_p99_s=None,
                throughput_requests_per_s=min(12 * f, capacity_calls_per_s),
                output_tokens_per_s=0.0,
                preemptions=0,
            )
            for f in factors
        ]

    return run


@pytest.mark.parametrize("true_knee", [0.3, 1.0, 2.7, 9.5])
@pytest.mark.parametrize("jobs", [1, 2, 4])
def test_finds_a_monotone_knee_within_tolerance(true_knee: float, jobs: int) -> None:
    calls: list[int] = []
    knee, points = search_knee(
        _runner(lambda f: 1.0 if f <= true_knee else 0.5, calls), 0.9, jobs=jobs, tolerance=0.02
    )
    assert knee.found
    assert knee.load_factor <= true_knee < knee.upper_load_factor
    assert knee.upper_load_factor - knee.load_factor <= 0.02 * knee.load_factor + 1e-12
    assert knee.offered_tasks_per_s == pytest.approx(10 * knee.load_factor)
    assert all(n <= max(jobs, 1) for n in calls)
    assert len(points) == sum(calls)


def test_more_jobs_need_fewer_rounds() -> None:
    rounds = {}
    for jobs in (1, 4):
        calls: list[int] = []
        search_knee(_runner(lambda f: 1.0 if f <= 3.3 else 0.0, calls), 0.9, jobs=jobs)
        rounds[jobs] = len(calls)
    assert rounds[4] < rounds[1]


def test_never_passing_and_always_passing() -> None:
    knee, _ = search_knee(_runner(lambda f: 0.0, []), 0.9, max_rounds=6)
    assert not knee.found and knee.load_factor == 0.0
    assert knee.stopped == "max_rounds"
    knee, _ = search_knee(_runner(lambda f: 1.0, []), 0.9, max_rounds=6)
    assert knee.found and knee.upper_load_factor == float("inf")
    assert knee.load_factor == 2.0**6 and knee.stopped == "max_rounds"


def test_a_bracketed_knee_says_it_narrowed() -> None:
    knee, _ = search_knee(_runner(lambda f: 1.0 if f <= 2.5 else 0.0, []), 0.9)
    assert knee.stopped == "narrowed" and knee.saturation_calls_per_s is None


def test_an_slo_that_never_binds_stops_at_saturation() -> None:
    """Attainment at target at every load (no SLO, or one the queue never breaks) used to
    double the load 12 times (4096x, each point simulating ever longer queues): the
    search stops once a doubled load completes no more calls, and says so."""
    calls: list[int] = []
    knee, points = search_knee(
        _runner(lambda f: 1.0, calls, capacity_calls_per_s=50.0), 0.9, jobs=2
    )
    # 12, 24, 48 calls/s completed, then 50 of 96 offered: less than 5% more, saturated.
    assert [p.load_factor for p in points] == [1, 2, 4, 8]
    assert knee.stopped == "saturated" and knee.found
    assert knee.load_factor == 8 and knee.upper_load_factor == float("inf")
    assert knee.saturation_calls_per_s == 50.0
