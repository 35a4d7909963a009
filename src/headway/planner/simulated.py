"""The simulated plan: replicas for the peak, the knee, the bursts replayed, the cost.

Stages, each a set of simulated points (:mod:`headway.planner.points`):

1. **Replica search**: the peak demand held steady (every source Poisson at its peak
   rate) on 1, 2, 4, ... replicas, then bisection, for the smallest count whose SLO
   attainment reaches the target, and every tenant with an ``attainment_target`` its own
   (:attr:`~headway.sim.sweep.SweepPoint.attainment_held`: the worst decides); the plan
   adds ``planning.failures_tolerated``. A cluster of pools or a disaggregated one gets
   one count per pool (:mod:`headway.planner.pool_search`).
2. **Knee**: on the planned cluster, the largest multiple of the peak rate that keeps
   attainment at target (bracketing and k-section, :func:`headway.sim.sweep.search_knee`),
   once per seed; the seeds give a 95% confidence interval.
3. **Bursts**: the workload as written on the planned cluster; its queue is measured
   through each overload episode of the fluid model and set against it.
4. **Cost**: replicas × price over the run / tasks that met their deadline.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from headway.core.engine.catalog import get_gpu
from headway.core.trace_data import TraceData
from headway.core.workload.spec import WorkloadSpec
from headway.executors import PointExecutor
from headway.planner import STAGES, STEADY_POINT_DURATION_S
from headway.planner.analytic import AnalyticPlan, Episode, fluid_episodes, source_profile
from headway.planner.demand import peak_rates
from headway.planner.points import PlanPoint, PointTask, Replay, run_replay, run_steady
from headway.planner.stability import StabilityCheck, stability_check
from headway.sim.cluster import ClusterSpec, pool_cluster, pool_replicas, with_pool_replicas
from headway.sim.sweep import Knee, SweepPoint, attainment_target, search_knee, tenant_targets


class PlanSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How much simulation a plan does."""

    seeds: int = 3
    """Seeds of the knee search (the confidence interval comes from their spread)."""
    steady_duration_s: float = STEADY_POINT_DURATION_S
    """Simulated length of each steady point."""
    knee_tolerance: float = 0.05
    """Relative width at which the knee search stops."""
    max_replicas: int = 256
    """The replica search gives up above this (in each pool of a cluster of pools or a
    disaggregated one)."""
    points_per_round: int = 2
    """Points each search round runs at once (fixed, so any executor finds the same plan)."""
    stages: tuple[str, ...] = STAGES
    """The simulated stages to run (:data:`STAGES`; ``plan --stages``): without
    ``replicas`` the cluster file's count is planned; without ``knee`` the plan has no
    knee; without ``bursts``, no replay of the workload as written (nor its cost); without
    ``bad-days``, no bad-day matrix on the planned cluster (``headway.sim.baddays``)."""


class ReplicaSearch(msgspec.Struct, frozen=True, kw_only=True):
    """Replicas against attainment at the steady peak demand."""

    target: float
    peak_tasks_per_s: float
    failures_tolerated: int
    holding_peak: int | None
    """Smallest count whose attainment at the peak reaches the target (None: none tried)."""
    recommended: int | None
    """``holding_peak + failures_tolerated``."""
    attainment_all_up: float | None
    """Attainment at the peak with every recommended replica up."""
    attainment_failures_lost: float | None
    """Attainment at the peak with ``failures_tolerated`` replicas lost."""
    trials: list[PlanPoint]
    tenant_targets: dict[str, float] = {}
    """The tenants with an ``attainment_target``, and their targets (each trial's
    ``sweep.tenant_attainment`` has their attainment)."""


class SeedKnee(msgspec.Struct, frozen=True, kw_only=True):
    """The knee one seed's search found."""

    seed: int
    knee: Knee
    knee_tasks_per_s: float
    """Where this seed's attainment crosses the target (:func:`crossing_load_factor`)."""
    upper_tasks_per_s: float | None
    points: int


class KneeEstimate(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The knee of the planned cluster, over seeds."""

    target: float
    replicas: int
    """Replicas in all (every pool's)."""
    peak_tasks_per_s: float
    found: bool
    tasks_per_s: float
    """Mean over seeds of the rate where attainment crosses the target (interpolated
    within each seed's bracket)."""
    tasks_per_s_low: float
    tasks_per_s_high: float
    """95% confidence interval of the mean (Student's t over seeds)."""
    load_factor: float
    """``tasks_per_s`` / peak."""
    saturation_tasks_per_s: float
    """Most tasks/s any point completed (capacity regardless of SLO)."""
    seeds: list[SeedKnee]
    pool_replicas: dict[str, int] = {}
    """Each pool's replicas (a cluster of pools or a disaggregated one; else left out)."""
    stability: StabilityCheck | None = None
    """μ, the KV stability boundary, beside the knee (one pool only)."""


class BurstCheck(msgspec.Struct, frozen=True, kw_only=True):
    """One overload episode: the fluid model against the replayed run."""

    source: str
    start_s: float
    overload_s: float
    peak_rate_per_s: float
    fluid_capacity_per_s: float
    fluid_backlog_tasks: float
    fluid_drain_s: float | None
    simulated_capacity_per_s: float | None
    """The source's share of the simulated saturation throughput."""
    fluid_at_simulated_backlog_tasks: float | None
    fluid_at_simulated_drain_s: float | None
    baseline_calls: float
    """Median calls in the system (queued or running) in the minute before the episode."""
    peak_calls: int
    """Most calls in the system during the overload."""
    measured_backlog_tasks: float
    """(peak − baseline) calls in the system / calls per task."""
    measured_drain_s: float | None
    """From the end of the overload until the calls in the system are back within 20% (+2)
    of the baseline (None: not within the run)."""
    window_start_s: float
    window_end_s: float


class Cost(msgspec.Struct, frozen=True, kw_only=True):
    """Cost per successful task of the replayed run."""

    price_per_replica_hour: float | None
    price_source: str
    replicas: int
    run_s: float
    successful_tasks: int
    cost_per_successful_task: float | None
    wasted_fraction: float = 0.0
    """Of the tokens the engines processed, the share no answer came of (losing branches,
    retried attempts, duplicates, cancelled calls): paid for in the cost above."""
    joules_per_slo_request: float | None = None
    """Energy beside cost: joules per call that met its SLO (None: a GPU's power is not
    known)."""
    joules_per_verified_outcome: float | None = None
    """Joules per task completed within its deadline with an accepted outcome."""


class PoolSize(msgspec.Struct, frozen=True, kw_only=True):
    """One pool's count at the steady peak."""

    name: str
    """The pool (``pools.<name>``), or ``prefill`` / ``decode``."""
    routes: list[str]
    """The routes it serves (every route for ``prefill`` and ``decode``)."""
    target: float
    """What its attainment is held to: its routes' strictest class target (prefill and
    decode: the whole workload's)."""
    holding_peak: int | None
    """Its smallest count that holds the peak, the other pools at theirs (None: none up
    to ``settings.max_replicas``)."""
    recommended: int | None
    """``holding_peak + failures_tolerated``."""
    attainment_failures_lost: float | None
    """Its attainment with every pool at ``holding_peak`` (a pool: its lowest route's,
    against that route's target; prefill and decode: the whole cluster's)."""
    attainment_all_up: float | None
    """The same with every pool at ``recommended``."""
    attainment_one_fewer: float | None
    """The same with this pool one below ``holding_peak``, the others at theirs (None:
    it holds with one): below its target, which shows the count is the smallest."""


class PoolsSearch(msgspec.Struct, frozen=True, kw_only=True):
    """The replica search of a cluster of pools or of a disaggregated one."""

    kind: Literal["pools", "disaggregation"]
    failures_tolerated: int
    """Added to each pool: a replica lost in every pool at once."""
    pools: list[PoolSize]
    holds: bool
    """Every pool holds its target with all at ``holding_peak``, in one run."""
    method: str
    """How the counts were searched, in words."""


class SimulatedPlan(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Everything the simulation found (stages left unfinished are None or empty)."""

    cluster: ClusterSpec
    cluster_source: str
    settings: PlanSettings
    replica_search: ReplicaSearch | None
    knee: KneeEstimate | None
    sweep: list[PlanPoint]
    """The first seed's knee-search points, sorted by load (the plots' curves)."""
    replay: Replay | None
    bursts: list[BurstCheck]
    cost: Cost | None
    pools: PoolsSearch | None = None
    """A cluster of pools or a disaggregated one: each pool's count (``replica_search``
    then holds their totals); left out for one pool."""


Counts = int | tuple[int, ...]
"""The replicas of a point: a count, or one count per pool (a cluster of pools, or a
disaggregated one's prefill and decode: :func:`~headway.sim.cluster.pool_replicas`'s
order)."""


@dataclass
class PointRunner:
    """Runs steady points on an executor, each (replicas, factor, seed) once."""

    spec: WorkloadSpec
    cluster: ClusterSpec
    settings: PlanSettings
    executor: PointExecutor
    on_points: Callable[[int], None] = lambda n: None
    peak_tasks_per_s: float = 0.0
    done: dict[tuple[Counts, float, int], PlanPoint] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.peak_tasks_per_s = sum(peak_rates(self.spec).values())

    def cluster_at(self, replicas: Counts) -> ClusterSpec:
        """The cluster of a point: the file's with ``replicas`` (one count per pool, or
        a count in all)."""
        if isinstance(replicas, tuple):
            return with_pool_replicas(self.cluster, replicas)
        return self.cluster

    def task(self, replicas: Counts, factor: float, seed: int, kind: str = "steady") -> PointTask:
        """The task of one point."""
        cluster = self.cluster_at(replicas)
        return PointTask(
            kind="replay" if kind == "replay" else "steady",
            spec=self.spec,
            cluster=cluster,
            replicas=cluster.replicas if isinstance(replicas, tuple) else replicas,
            load_factor=factor,
            seed=seed,
            duration_s=self.settings.steady_duration_s
            if kind == "steady"
            else self.spec.duration_s,
        )

    def steady(self, keys: Sequence[tuple[Counts, float, int]]) -> list[PlanPoint]:
        """Points for (replicas, load factor, seed) keys, computing the missing ones."""
        missing = list(dict.fromkeys(k for k in keys if k not in self.done))
        if missing:
            results = self.executor.map(
                run_steady, [(self.task(*k), self.peak_tasks_per_s) for k in missing]
            )
            self.done.update(zip(missing, results, strict=True))
            self.on_points(len(missing))
        return [self.done[k] for k in keys]


Search = Generator[list[int], list[bool], int | None]
"""A search over one replica count: it yields the counts to try next (one batch), is
sent whether each holds, and returns the smallest count that holds (None: none up to
its limit)."""


def smallest_count(limit: int, points_per_round: int) -> Search:
    """1, 2, 4, ... up to ``limit`` until a count holds, then :func:`narrow_count`."""
    bad, n = 0, 1
    while n <= limit:
        (holds,) = yield [n]
        if holds:
            return (yield from narrow_count(bad, n, points_per_round))
        bad, n = n, n * 2
    return None


def narrow_count(bad: int, good: int, points_per_round: int) -> Search:
    """k-section on the integers between a count that misses (``bad``; 0: none tried)
    and one that holds (``good``), ``points_per_round`` counts a batch: the smallest
    that holds."""
    while good - bad > 1:
        k = min(points_per_round, good - bad - 1)
        trial = sorted({bad + max(1, round((good - bad) * (i + 1) / (k + 1))) for i in range(k)})
        trial = [t for t in trial if bad < t < good]
        results = yield trial
        for t, holds in zip(trial, results, strict=True):
            if holds:
                good = min(good, t)
            else:
                bad = max(bad, t)
    return good


def run_search(search: Search, holds: Callable[[list[int]], list[bool]]) -> int | None:
    """Drive ``search`` with ``holds`` (counts to whether each holds) to its answer."""
    try:
        batch = next(search)
        while True:
            batch = search.send(holds(batch))
    except StopIteration as done:
        result: int | None = done.value
        return result


def search_replicas(runner: PointRunner) -> ReplicaSearch:
    """Smallest replica count that holds the steady peak at target, plus failover."""
    spec, settings = runner.spec, runner.settings
    target = attainment_target(spec)
    seed = spec.seed
    failures = spec.planning.failures_tolerated

    def holds(counts: list[int]) -> list[bool]:
        points = runner.steady([(n, 1.0, seed) for n in counts])
        return [p.sweep.attainment_held >= target for p in points]

    good = run_search(smallest_count(settings.max_replicas, settings.points_per_round), holds)
    if good is not None:
        curve = range(max(1, good - 2), good + failures + 2)
        runner.steady([(r, 1.0, seed) for r in curve])
    trials = sorted(
        (p for (r, f, s), p in runner.done.items() if f == 1.0 and s == seed),
        key=lambda p: p.replicas,
    )
    recommended = None if good is None else good + failures
    by_count = {p.replicas: p for p in trials}
    return ReplicaSearch(
        target=target,
        peak_tasks_per_s=runner.peak_tasks_per_s,
        failures_tolerated=failures,
        holding_peak=good,
        recommended=recommended,
        attainment_all_up=by_count[recommended].sweep.slo_attainment
        if recommended in by_count
        else None,
        attainment_failures_lost=by_count[good].sweep.slo_attainment if good in by_count else None,
        trials=trials,
        tenant_targets=tenant_targets(spec),
    )


def _t95(n: int) -> float:
    """Student's t quantile 0.975 with n − 1 degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))


def knee_of_seed(runner: PointRunner, replicas: Counts, seed: int) -> SeedKnee:
    """One seed's knee search on ``replicas`` replicas."""
    target = attainment_target(runner.spec)

    def run(factors: Sequence[float]) -> list[SweepPoint]:
        return [p.sweep for p in runner.steady([(replicas, f, seed) for f in factors])]

    knee, searched = search_knee(
        run,
        target,
        jobs=runner.settings.points_per_round,
        tolerance=runner.settings.knee_tolerance,
        attainment=lambda p: p.attainment_held,
    )
    peak = runner.peak_tasks_per_s
    return SeedKnee(
        seed=seed,
        knee=knee,
        knee_tasks_per_s=crossing_load_factor(knee, searched) * peak,
        upper_tasks_per_s=knee.upper_load_factor * peak
        if math.isfinite(knee.upper_load_factor)
        else None,
        points=len(searched),
    )


def crossing_load_factor(knee: Knee, points: Sequence[SweepPoint]) -> float:
    """Where attainment crosses the target between the bracket's two points, by linear
    interpolation of their attainments. The bracket's lower end alone is a point of the
    search grid that every seed tends to land on, so an interval over seeds of it was
    zero wide (616-616) whatever the run-to-run variance; the crossing moves with each
    seed's attainments. The lower end when the bracket is open (not found, saturated)."""
    if not knee.found or not math.isfinite(knee.upper_load_factor):
        return knee.load_factor
    by_load = {p.load_factor: p.attainment_held for p in points}
    low = by_load.get(knee.load_factor)
    high = by_load.get(knee.upper_load_factor)
    if low is None or high is None or low <= high:
        return knee.load_factor
    share = min(max((low - knee.target) / (low - high), 0.0), 1.0)
    return knee.load_factor + share * (knee.upper_load_factor - knee.load_factor)


def combine_knees(runner: PointRunner, replicas: Counts, seeds: list[SeedKnee]) -> KneeEstimate:
    """The knee over seeds: mean and a 95% t-interval."""
    rates = [s.knee_tasks_per_s for s in seeds]
    mean = statistics.fmean(rates)
    half = (
        _t95(len(rates)) * statistics.stdev(rates) / math.sqrt(len(rates))
        if len(rates) > 1
        else 0.0
    )
    peak = runner.peak_tasks_per_s
    saturation = max(
        (p.completed_tasks_per_s for (r, _, _), p in runner.done.items() if r == replicas),
        default=0.0,
    )
    cluster = runner.cluster_at(replicas)
    count = cluster.replicas if isinstance(replicas, tuple) else replicas
    return KneeEstimate(
        target=attainment_target(runner.spec),
        replicas=count,
        pool_replicas=pool_replicas(cluster) if isinstance(replicas, tuple) else {},
        peak_tasks_per_s=peak,
        found=all(s.knee.found for s in seeds),
        tasks_per_s=mean,
        tasks_per_s_low=max(0.0, mean - half),
        tasks_per_s_high=mean + half,
        load_factor=mean / peak if peak else 0.0,
        saturation_tasks_per_s=saturation,
        seeds=seeds,
        stability=stability_check(runner.spec, cluster, count, mean),
    )


def replay(runner: PointRunner, replicas: Counts, traces: Mapping[str, TraceData] | None) -> Replay:
    """The workload as written on ``replicas`` replicas."""
    task = runner.task(replicas, 1.0, runner.spec.seed, kind="replay")
    result = runner.executor.map(run_replay, [(task, traces)])[0]
    runner.on_points(1)
    return result


def _median(values: list[int]) -> float:
    return float(statistics.median(values)) if values else 0.0


def check_bursts(
    spec: WorkloadSpec,
    analytic: AnalyticPlan,
    run: Replay,
    knee: KneeEstimate | None,
) -> list[BurstCheck]:
    """Each fluid-model episode against the queue measured in the replayed run."""
    checks = []
    peaks = peak_rates(spec)
    total_peak = sum(peaks.values()) or 1.0
    calls_per_task = analytic.periods[-1].calls_per_task or 1.0
    t, load = run.series.time_s, run.series.in_system_calls
    for e in analytic.bursts:
        source = next(s for s in spec.sources if s.name == e.source)
        sim_capacity = None
        sim_episode: Episode | None = None
        if knee is not None and knee.saturation_tasks_per_s > 0:
            sim_capacity = knee.saturation_tasks_per_s * peaks[source.name] / total_peak
            profile = source_profile(source, spec.duration_s)
            if profile is not None:
                episodes = fluid_episodes(profile, sim_capacity, source.name, e.unit)
                overlapping = [
                    x for x in episodes if x.start_s < e.start_s + e.overload_s and (
                        x.drain_s is None or x.start_s + x.overload_s + x.drain_s > e.start_s
                    )
                ]  # fmt: skip
                sim_episode = max(overlapping, key=lambda x: x.backlog, default=None)
        growth_end = e.start_s + e.overload_s
        window = [(ti, q) for ti, q in zip(t, load, strict=True)]
        before = [q for ti, q in window if e.start_s - 60 <= ti < e.start_s]
        baseline = _median(before)
        threshold = baseline * 1.2 + 2.0
        peak_q = max((q for ti, q in window if e.start_s <= ti <= growth_end + 1e-9), default=0)
        cleared_at = next((ti for ti, q in window if ti >= growth_end and q <= threshold), None)
        drain = None if cleared_at is None else cleared_at - growth_end
        fluid_total = (e.drain_s or 0.0) + e.overload_s
        end = growth_end + max(60.0, 1.5 * (drain if drain is not None else fluid_total))
        checks.append(
            BurstCheck(
                source=e.source,
                start_s=e.start_s,
                overload_s=e.overload_s,
                peak_rate_per_s=e.peak_rate_per_s,
                fluid_capacity_per_s=e.capacity_per_s,
                fluid_backlog_tasks=e.backlog,
                fluid_drain_s=e.drain_s,
                simulated_capacity_per_s=sim_capacity,
                fluid_at_simulated_backlog_tasks=(
                    sim_episode.backlog if sim_episode else (0.0 if sim_capacity else None)
                ),
                fluid_at_simulated_drain_s=(
                    sim_episode.drain_s if sim_episode else (0.0 if sim_capacity else None)
                ),
                baseline_calls=baseline,
                peak_calls=peak_q,
                measured_backlog_tasks=max(0.0, peak_q - baseline) / calls_per_task,
                measured_drain_s=drain,
                window_start_s=max(0.0, e.start_s - 30.0),
                window_end_s=min(run.duration_s, end),
            )
        )
    return checks


def replica_price(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[float | None, str]:
    """Price of one replica-hour and where it came from: the cluster's, the route's, the
    GPU catalog's × tensor parallel. A cluster of pools: each pool's own (its routes',
    else its GPU's), averaged over the replicas."""
    if cluster.price_per_replica_hour is not None:
        return cluster.price_per_replica_hour, "the cluster's price_per_replica_hour"
    if cluster.pools:
        return _pools_price(spec, cluster)
    for name, route in spec.routes.items():
        if route.replica is not None and route.replica.price_per_hour is not None:
            return route.replica.price_per_hour, f"routes.{name}.replica.price_per_hour"
    gpu = get_gpu(cluster.gpu)
    if gpu.price_per_hour is not None:
        return gpu.price_per_hour * cluster.tensor_parallel, f"the {gpu.name} catalog price"
    return None, "no price given (set routes.<name>.replica.price_per_hour)"


def _pools_price(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[float | None, str]:
    """The replicas' mean price over the pools, each pool priced by its own routes and
    GPU (:func:`replica_price` of the pool alone)."""
    total, sources = 0.0, []
    for name, pool in cluster.pools.items():
        routes = {r: spec.routes[r] for r in pool.routes if r in spec.routes}
        alone = msgspec.structs.replace(spec, routes=routes or spec.routes)
        price, source = replica_price(alone, pool_cluster(cluster, name))
        if price is None:
            return None, f"pool {name}: {source}"
        total += price * pool.replicas
        sources.append(f"pool {name}: {source}")
    return total / cluster.replicas, "; ".join(sources) + " (averaged over the replicas)"


def cost_of(spec: WorkloadSpec, cluster: ClusterSpec, run: Replay) -> Cost:
    """Replicas × price over the run / tasks that met their deadline."""
    price, source = replica_price(spec, cluster)
    per_task = None
    if price is not None and run.tasks_met_deadline:
        per_task = run.replicas * price * run.duration_s / 3600 / run.tasks_met_deadline
    return Cost(
        price_per_replica_hour=price,
        price_source=source,
        replicas=run.replicas,
        run_s=run.duration_s,
        successful_tasks=run.tasks_met_deadline,
        cost_per_successful_task=per_task,
        wasted_fraction=run.wasted_fraction,
        joules_per_slo_request=run.joules_per_slo_request,
        joules_per_verified_outcome=run.joules_per_verified_outcome,
    )
