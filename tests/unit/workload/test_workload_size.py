"""A workload expected to compile to more calls than one run can hold is refused at once,
naming the numbers, before anything is allocated."""

from __future__ import annotations

import time

import pytest

from headway.core.errors import WorkloadError
from headway.core.workload.compile import MAX_EXPECTED_CALLS, check_size, compile_workload
from headway.files.workload import parse_workload


def _spec(rate_per_s: float, duration_s: float, calls: float = 1.0) -> dict[str, object]:
    return {
        "name": "size",
        "duration_s": duration_s,
        "classes": {"c": {"calls": calls, "parallel_branches": 2}},
        "sources": [{"name": "s", "arrivals": {"process": "poisson", "rate_per_s": rate_per_s}}],
    }


@pytest.mark.parametrize(
    ("rate_per_s", "duration_s", "calls"),
    [(1e12, 1.0, 1.0), (10.0, 1e15, 1.0), (1.0, 60.0, 1e9), (1e7, 3600.0, 1.0)],
)
def test_huge_workloads_are_refused_quickly(
    rate_per_s: float, duration_s: float, calls: float
) -> None:
    spec = parse_workload(_spec(rate_per_s, duration_s, calls))
    started = time.perf_counter()
    with pytest.raises(WorkloadError, match=r"duration_s.*would compile to about .* calls"):
        compile_workload(spec)
    assert time.perf_counter() - started < 5.0  # refused, not attempted


def test_the_cap_sits_between_just_under_and_just_over() -> None:
    # rate × duration × calls × branches: 2 calls a task here.
    under = parse_workload(_spec(MAX_EXPECTED_CALLS / 2000.0 * 0.99, 1000.0))
    check_size(under, 1000.0)  # no error
    over = parse_workload(_spec(MAX_EXPECTED_CALLS / 2000.0 * 1.01, 1000.0))
    with pytest.raises(WorkloadError, match="20,000,000"):
        check_size(over, 1000.0)
