"""``bench --sweep``: measure the knee of a real endpoint with the simulator's search.

Each point is a whole bench run of the workload with its arrival rates multiplied by a
load factor; :func:`headway.sim.sweep.search_knee` brackets and bisects exactly as for
``sweep --search`` and ``plan``. A point where the sender itself missed its budget
(``sender_ok`` false) measured the generator as much as the server; the sweep says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from headway.bench.benchmark import BenchInput, BenchOptions, BenchRun, run_bench
from headway.sim.sweep import Knee, search_knee

SCHEMA = "headway.bench-sweep/1"


class BenchPoint(msgspec.Struct, frozen=True, kw_only=True):
    """One measured load level."""

    load_factor: float
    offered_tasks_per_s: float
    offered_calls_per_s: float
    slo_attainment: float
    goodput_per_s: float
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    e2e_p99_s: float | None
    throughput_requests_per_s: float
    lateness_p99_s: float | None
    rate_ratio: float | None
    sender_ok: bool


class BenchSweep(msgspec.Struct, frozen=True, kw_only=True):
    """Every point measured, by load, and the knee."""

    schema: str
    workload: str
    target: str
    points: list[BenchPoint]
    knee: Knee
    sender_limited: bool
    """True when a point next to the knee missed the sender's budget."""


def point_of(run: BenchRun) -> BenchPoint:
    """The sweep point of a finished run."""
    r = run.result
    w = run.workload
    return BenchPoint(
        load_factor=r.load_factor,
        offered_tasks_per_s=w.num_tasks / w.duration_s,
        offered_calls_per_s=w.num_calls / w.duration_s,
        slo_attainment=r.slo.attainment,
        goodput_per_s=r.slo.goodput_per_s,
        ttft_p99_s=r.latencies.ttft.p99_s,
        tpot_p99_s=r.latencies.tpot.p99_s,
        e2e_p99_s=r.latencies.e2e.p99_s,
        throughput_requests_per_s=r.throughput_requests_per_s,
        lateness_p99_s=r.pacing.lateness.p99_s,
        rate_ratio=r.pacing.rate_ratio,
        sender_ok=r.passed,
    )


def sweep_knee(
    bench_input: BenchInput,
    options: BenchOptions,
    target_attainment: float,
    *,
    start: float = 1.0,
    tolerance: float = 0.05,
    max_rounds: int = 8,
    on_point: Callable[[BenchPoint], None] | None = None,
) -> BenchSweep:
    """Search the largest load factor whose measured attainment meets the target."""

    def run(factors: Sequence[float]) -> list[BenchPoint]:
        points = []
        for factor in factors:
            point = point_of(run_bench(bench_input, options, factor))
            if on_point is not None:
                on_point(point)
            points.append(point)
        return points

    knee, points = search_knee(
        run, target_attainment, start=start, tolerance=tolerance, max_rounds=max_rounds
    )
    unique = {p.load_factor: p for p in points}
    ordered = [unique[f] for f in sorted(unique)]
    near = [p for p in ordered if p.load_factor in (knee.load_factor, knee.upper_load_factor)]
    return BenchSweep(
        schema=SCHEMA,
        workload=bench_input.loaded.spec.name,
        target=options.target.url,
        points=ordered,
        knee=knee,
        sender_limited=any(not p.sender_ok for p in near),
    )
