"""The knee search on synthetic attainment curves (no simulation needed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from headway.sim.sweep import SweepPoint, search_knee


def _runner(attainment: Callable[[float], float], calls: list[int]) -> Callable[
    [Sequence[float]], list[SweepPoint]
]:  # fmt: skip
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
                throughput_requests_per_s=0.0,
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
    knee, _ = search_knee(_runner(lambda f: 1.0, []), 0.9, max_rounds=6)
    assert knee.found and knee.upper_load_factor == float("inf")
    assert knee.load_factor == 2.0**6
