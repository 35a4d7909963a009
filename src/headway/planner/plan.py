"""A whole plan: the analytic plan, the simulated stages, the comparison and the summary.

:func:`build_plan` runs the stages in order and reports progress; Ctrl-C
(``KeyboardInterrupt``) stops the stage in flight, and the plan keeps every stage that
finished (``complete`` false, ``interrupted`` naming the stage). Nothing here reads the
clock except ``created_at``: the same seed gives the same plan apart from it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Protocol

import msgspec

from headway import __version__
from headway.core.engine.catalog import get_model
from headway.core.errors import ConfigError
from headway.core.trace_data import TraceData
from headway.core.workload.spec import WorkloadSpec
from headway.core.workload.validate import require_latency_slo
from headway.executors import PointExecutor
from headway.planner import STAGES
from headway.planner.analytic import AnalyticPlan, plan_analytic
from headway.planner.answer import Answer, plan_answer
from headway.planner.compare import Comparison, compare
from headway.planner.growth import Growth, plan_growth
from headway.planner.points import PlanPoint, Replay
from headway.planner.pool_search import search_pools
from headway.planner.simulated import (
    BurstCheck,
    Cost,
    Counts,
    KneeEstimate,
    PlanSettings,
    PointRunner,
    PoolsSearch,
    ReplicaSearch,
    SeedKnee,
    SimulatedPlan,
    check_bursts,
    combine_knees,
    cost_of,
    knee_of_seed,
    replay,
    search_replicas,
)
from headway.planner.summary import summarize_bad_days, summarize_growth, summarize_plan
from headway.sim.baddays import DEFAULT_SCENARIOS, BadDayMatrix, get_scenario, run_bad_days
from headway.sim.cluster import (
    ClusterSpec,
    Pool,
    check_routes,
    pool_replicas,
    with_pool_replicas,
    with_replicas,
)

SCHEMA = "headway.plan/1"
DEFAULT_GPU = "h100"


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """``plan.json``: see ``docs/plan-json.md``."""

    schema: str
    workload: str
    description: str
    created_at: str
    headway_version: str
    complete: bool
    interrupted: str | None
    skipped: str | None
    """Why there is no simulation (``--analytic-only``, or no simulable model)."""
    summary: list[str]
    """The answer in sentences; the first leads with :attr:`answer`'s count."""
    answer: Answer
    """The replicas the plan recommends and what they rest on (a calibrated simulation,
    else the workload's measured per-replica capacity, else the uncalibrated one)."""
    analytic: AnalyticPlan
    simulated: SimulatedPlan | None
    comparison: list[Comparison]
    slo_bounds: dict[str, float | None]
    """The strictest bound of each latency over classes (``ttft``, ``tpot``, ``e2e``)."""
    bad_days: BadDayMatrix | None = None
    """The bad-day matrix on the planned cluster: the cluster's gateway preset and
    ``headway-default`` × every scenario (null with ``--analytic-only``, without a
    simulation, or when interrupted before it)."""
    growth: Growth | None = None
    """The growth what-if (``--growth G``): resource by resource, utilisation at the
    planned cluster, the growth at which each saturates, the first to saturate, and the
    replicas needed at ``G`` (null without ``--growth``)."""


class ClusterChoice(msgspec.Struct, frozen=True, kw_only=True):
    """The cluster to simulate, and where it came from."""

    spec: ClusterSpec | None
    source: str


class Progress(Protocol):
    """Where a plan reports its progress."""

    def stage(self, name: str, total: int) -> None:
        """A stage starts, expecting about ``total`` points."""
        ...

    def advance(self, points: int) -> None:
        """``points`` more points finished."""
        ...


class _Quiet:
    def stage(self, name: str, total: int) -> None:
        """Ignore."""

    def advance(self, points: int) -> None:
        """Ignore."""


def slo_bounds(spec: WorkloadSpec) -> dict[str, float | None]:
    """The strictest TTFT, TPOT and e2e bound over the workload's classes."""
    bounds: dict[str, float | None] = {}
    for key in ("ttft", "tpot", "e2e"):
        values = [getattr(c.slo, f"{key}_s") for c in spec.classes.values()]
        given = [v for v in values if v is not None]
        bounds[key] = min(given) if given else None
    return bounds


def default_cluster(spec: WorkloadSpec) -> ClusterChoice:
    """The model of the workload's first route with one, on an H100, TP 1; a workload of
    several routes gets a pool per route, each of its route's model (else the first's)."""
    model = next((r.model for r in spec.routes.values() if r.model), None) or "llama-3-8b"
    models = [model, *(r.model for r in spec.routes.values() if r.model)]
    for name in dict.fromkeys(models):
        try:
            get_model(name)
        except ConfigError:
            return ClusterChoice(
                spec=None,
                source=f"model {name!r} is not in the catalog; pass --cluster with a catalog "
                "model or one defined under `catalog.models`",
            )
    if len(spec.routes) > 1:
        pools = {
            name: Pool(routes=[name], replicas=1, model=route.model or model)
            for name, route in spec.routes.items()
        }
        return ClusterChoice(
            spec=ClusterSpec(model=model, gpu=DEFAULT_GPU, replicas=len(pools), pools=pools),
            source=f"default cluster: a pool per route ({', '.join(pools)}), each of its "
            f"route's model on one {DEFAULT_GPU} per replica with vLLM's default engine "
            "settings",
        )
    return ClusterChoice(
        spec=ClusterSpec(model=model, gpu=DEFAULT_GPU),
        source=f"default cluster: {model} on one {DEFAULT_GPU} per replica with vLLM's "
        "default engine settings (the workload route's model)",
    )


def build_plan(
    spec: WorkloadSpec,
    choice: ClusterChoice,
    executor: PointExecutor | None,
    *,
    settings: PlanSettings | None = None,
    traces: Mapping[str, TraceData] | None = None,
    progress: Progress | None = None,
    analytic_only: bool = False,
    growth: float | None = None,
) -> Plan:
    """Run the plan's stages on ``executor`` (the bad-day matrix too); an interrupted plan
    keeps what finished. A simulated plan needs a latency SLO
    (:class:`~headway.core.errors.WorkloadError` otherwise). ``growth``: add the growth
    what-if at that factor × today's peak (analytic, on the cluster's model)."""
    if not analytic_only:
        require_latency_slo(spec, "the plan's replica search")
    settings = settings or PlanSettings()
    progress = progress or _Quiet()
    analytic = plan_analytic(spec)
    what_if = plan_growth(spec, analytic, choice.spec, growth) if growth is not None else None
    skipped = None
    if analytic_only:
        skipped = "--analytic-only was given"
    elif choice.spec is None:
        skipped = choice.source
    elif executor is None:
        skipped = "no executor"
    sim: SimulatedPlan | None = None
    interrupted: str | None = None
    if skipped is None:
        assert choice.spec is not None
        assert executor is not None
        check_routes(choice.spec, list(spec.routes))
        sim, interrupted = _simulate(spec, analytic, choice, executor, settings, traces, progress)
    bad_days: BadDayMatrix | None = None
    if (
        sim is not None
        and executor is not None
        and interrupted is None
        and ("bad-days" in settings.stages)
    ):
        bad_days, interrupted = _bad_days(spec, sim, executor, settings, traces, progress)
    comparison = compare(spec, analytic, sim) if sim is not None else []
    answer = plan_answer(analytic, sim)
    return Plan(
        schema=SCHEMA,
        workload=spec.name,
        description=spec.description.strip(),
        created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        headway_version=__version__,
        complete=interrupted is None,
        interrupted=interrupted,
        skipped=skipped,
        summary=[
            *summarize_plan(
                analytic,
                sim,
                comparison,
                answer=answer,
                skipped=skipped,
                interrupted=interrupted,
            ),
            *summarize_bad_days(bad_days),
            *bad_days_left_out(bad_days, sim),
            *summarize_growth(what_if),
            *_stages_left_out(settings, sim),
            *_placeholder_slos(spec),
        ],
        answer=answer,
        analytic=analytic,
        simulated=sim,
        comparison=comparison,
        slo_bounds=slo_bounds(spec),
        bad_days=bad_days,
        growth=what_if,
    )


def _placeholder_slos(spec: WorkloadSpec) -> list[str]:
    """A line naming the classes whose SLO is ``trace fit``'s placeholder."""
    names = [n for n, c in spec.classes.items() if c.slo.placeholder]
    if not names:
        return []
    return [
        f"The SLO of {', '.join(f'classes.{n}' for n in names)} is a placeholder that "
        "`trace fit` wrote, not your promise: this plan holds it, and a plan on your "
        "promise may differ (edit the bounds and remove `placeholder`)."
    ]


def _stages_left_out(settings: PlanSettings, sim: SimulatedPlan | None) -> list[str]:
    """A line naming the simulated stages ``--stages`` left out (none when all ran)."""
    left = [s for s in STAGES if s not in settings.stages]
    if sim is None or not left:
        return []
    return [f"Not run (--stages): {', '.join(left)}; this plan holds the other stages only."]


def _bad_days(
    spec: WorkloadSpec,
    sim: SimulatedPlan,
    executor: PointExecutor,
    settings: PlanSettings,
    traces: Mapping[str, TraceData] | None,
    progress: Progress,
) -> tuple[BadDayMatrix | None, str | None]:
    """The bad-day matrix on the planned cluster (the recommended replicas), under the
    cluster's gateway preset and ``headway-default``, each cell as long as a steady
    point."""
    search = sim.replica_search
    counts = _planned_counts(sim)
    if counts:
        cluster = with_pool_replicas(sim.cluster, counts)
    else:
        replicas = (search.recommended if search is not None else None) or sim.cluster.replicas
        cluster = with_replicas(sim.cluster, replicas)
    presets: list[str] = list(dict.fromkeys((cluster.gateway.preset, "headway-default")))
    scenarios = list(DEFAULT_SCENARIOS)
    if counts:
        presets, scenarios = _runnable_cells(spec, cluster, presets, scenarios)
    progress.stage("bad days", len(presets) * len(scenarios))
    try:
        matrix = run_bad_days(
            spec,
            cluster,
            presets=presets,
            scenarios=scenarios,
            executor=executor,
            duration_s=settings.steady_duration_s,
            traces=traces,
            on_cell=lambda _cell: progress.advance(1),
        )
    except KeyboardInterrupt:
        return None, "the bad-day matrix"
    return matrix, None


def _planned_counts(sim: SimulatedPlan) -> tuple[int, ...]:
    """Each pool's planned count (the search's recommended, else the cluster file's);
    empty for one pool."""
    if sim.pools is not None and all(p.recommended is not None for p in sim.pools.pools):
        return tuple(p.recommended or 0 for p in sim.pools.pools)
    return tuple(pool_replicas(sim.cluster).values())


def _runnable_cells(
    spec: WorkloadSpec, cluster: ClusterSpec, presets: list[str], scenarios: list[str]
) -> tuple[list[str], list[str]]:
    """The presets and scenarios the simulator runs on ``cluster`` (pools and
    disaggregation do not run with every gateway, fault or autoscaler yet): a preset that
    fails on the baseline, and a scenario that fails under a kept preset, are left out."""

    def runs(scenario: str, preset: str) -> bool:
        try:
            _, changed = get_scenario(scenario).apply(spec, cluster)
            changed = msgspec.structs.replace(
                changed, gateway=msgspec.structs.replace(changed.gateway, preset=preset)
            )
            msgspec.convert(msgspec.to_builtins(changed), ClusterSpec)
        except (ValueError, msgspec.ValidationError):
            return False
        return True

    kept = [p for p in presets if runs("baseline", p)]
    return kept, [s for s in scenarios if all(runs(s, p) for p in kept)]


def bad_days_left_out(bad_days: BadDayMatrix | None, sim: SimulatedPlan | None) -> list[str]:
    """A line naming the presets and scenarios the plan's bad-day matrix could not run on
    a cluster of pools or a disaggregated one (none: it ran them all)."""
    if bad_days is None or sim is None or sim.pools is None:
        return []
    presets = [p for p in ("fifo-unbounded", "headway-default") if p not in bad_days.presets]
    ran = {s.name for s in bad_days.scenarios}
    scenarios = [s for s in DEFAULT_SCENARIOS if s not in ran]
    if not presets and not scenarios:
        return []
    what = "pools" if sim.pools.kind == "pools" else "a disaggregated cluster"
    parts = ([f"the {', '.join(presets)} gateway"] if presets else []) + (
        [f"the scenarios {', '.join(scenarios)}"] if scenarios else []
    )
    return [
        f"The bad-day matrix leaves out {' and '.join(parts)}: the simulator does not run "
        f"them on {what} yet."
    ]


def _fill_curve(runner: PointRunner, replicas: Counts, seed: int, knee: float) -> list[PlanPoint]:
    """The first seed's points plus a few below the knee, so the curves start low."""
    extra = [knee * f for f in (0.25, 0.5, 0.75)] if knee > 0 else [0.25, 0.5]
    runner.steady([(replicas, f, seed) for f in extra])
    points = [p for (r, _, s), p in runner.done.items() if r == replicas and s == seed]
    return sorted(points, key=lambda p: p.sweep.load_factor)


def _simulate(
    spec: WorkloadSpec,
    analytic: AnalyticPlan,
    choice: ClusterChoice,
    executor: PointExecutor,
    settings: PlanSettings,
    traces: Mapping[str, TraceData] | None,
    progress: Progress,
) -> tuple[SimulatedPlan, str | None]:
    assert choice.spec is not None
    runner = PointRunner(spec, choice.spec, settings, executor, progress.advance)
    search: ReplicaSearch | None = None
    knee: KneeEstimate | None = None
    sweep: list[PlanPoint] = []
    run: Replay | None = None
    bursts: list[BurstCheck] = []
    cost: Cost | None = None
    seeds: list[SeedKnee] = []
    pools: PoolsSearch | None = None
    stage = "the replica search"
    counts = tuple(pool_replicas(choice.spec).values())
    replicas: Counts = counts or choice.spec.replicas
    stages = settings.stages
    try:
        if "replicas" in stages and counts:
            progress.stage("replicas for the peak, pool by pool", 8 * len(counts))
            search, pools = search_pools(runner)
            if all(p.recommended is not None for p in pools.pools):
                replicas = tuple(p.recommended or 0 for p in pools.pools)
        elif "replicas" in stages:
            progress.stage("replicas for the peak", 8)
            search = search_replicas(runner)
            replicas = search.recommended or choice.spec.replicas
        for i in range(settings.seeds if "knee" in stages else 0):
            stage = f"the knee search (seed {i + 1} of {settings.seeds})"
            progress.stage(f"knee, seed {i + 1}/{settings.seeds}", 8)
            found = knee_of_seed(runner, replicas, spec.seed + i)
            seeds.append(found)
            if i == 0:
                sweep = _fill_curve(runner, replicas, spec.seed, found.knee.load_factor)
        if seeds:
            knee = combine_knees(runner, replicas, seeds)
        if "bursts" in stages:
            stage = "the burst replay"
            progress.stage("bursts replayed", 1)
            run = replay(runner, replicas, traces)
            bursts = check_bursts(spec, analytic, run, knee)
            cost = cost_of(spec, runner.cluster_at(replicas), run)
        stage = ""
    except KeyboardInterrupt:
        if seeds and knee is None:
            knee = combine_knees(runner, replicas, seeds)
        if not sweep:  # keep the first seed's finished points for the curves
            done = [p for (r, _, s), p in runner.done.items() if r == replicas and s == spec.seed]
            sweep = sorted(done, key=lambda p: p.sweep.load_factor)
    return (
        SimulatedPlan(
            cluster=choice.spec,
            cluster_source=choice.source,
            settings=settings,
            replica_search=search,
            knee=knee,
            sweep=sweep,
            replay=run,
            bursts=bursts,
            cost=cost,
            pools=pools,
        ),
        stage or None,
    )
