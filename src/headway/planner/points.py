"""One simulated point of a plan, and the function a worker runs for it.

A :class:`PointTask` names everything a run depends on (workload, cluster, replicas, load
factor, seed, duration), so a point computes the same anywhere: in this process, in a
local worker pool or on a Ray cluster. Two kinds exist: a ``steady`` point (the workload
at a constant multiple of its peak rate, for sweeps and the replica search) and a
``replay`` point (the workload as written, bursts and all, with its timeline and tails).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec
import numpy as np
import numpy.typing as npt

from headway.core.trace_data import TraceData
from headway.core.workload.compile import CompiledWorkload, compile_workload
from headway.core.workload.spec import WorkloadSpec
from headway.planner.demand import steady_workload
from headway.sim.cluster import ClusterSpec, pool_replicas, with_replicas
from headway.sim.results import Group, Little, Segment, SimResult
from headway.sim.run import simulate_compiled
from headway.sim.simulator import OUTCOMES, SimOptions, SimOutcome
from headway.sim.sweep import SweepPoint, route_attainment, sweep_point


class PointTask(msgspec.Struct, frozen=True, kw_only=True):
    """What one simulated point depends on."""

    kind: Literal["steady", "replay"]
    spec: WorkloadSpec
    cluster: ClusterSpec
    replicas: int
    load_factor: float
    """Steady: multiple of the peak task rate. Replay: multiple of the file's rates (1)."""
    seed: int
    duration_s: float


class Percentiles(msgspec.Struct, frozen=True, kw_only=True):
    """p50 / p90 / p99 of one latency, seconds (None when nothing completed)."""

    p50_s: float | None
    p90_s: float | None
    p99_s: float | None


class PlanPoint(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One steady point: the sweep's figures plus the percentiles the report plots."""

    replicas: int
    """Replicas in all (of a cluster of pools, or of a disaggregated one: every pool's)."""
    offered_tasks_per_s_nominal: float
    """load factor × peak task rate (the rate the arrivals were drawn at)."""
    sweep: SweepPoint
    ttft: Percentiles
    tpot: Percentiles
    e2e: Percentiles
    completed_tasks_per_s: float
    kv_usage_max: float
    shed_calls: int
    pool_replicas: dict[str, int] = {}
    """Each pool's replicas (a cluster file's ``pools``; a disaggregated cluster's
    ``prefill`` and ``decode``); left out of one pool's point."""
    route_attainment: dict[str, float] = {}
    """SLO attainment of each route (a workload with two or more routes; left out of a
    one-route point): what the replica search of a cluster of pools holds each pool to."""


class Series(msgspec.Struct, frozen=True, kw_only=True):
    """The cluster over time (samples of the simulator's timeline)."""

    time_s: list[float]
    queued_calls: list[int]
    """Calls offered and not yet admitted to a running set (gateway and engine queues)."""
    in_system_calls: list[int]
    """Calls offered and not yet ended (queued, running, or waiting to retry)."""
    running: list[int]
    kv_usage: list[float]


class Tail(msgspec.Struct, frozen=True, kw_only=True):
    """Tails of one segment (a tenant, class or input-length bucket; in
    ``Replay.segments``, any dimension of :mod:`headway.sim.segments`)."""

    segment: str
    """The dimension (``tenant``, ``output tokens``, ``arrival time``, ...)."""
    name: str
    calls: int
    slo_attainment: float | None
    ttft_p99_s: float | None
    e2e_p99_s: float | None
    share: float | None = None
    """``calls`` over all calls of the run (None: not given, in ``tails``)."""
    ranked: bool = True
    """Whether it takes part in the worst-first order (see ``SimResult.segments``)."""


class Replay(msgspec.Struct, frozen=True, kw_only=True):
    """The workload as written (bursts and all) on the planned cluster."""

    replicas: int
    seed: int
    duration_s: float
    offered_tasks: int
    tasks_met_deadline: int
    slo_attainment: float
    task_attainment: float
    goodput_per_s: float
    series: Series
    tails: list[Tail]
    shed_calls: int
    amplification: float
    wasted_fraction: float = 0.0
    """Of the tokens the engines processed, the share no answer came of."""
    joules_per_slo_request: float | None = None
    joules_per_verified_outcome: float | None = None
    """Energy per call that met its SLO and per verified outcome (None: not known)."""
    little: list[Little] = msgspec.field(default_factory=list)
    """Little's law at every boundary of the run (the instrumentation's own check)."""
    segments: list[Tail] = msgspec.field(default_factory=list)
    """Every segment seed 002 lists (lengths, route, prefix-cache hit class, cold or warm
    replica, preemption, retry, priority, tenant, class, outcome, arrival time), the
    ranked ones worst first, the unranked after them."""


def _pct(summary_p50: float | None, p90: float | None, p99: float | None) -> Percentiles:
    return Percentiles(p50_s=summary_p50, p90_s=p90, p99_s=p99)


def _simulate(
    task: PointTask, spec: WorkloadSpec, traces: Mapping[str, TraceData] | None
) -> tuple[CompiledWorkload, SimResult, SimOutcome]:
    workload = compile_workload(spec, seed=task.seed, traces=traces)
    cluster = with_replicas(task.cluster, task.replicas)
    options = SimOptions(sample_points=400 if task.kind == "replay" else 50)
    result, outcome = simulate_compiled(workload, cluster, options)
    return workload, result, outcome


def run_steady(task: PointTask, peak_tasks_per_s: float) -> PlanPoint:
    """Simulate a steady point (runs in a worker)."""
    spec = steady_workload(task.spec, task.load_factor, task.duration_s)
    workload, r, outcome = _simulate(task, spec, None)
    lat = r.latencies
    return PlanPoint(
        replicas=task.replicas,
        offered_tasks_per_s_nominal=task.load_factor * peak_tasks_per_s,
        sweep=sweep_point(task.spec, task.load_factor, task.seed, workload, r),
        ttft=_pct(lat.ttft.p50_s, lat.ttft.p90_s, lat.ttft.p99_s),
        tpot=_pct(lat.tpot.p50_s, lat.tpot.p90_s, lat.tpot.p99_s),
        e2e=_pct(lat.e2e.p50_s, lat.e2e.p90_s, lat.e2e.p99_s),
        completed_tasks_per_s=r.slo.tasks_completed / r.throughput.window_s,
        kv_usage_max=float(outcome.timeline_kv_usage.max()) if outcome.timeline_s.size else 0.0,
        shed_calls=r.accounting.shed,
        pool_replicas=pool_replicas(with_replicas(task.cluster, task.replicas)),
        route_attainment=_by_route(task.spec, r),
    )


def _by_route(spec: WorkloadSpec, r: SimResult) -> dict[str, float]:
    """Each route's attainment, in the workload's order (a workload of one route: none)."""
    if len(spec.routes) < 2:
        return {}
    found = route_attainment(r)
    return {name: found[name] for name in spec.routes if name in found}


def _present(
    start: npt.NDArray[np.float64], left: npt.NDArray[np.float64], times: npt.NDArray[np.float64]
) -> list[int]:
    """How many [start, left) intervals hold each time."""
    begun = np.searchsorted(np.sort(start), times, side="right")
    ended = np.searchsorted(np.sort(left), times, side="right")
    counts: list[int] = (begun - ended).astype(np.int64).tolist()
    return counts


def _occupancy(outcome: SimOutcome, times: npt.NDArray[np.float64]) -> tuple[list[int], list[int]]:
    """(queued, in system) calls at each time; a shed call leaves when it arrives."""
    c = outcome.calls
    offered = np.isfinite(c.arrival_s)
    start = c.arrival_s[offered]
    unfinished = np.isin(
        c.outcome[offered], [OUTCOMES.index("failed"), OUTCOMES.index("in_flight")]
    )
    ended = np.where(unfinished, outcome.end_s, c.finish_s[offered])
    ended = np.where(np.isfinite(ended), ended, start)
    admitted = c.admitted_s[offered]
    queued_until = np.where(np.isfinite(admitted), np.minimum(admitted, ended), ended)
    return _present(start, queued_until, times), _present(start, ended, times)


def _tails(segment: str, groups: list[Group]) -> list[Tail]:
    return [
        Tail(
            segment=segment,
            name=g.name,
            calls=g.calls,
            slo_attainment=g.slo_attainment,
            ttft_p99_s=g.latencies.ttft.p99_s,
            e2e_p99_s=g.latencies.e2e.p99_s,
        )
        for g in groups
        if g.calls
    ]


def _segments(segments: list[Segment]) -> list[Tail]:
    return [
        Tail(
            segment=s.dimension,
            name=s.name,
            calls=s.calls,
            slo_attainment=s.slo_attainment,
            ttft_p99_s=s.latencies.ttft.p99_s,
            e2e_p99_s=s.latencies.e2e.p99_s,
            share=s.share,
            ranked=s.ranked,
        )
        for s in segments
    ]


def run_replay(task: PointTask, traces: Mapping[str, TraceData] | None = None) -> Replay:
    """Simulate the workload as written, with its timeline and tails (runs in a worker)."""
    spec = task.spec
    if task.duration_s != spec.duration_s:
        spec = msgspec.structs.replace(spec, duration_s=task.duration_s)
    workload, r, outcome = _simulate(task, spec, traces)
    times = outcome.timeline_s
    queued, in_system = _occupancy(outcome, times)
    return Replay(
        replicas=task.replicas,
        seed=task.seed,
        duration_s=workload.duration_s,
        offered_tasks=r.slo.offered_tasks,
        tasks_met_deadline=r.slo.tasks_met_deadline,
        slo_attainment=r.slo.attainment,
        task_attainment=r.slo.task_attainment,
        goodput_per_s=r.slo.goodput_per_s,
        series=Series(
            time_s=times.tolist(),
            queued_calls=queued,
            in_system_calls=in_system,
            running=outcome.timeline_running.tolist(),
            kv_usage=outcome.timeline_kv_usage.tolist(),
        ),
        tails=_tails("tenant", r.by_tenant)
        + _tails("class", r.by_class)
        + _tails("input tokens", r.by_length),
        shed_calls=r.accounting.shed,
        amplification=r.accounting.amplification,
        little=r.little_boundaries,
        segments=_segments(r.segments),
        wasted_fraction=0.0 if r.work is None else r.work.wasted_fraction,
        joules_per_slo_request=None if r.energy is None else r.energy.joules_per_slo_request,
        joules_per_verified_outcome=(
            None if r.energy is None else r.energy.joules_per_verified_outcome
        ),
    )
