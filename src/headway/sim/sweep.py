"""Sweep offered load and find the knee: the largest load with SLO attainment at target.

A point is the workload with every arrival rate multiplied by a load factor, simulated
with one seed. Points run on an executor (:mod:`headway.executors`: worker processes or
Ray), the same points whichever runs them. The knee search brackets the
knee by doubling, then narrows the bracket with ``jobs`` interior points per round
(k-section; bisection when ``jobs`` is 1) until it is within ``tolerance`` (relative).
Attainment is over offered calls, so shed or unfinished work counts against it.

The doubling stops early when a doubled load completes hardly more calls than the load
before it (the cluster is saturated) while attainment still meets the target: the SLO
does not bind there, and doubling on would only simulate ever longer queues (a workload
without an SLO went on to 4096x). :attr:`Knee.stopped` says which way a search ended.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Protocol, TypeVar

import msgspec

from headway.core.trace_data import TraceData
from headway.core.workload.compile import CompiledWorkload, compile_workload
from headway.core.workload.scale import scale_workload
from headway.core.workload.spec import WorkloadSpec
from headway.core.workload.validate import require_latency_slo
from headway.executors import LocalExecutor, PointExecutor
from headway.sim.cluster import ClusterSpec
from headway.sim.results import SimResult
from headway.sim.run import simulate_compiled

SCHEMA = "headway.sweep/1"

SATURATION_GROWTH = 1.05
"""A doubled load that completes less than this × the calls/s of the load before it
has saturated the cluster."""

KneeStop = Literal["narrowed", "saturated", "max_rounds"]


class SweepPoint(msgspec.Struct, frozen=True, kw_only=True):
    """One simulated load level."""

    load_factor: float
    seed: int
    offered_tasks_per_s: float
    offered_calls_per_s: float
    slo_attainment: float
    goodput_per_s: float
    task_attainment: float
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    e2e_p99_s: float | None
    throughput_requests_per_s: float
    output_tokens_per_s: float
    preemptions: int
    tenant_attainment: dict[str, float] = {}
    """Attainment of each tenant with an ``attainment_target`` (over its offered calls)."""
    verified_goodput_per_s: float = 0.0
    """Tasks completed within their deadline with an accepted outcome, per second."""
    held_attainment: float | None = None
    """The attainment the plan holds to the target: the overall one, or a targeted
    tenant's shifted by its target's distance from the overall target where that is
    lower (:func:`held_attainment`); with two or more routes, each route's in place of
    the overall one, shifted by its own target's distance (:func:`route_targets`). None:
    the overall one (one route, no tenant with a target)."""

    @property
    def attainment_held(self) -> float:
        """:attr:`held_attainment`, or the overall attainment without tenant targets."""
        return self.slo_attainment if self.held_attainment is None else self.held_attainment


class Knee(msgspec.Struct, frozen=True, kw_only=True):
    """The knee found by the search."""

    target: float
    load_factor: float
    """Largest load factor found with attainment >= target."""
    upper_load_factor: float
    """Smallest load factor found with attainment < target."""
    offered_tasks_per_s: float
    offered_calls_per_s: float
    found: bool
    """False when even the smallest factor tried misses the target."""
    stopped: KneeStop = "narrowed"
    """Why the search ended: ``narrowed`` (the bracket is within the tolerance),
    ``saturated`` (doubling the load no longer raised the completed calls/s while
    attainment stayed at target: the SLO does not limit the load, the cluster's
    capacity does; ``load_factor`` is the last load tried, ``upper_load_factor`` inf),
    ``max_rounds`` (the rounds ran out first)."""
    saturation_calls_per_s: float | None = None
    """With ``saturated``: the completed calls/s the doubling stopped at."""


class SweepResult(msgspec.Struct, frozen=True, kw_only=True):
    """All points of a sweep, sorted by load, and the knee when searched."""

    schema: str
    workload: str
    cluster_replicas: int
    points: list[SweepPoint]
    knee: Knee | None


def attainment_target(spec: WorkloadSpec) -> float:
    """The sweep's target: the strictest class target (the knee is where any class breaks)."""
    return max(cls.slo.attainment_target for cls in spec.classes.values())


def tenant_targets(spec: WorkloadSpec) -> dict[str, float]:
    """The tenants with an ``attainment_target``, and their targets."""
    return {
        name: tenant.attainment_target
        for name, tenant in spec.tenants.items()
        if tenant.attainment_target is not None
    }


def route_targets(spec: WorkloadSpec) -> dict[str, float]:
    """Each route's target: the strictest ``attainment_target`` of the classes whose
    calls go there (a class without ``route`` goes to the first); routes no class uses
    are left out."""
    first = next(iter(spec.routes))
    targets: dict[str, float] = {}
    for cls in spec.classes.values():
        route = cls.route or first
        targets[route] = max(targets.get(route, 0.0), cls.slo.attainment_target)
    return targets


def route_attainment(result: SimResult) -> dict[str, float]:
    """SLO attainment of each route with calls to judge (the result's ``route`` segments:
    over its calls, losing branches left out, like the overall one)."""
    return {
        s.name: s.slo_attainment
        for s in result.segments
        if s.dimension == "route" and s.slo_attainment is not None
    }


def held_attainment(
    overall: float, tenants: Mapping[str, float], targets: Mapping[str, float], target: float
) -> float:
    """``overall``, or the lowest of the targeted tenants' attainments each shifted by
    ``target - its target`` where that is lower: ``>= target`` exactly when the overall
    attainment and every targeted tenant's meet their targets, and it falls on as the
    worst of them falls, so a search for where it crosses ``target`` finds where the
    first of them breaks. A tenant with a target and no calls in the run holds."""
    # As target + the smallest margin, so that a tenant exactly at its target holds
    # exactly (0.99 + (0.9 - 0.99) is a hair below 0.9 in floating point).
    margin = overall - target
    for name, want in targets.items():
        if name in tenants:
            margin = min(margin, tenants[name] - want)
    return overall if margin == overall - target else target + margin


def routes_held_attainment(
    routes: Mapping[str, float],
    route_wants: Mapping[str, float],
    tenants: Mapping[str, float],
    targets: Mapping[str, float],
    target: float,
) -> float:
    """:func:`held_attainment` for a workload of several routes (each served by its own
    pool): ``target`` plus the smallest margin of each route over its own target and of
    each targeted tenant over its target, so it is ``>= target`` exactly when every route
    and every targeted tenant holds. The overall attainment does not take part: a route
    whose classes ask for less need not reach the strictest class's target."""
    margins = [routes[name] - want for name, want in route_wants.items() if name in routes]
    margins += [tenants[name] - want for name, want in targets.items() if name in tenants]
    return target + min(margins, default=0.0)


def sweep_point(
    spec: WorkloadSpec, factor: float, seed: int, workload: CompiledWorkload, result: SimResult
) -> SweepPoint:
    """The point of one finished simulation of ``spec`` at ``factor``."""
    duration = workload.duration_s
    targets = tenant_targets(spec)
    tenants = {
        g.name: g.slo_attainment
        for g in result.by_tenant
        if g.name in targets and g.calls and g.slo_attainment is not None
    }
    return SweepPoint(
        load_factor=factor,
        seed=seed,
        offered_tasks_per_s=workload.num_tasks / duration,
        offered_calls_per_s=workload.num_calls / duration,
        slo_attainment=result.slo.attainment,
        goodput_per_s=result.slo.goodput_per_s,
        task_attainment=result.slo.task_attainment,
        verified_goodput_per_s=result.slo.verified_goodput_per_s,
        ttft_p99_s=result.latencies.ttft.p99_s,
        tpot_p99_s=result.latencies.tpot.p99_s,
        e2e_p99_s=result.latencies.e2e.p99_s,
        throughput_requests_per_s=result.throughput.requests_per_s,
        output_tokens_per_s=result.throughput.output_tokens_per_s,
        preemptions=result.engine.preemptions,
        tenant_attainment=tenants,
        held_attainment=_held(spec, result, tenants, targets),
    )


def _held(
    spec: WorkloadSpec, result: SimResult, tenants: dict[str, float], targets: dict[str, float]
) -> float | None:
    """The point's :attr:`SweepPoint.held_attainment` (None: the overall attainment)."""
    target = attainment_target(spec)
    if len(spec.routes) > 1:
        return routes_held_attainment(
            route_attainment(result), route_targets(spec), tenants, targets, target
        )
    if targets:
        return held_attainment(result.slo.attainment, tenants, targets, target)
    return None


def run_point(
    spec: WorkloadSpec,
    cluster: ClusterSpec,
    factor: float,
    seed: int,
    traces: Mapping[str, TraceData] | None = None,
) -> SweepPoint:
    """Simulate one load level (runs in a worker process)."""
    workload = compile_workload(scale_workload(spec, factor), seed=seed, traces=traces)
    result, _ = simulate_compiled(workload, cluster)
    return sweep_point(spec, factor, seed, workload, result)


PointRunner = Callable[[Sequence[float]], list[SweepPoint]]


class KneePoint(Protocol):
    """What the knee search reads from a point (simulated or measured by ``bench``)."""

    @property
    def load_factor(self) -> float: ...
    @property
    def slo_attainment(self) -> float: ...
    @property
    def offered_tasks_per_s(self) -> float: ...
    @property
    def offered_calls_per_s(self) -> float: ...
    @property
    def throughput_requests_per_s(self) -> float: ...


P = TypeVar("P", bound=KneePoint)


def executor_runner(
    spec: WorkloadSpec,
    cluster: ClusterSpec,
    seed: int,
    executor: PointExecutor,
    traces: Mapping[str, TraceData] | None = None,
) -> PointRunner:
    """Run load factors on ``executor``, points in the factors' order."""

    def run(factors: Sequence[float]) -> list[SweepPoint]:
        return executor.map(run_point, [(spec, cluster, f, seed, traces) for f in factors])

    return run


def search_knee(
    run: Callable[[Sequence[float]], list[P]],
    target: float,
    *,
    jobs: int = 1,
    start: float = 1.0,
    tolerance: float = 0.02,
    max_rounds: int = 12,
    attainment: Callable[[P], float] | None = None,
) -> tuple[Knee, list[P]]:
    """Bracket and narrow the largest load factor whose attainment is at least ``target``.

    ``run`` maps load factors to points: simulated (:func:`executor_runner`) or measured.
    ``attainment`` reads a point's attainment (default: its overall ``slo_attainment``;
    the plan passes :attr:`SweepPoint.attainment_held`, which holds tenant targets too).
    """
    points: list[P] = []

    def ok(p: P) -> bool:
        return (p.slo_attainment if attainment is None else attainment(p)) >= target

    first = run([start])[0]
    points.append(first)
    lo_p: P | None = first if ok(first) else None
    hi_p: P | None = None if ok(first) else first
    factor = start
    for _ in range(max_rounds):  # bracket by doubling (or halving)
        if lo_p is not None and hi_p is not None:
            break
        factor = factor * 2 if hi_p is None else factor / 2
        p = run([factor])[0]
        points.append(p)
        if ok(p):
            before = lo_p
            lo_p = p if lo_p is None or p.load_factor > lo_p.load_factor else lo_p
            if (
                hi_p is None
                and before is not None
                and p.throughput_requests_per_s
                < SATURATION_GROWTH * before.throughput_requests_per_s
            ):
                at = p.throughput_requests_per_s
                return _knee(target, lo_p, None, lo_p, "saturated", at), points
        else:
            hi_p = p if hi_p is None or p.load_factor < hi_p.load_factor else hi_p
    if lo_p is None or hi_p is None:
        edge = lo_p or hi_p
        assert edge is not None
        return _knee(target, lo_p, hi_p, edge, "max_rounds"), points

    def narrow(lo: P, hi: P) -> bool:
        return hi.load_factor - lo.load_factor <= tolerance * lo.load_factor

    for _ in range(max_rounds):
        if narrow(lo_p, hi_p):
            break
        k = max(1, jobs)
        step = (hi_p.load_factor - lo_p.load_factor) / (k + 1)
        batch = run([lo_p.load_factor + step * (i + 1) for i in range(k)])
        points.extend(batch)
        for p in sorted(batch, key=lambda q: q.load_factor):
            if ok(p) and p.load_factor > lo_p.load_factor:
                lo_p = p
        for p in sorted(batch, key=lambda q: q.load_factor, reverse=True):
            if not ok(p) and p.load_factor < hi_p.load_factor and p.load_factor > lo_p.load_factor:
                hi_p = p
    stopped: KneeStop = "narrowed" if narrow(lo_p, hi_p) else "max_rounds"
    return _knee(target, lo_p, hi_p, lo_p, stopped), points


def _knee(
    target: float,
    lo: KneePoint | None,
    hi: KneePoint | None,
    edge: KneePoint,
    stopped: KneeStop,
    saturation_calls_per_s: float | None = None,
) -> Knee:
    found = lo is not None
    at = lo if lo is not None else edge
    return Knee(
        target=target,
        load_factor=at.load_factor if found else 0.0,
        upper_load_factor=hi.load_factor if hi is not None else math.inf,
        offered_tasks_per_s=at.offered_tasks_per_s if found else 0.0,
        offered_calls_per_s=at.offered_calls_per_s if found else 0.0,
        found=found,
        stopped=stopped,
        saturation_calls_per_s=saturation_calls_per_s,
    )


def sweep(
    spec: WorkloadSpec,
    cluster: ClusterSpec,
    *,
    factors: Sequence[float] | None = None,
    search: bool = False,
    seed: int | None = None,
    jobs: int = 1,
    traces: Mapping[str, TraceData] | None = None,
    tolerance: float = 0.02,
    executor: PointExecutor | None = None,
) -> SweepResult:
    """Simulate each load factor, or search for the knee (which needs a latency SLO), on
    ``executor`` (default: ``jobs`` local processes). ``jobs`` is also the search's points
    per round, so the same ``jobs`` finds the same knee on any executor."""
    if search:
        require_latency_slo(spec, "`sweep --search`")
    seed = spec.seed if seed is None else seed
    own = executor is None
    runs_on = LocalExecutor(jobs) if executor is None else executor
    try:
        run = executor_runner(spec, cluster, seed, runs_on, traces)
        points = run(list(factors)) if factors else []
        knee = None
        if search:
            knee, searched = search_knee(
                run, attainment_target(spec), jobs=jobs, tolerance=tolerance,
                attainment=lambda p: p.attainment_held,
            )  # fmt: skip
            points.extend(searched)
    finally:
        if own:
            runs_on.close()
    unique = {p.load_factor: p for p in points}
    return SweepResult(
        schema=SCHEMA,
        workload=spec.name,
        cluster_replicas=cluster.replicas,
        points=[unique[f] for f in sorted(unique)],
        knee=knee,
    )
