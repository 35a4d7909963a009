"""A sweep simulates the same points in this process, in two worker processes, or on an
executor the caller owns (and leaves open)."""

from __future__ import annotations

from typing import Any

from headway.executors import LocalExecutor
from headway.files.jsonout import to_json
from headway.files.workload import parse_workload
from headway.sim.cluster import parse_cluster
from headway.sim.sweep import sweep

WORKLOAD: dict[str, Any] = {
    "name": "sweep-jobs",
    "duration_s": 20,
    "seed": 4,
    "classes": {
        "chat": {
            "input_tokens": {"dist": "lognormal", "mean": 1200, "cv": 0.8, "max": 8000},
            "output_tokens": {"dist": "lognormal", "mean": 200, "cv": 0.8, "max": 2000},
            "slo": {"ttft_s": 0.5, "tpot_s": 0.04, "attainment_target": 0.9},
        }
    },
    "sources": [{"name": "users", "arrivals": {"process": "poisson", "rate_per_s": 6}}],
}
CLUSTER: dict[str, Any] = {"replicas": 1, "model": "llama-3-8b", "gpu": "h100"}
FACTORS = [2.0, 0.5, 1.0]


def test_the_same_points_in_one_process_or_two() -> None:
    spec, cluster = parse_workload(WORKLOAD), parse_cluster(CLUSTER)
    one = sweep(spec, cluster, factors=FACTORS, jobs=1)
    two = sweep(spec, cluster, factors=FACTORS, jobs=2)
    assert to_json(two) == to_json(one)
    assert [p.load_factor for p in one.points] == sorted(FACTORS)
    calls_per_s = [p.offered_calls_per_s for p in one.points]
    assert calls_per_s == sorted(calls_per_s) and calls_per_s[0] < calls_per_s[-1]


def test_a_callers_executor_runs_the_points_and_stays_open() -> None:
    spec, cluster = parse_workload(WORKLOAD), parse_cluster(CLUSTER)
    executor = LocalExecutor(2)
    try:
        given = sweep(spec, cluster, factors=FACTORS, jobs=2, executor=executor)
        again = sweep(spec, cluster, factors=FACTORS[:1], executor=executor)  # still usable
    finally:
        executor.close()
    assert to_json(given) == to_json(sweep(spec, cluster, factors=FACTORS, jobs=1))
    assert again.points == [p for p in given.points if p.load_factor == FACTORS[0]]
