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
from headway.planner.simulated import (
    BurstCheck,
    Cost,
    KneeEstimate,
    PlanSettings,
    PointRunner,
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
from headway.sim.baddays import DEFAULT_SCENARIOS, BadDayMatrix, run_bad_days
from headway.sim.cluster import ClusterSpec, with_replicas

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
    """The model of the workload's first route with one, on an H100, TP 1."""
    model = next((r.model for r in spec.routes.values() if r.model), None) or "llama-3-8b"
    try:
        get_model(model)
    except ConfigError:
        return ClusterChoice(
            spec=None,
            source=f"model {model!r} is not in the catalog; pass --cluster with a catalog "
            "model or one defined under `catalog.models`",
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
    elif choice.spec.disaggregation is not None:
        skipped = (
            "the cluster is disaggregated (prefill/decode pools); the plan's replica search "
            "does not size two pools yet: simulate it with `headway simulate`, or plan the "
            "colocated cluster"
        )
    elif choice.spec.pools or len(spec.routes) > 1:
        skipped = (
            f"the workload has {len(spec.routes)} routes ({', '.join(spec.routes)}), each "
            "needing its own pool of replicas; the plan's replica search sizes one pool: the "
            "analytic plan sizes each route, and `headway simulate --cluster` runs a cluster "
            "file with `pools:`"
        )
    elif executor is None:
        skipped = "no executor"
    sim: SimulatedPlan | None = None
    interrupted: str | None = None
    if skipped is None:
        assert choice.spec is not None
        assert executor is not None
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
    replicas = (search.recommended if search is not None else None) or sim.cluster.replicas
    cluster = with_replicas(sim.cluster, replicas)
    presets = list(dict.fromkeys((cluster.gateway.preset, "headway-default")))
    progress.stage("bad days", len(presets) * len(DEFAULT_SCENARIOS))
    try:
        matrix = run_bad_days(
            spec,
            cluster,
            presets=presets,
            executor=executor,
            duration_s=settings.steady_duration_s,
            traces=traces,
            on_cell=lambda _cell: progress.advance(1),
        )
    except KeyboardInterrupt:
        return None, "the bad-day matrix"
    return matrix, None


def _fill_curve(runner: PointRunner, replicas: int, seed: int, knee: float) -> list[PlanPoint]:
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
    stage = "the replica search"
    replicas = choice.spec.replicas
    stages = settings.stages
    try:
        if "replicas" in stages:
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
            cost = cost_of(spec, choice.spec, run)
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
        ),
        stage or None,
    )
