"""The executive summary: the plan's answer in a few plain sentences."""

from __future__ import annotations

import msgspec

from headway.core.engine.catalog import get_gpu, get_model
from headway.core.errors import ConfigError
from headway.planner.analytic import AnalyticPlan
from headway.planner.answer import Answer
from headway.planner.compare import Comparison, output_tokens_per_s_per_replica
from headway.planner.growth import Growth
from headway.planner.simulated import KneeEstimate, PoolsSearch, SimulatedPlan
from headway.planner.stability import DISAGREEMENT, StabilityCheck
from headway.sim.baddays import BadDayMatrix
from headway.sim.cluster import pool_cluster

_COUNT_WORDS = ("no replica", "one", "two", "three", "four", "five")


def _names(sim: SimulatedPlan) -> tuple[str, str]:
    """What the replicas are: the calibrated engine (its model, engine and hardware) when
    a profile sets the step times, else the cluster's model and GPU."""
    if sim.cluster.step_time == "profile" and sim.cluster.profile_of:
        return sim.cluster.profile_of, ""
    try:
        return get_model(sim.cluster.model).name, get_gpu(sim.cluster.gpu).name
    except ConfigError:
        return sim.cluster.model, sim.cluster.gpu


def _on(model: str, gpu: str) -> str:
    return f"{model} on {gpu}" if gpu else model


def _replicas(n: int) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"


def _lost(n: int) -> str:
    return _COUNT_WORDS[n] if n < len(_COUNT_WORDS) else str(n)


def _stability_line(c: StabilityCheck) -> str:
    """μ beside the knee, and the warning when they disagree."""
    line = (
        f"The KV stability boundary μ is {c.mu_tasks_per_s:.3g} tasks/s (knee/μ "
        f"{c.knee_over_mu:.2f}; analytic capacity {c.analytic_capacity_tasks_per_s:.3g})"
    )
    if c.warning:
        return f"{line}: the knee and μ differ by more than {DISAGREEMENT:.0%}, {c.warning}."
    return f"{line}."


def _knee_of(k: KneeEstimate) -> str:
    """``4 replicas``, or of pools ``5 replicas (agent 3, bulk 2)``."""
    if not k.pool_replicas:
        return _replicas(k.replicas)
    pools = ", ".join(f"{name} {n}" for name, n in k.pool_replicas.items())
    return f"{_replicas(k.replicas)} ({pools})"


def _capital(line: str) -> str:
    return line[:1].upper() + line[1:]


def _declared_line(analytic: AnalyticPlan, spec_route: str) -> str:
    """The count sized from the route's declared (measured) per-replica capacity."""
    peak = analytic.periods[-1]
    route = next(r for r in peak.routes if r.route == spec_route)
    sizing = route.sizing
    assert sizing is not None
    if sizing.limiting_phase == "prefill":
        per = sizing.planned_input_tokens_per_s_per_replica
        unit = "input"
    else:
        per = sizing.planned_output_tokens_per_s_per_replica
        unit = "output"
    factor = analytic.planning_factor
    measured = (per or 0.0) / factor if factor else 0.0
    base = (
        f"the {measured:,.0f} {unit} tokens/s per replica measured in "
        f"routes.{spec_route}.replica, planned at {factor:.0%}"
    )
    held = sizing.replicas
    if sizing.failures_tolerated:
        return (
            f"{_replicas(sizing.replicas_with_failover)} hold the peak of "
            f"{peak.tasks_per_s:.3g} tasks/s with {_lost(sizing.failures_tolerated)} lost "
            f"({held} hold it with all up), from {base}."
        )
    return (
        f"{_replicas(held)} {'holds' if held == 1 else 'hold'} the peak of "
        f"{peak.tasks_per_s:.3g} tasks/s, from {base}."
    )


def _simulated_line(sim: SimulatedPlan, model: str, gpu: str) -> str | None:
    """The simulation's count at the peak, in words."""
    search = sim.replica_search
    if search is None:
        return None
    if search.recommended is None:
        return (
            f"even {_replicas(max(p.replicas for p in search.trials))} of {_on(model, gpu)} "
            f"miss the {search.target:.0%} attainment target at the peak."
        )
    lost = search.failures_tolerated
    held = search.attainment_failures_lost
    all_up = search.attainment_all_up
    text = (
        f"{_replicas(search.recommended)} of {_on(model, gpu)} "
        f"{'holds' if search.recommended == 1 else 'hold'} the peak of "
        f"{search.peak_tasks_per_s:.3g} tasks/s at "
    )
    if lost and held is not None:
        text += f"{held:.0%} SLO attainment with {_lost(lost)} lost"
        text += f" ({all_up:.0%} with all up)." if all_up is not None else "."
    else:
        text += f"{all_up or held or 0:.0%} SLO attainment."
    return text


TENANT_GAP = 0.05
"""Without tenant targets, a tenant this far below the overall attainment of the workload
as written is named: an overall figure hides the tenants that miss."""


def _tenant_lines(sim: SimulatedPlan) -> list[str]:
    """Per-tenant attainment beside the overall one: the targeted tenants at the peak on
    the planned cluster, and any tenant the workload as written leaves below its target
    (or, without targets, far below the overall attainment)."""
    search = sim.replica_search
    targets = search.tenant_targets if search is not None else {}
    lines: list[str] = []
    if search is not None and targets and search.trials:
        by_count = {p.replicas: p for p in search.trials}
        if sim.pools is not None:  # several trials may share a total: the planned pools'
            planned = {p.name: p.recommended for p in sim.pools.pools}
            by_count.update((p.replicas, p) for p in search.trials if p.pool_replicas == planned)
        at = search.recommended if search.recommended in by_count else max(by_count)
        point = by_count[at].sweep
        cells = ", ".join(
            f"{name} {point.tenant_attainment[name]:.1%} (target {want:.0%})"
            for name, want in targets.items()
            if name in point.tenant_attainment
        )
        if cells:
            lines.append(
                f"Per tenant at the peak on {_replicas(at)}: {cells}; overall "
                f"{point.slo_attainment:.1%}."
            )
    replay = sim.replay
    if replay is None:
        return lines
    tenants = {t.name: t.slo_attainment for t in replay.tails if t.segment == "tenant"}
    where = f"In the workload as written (bursts included) on {_replicas(replay.replicas)}"
    if targets:
        missing = [
            f"{name} {tenants[name]:.1%} (target {want:.0%})"
            for name, want in targets.items()
            if tenants.get(name) is not None and (tenants[name] or 0.0) < want
        ]
        lines.append(
            f"{where}, tenants below their target: {', '.join(missing)}."
            if missing
            else f"{where}, every tenant with a target meets it."
        )
    elif len(tenants) > 1:
        low = [
            (name, a)
            for name, a in tenants.items()
            if a is not None and a < replay.slo_attainment - TENANT_GAP
        ]
        if low:
            low.sort(key=lambda na: na[1])
            named = ", ".join(f"{name} {a:.1%}" for name, a in low[:3])
            lines.append(
                f"{where}, overall attainment {replay.slo_attainment:.1%} hides tenants far "
                f"below it: {named}; give a tenant an attainment_target to plan for it."
            )
    return lines


def _pool_names(sim: SimulatedPlan, pool: str) -> tuple[str, str]:
    """What one pool's replicas are (its own model and GPU where the file gives them)."""
    if pool not in sim.cluster.pools:
        return _names(sim)
    return _names(msgspec.structs.replace(sim, cluster=pool_cluster(sim.cluster, pool)))


def pool_counts(counts: list[tuple[str, int, int]], lost: int, label: str = "pool ") -> str:
    """``pool agent: 3 replicas (4 with one lost); pool bulk: 2 (3)`` for (name, all up,
    with ``lost`` lost in each pool)."""
    parts = []
    for i, (name, held, planned) in enumerate(counts):
        count = _replicas(held) if i == 0 else str(held)
        if lost:
            extra = f" ({planned} with {_lost(lost)} lost)" if i == 0 else f" ({planned})"
        else:
            extra = ""
        parts.append(f"{label}{name}: {count}{extra}")
    return "; ".join(parts)


def _pools_line(sim: SimulatedPlan, pools: PoolsSearch) -> str | None:
    """The simulation's count of each pool at the peak, in words."""
    search = sim.replica_search
    if search is None:
        return None
    label = "pool " if pools.kind == "pools" else ""
    missing = [p for p in pools.pools if p.holding_peak is None]
    if missing:
        names = ", ".join(f"{label}{p.name}" for p in missing)
        return (
            f"{names} {'misses' if len(missing) == 1 else 'miss'} the attainment target at "
            f"the peak even with {_replicas(sim.settings.max_replicas)} "
            f"{'in each' if pools.kind == 'pools' else 'of prefill and of decode'}."
        )
    lost = pools.failures_tolerated
    counts = [(p.name, p.holding_peak or 0, p.recommended or 0) for p in pools.pools]
    models = {_on(*_pool_names(sim, p.name)) for p in pools.pools}
    of = f" of {models.pop()}" if len(models) == 1 else ""
    text = (
        f"{pool_counts(counts, lost, label)}{of}: {_replicas(search.holding_peak or 0)} in all "
        f"hold the peak of {search.peak_tasks_per_s:.3g} tasks/s"
    )
    if pools.kind == "disaggregation":
        text += f" at {search.attainment_failures_lost or 0:.0%} SLO attainment"
        if lost:
            text += f", {search.recommended} with {_lost(lost)} lost in each of prefill and decode"
        text += "."
    else:
        held = ", ".join(
            f"pool {p.name} {p.attainment_failures_lost or 0:.0%}" for p in pools.pools
        )
        if lost:
            text += f", {search.recommended} with {_lost(lost)} lost in each pool"
        text += f", each pool at its routes' SLO attainment target ({held})."
    if not pools.holds:
        text += " Run together, the counts miss the target in a pool: see the trials."
    return text


def _pools_declared_line(analytic: AnalyticPlan, answer: Answer) -> str:
    """Each pool's count sized from its routes' declared (measured) capacity."""
    peak = analytic.periods[-1]
    counts = [(a.pool, a.holding_peak or 0, a.replicas or 0) for a in answer.pools]
    lost = (answer.replicas or 0) - (answer.holding_peak or 0)
    per_pool = lost // len(counts) if counts else 0
    return (
        f"{pool_counts(counts, per_pool)} hold the peak of {peak.tasks_per_s:.3g} tasks/s, from "
        "the per-replica capacity measured in each route's routes.<name>.replica, planned at "
        f"{analytic.planning_factor:.0%}."
    )


def _answer_lines(analytic: AnalyticPlan, sim: SimulatedPlan, answer: Answer) -> list[str]:
    """The headline: the count the plan leads with, and what it rests on."""
    if sim.pools is not None:
        return _pools_answer_lines(analytic, sim, sim.pools, answer)
    model, gpu = _names(sim)
    simulated = _simulated_line(sim, model, gpu)
    if answer.basis == "calibrated":
        return [f"Calibrated simulation: {simulated}"] if simulated else []
    if answer.basis == "measured" and answer.route is not None:
        lines = [_declared_line(analytic, answer.route)]
        per_replica = output_tokens_per_s_per_replica(sim)
        speed = (
            f", {per_replica:,.0f} output tokens/s per replica at the knee"
            if per_replica is not None
            else ""
        )
        if simulated:
            lines.append(
                f"Uncalibrated, the simulation (a roofline of {model} on {gpu}{speed}, not "
                f"your engine) finds that {simulated} Your measurement wins: to simulate "
                "your engine, fit it with `headway calibrate` and pass --profile."
            )
        return lines
    if not simulated:
        return []
    return [
        f"Uncalibrated simulation: {simulated}",
        f"Its step times come from a roofline of {model} on {gpu}, not from your engine: "
        "fit it with `headway calibrate` and pass --profile, or declare a measured "
        "routes.<name>.replica.output_tokens_per_s, which the plan then leads with.",
    ]


def _pools_answer_lines(
    analytic: AnalyticPlan, sim: SimulatedPlan, pools: PoolsSearch, answer: Answer
) -> list[str]:
    """The headline of a cluster of pools or a disaggregated one: each pool's count."""
    simulated = _pools_line(sim, pools)
    if not simulated:
        return []
    if answer.basis == "calibrated":
        return [f"Calibrated simulation: {simulated}"]
    if answer.basis == "measured":
        return [
            _pools_declared_line(analytic, answer),
            f"Uncalibrated, the simulation (a roofline, not your engine) finds: {simulated} "
            "Your measurement wins: to simulate your engine, fit it with `headway "
            "calibrate` and pass --profile.",
        ]
    lines = [f"Uncalibrated simulation: {simulated}"]
    if pools.kind == "disaggregation":
        lines.append(
            "Its step times come from a roofline, not from your engine: fit it with "
            "`headway calibrate` and pass --profile; a capacity measured on colocated "
            "replicas (routes.<name>.replica) sizes no prefill or decode pool."
        )
    else:
        lines.append(
            "Its step times come from a roofline, not from your engine: fit it with "
            "`headway calibrate` and pass --profile, or declare a measured "
            "routes.<name>.replica.output_tokens_per_s for every route, which the plan "
            "then leads with."
        )
    return lines


def summarize_plan(
    analytic: AnalyticPlan,
    sim: SimulatedPlan | None,
    comparison: list[Comparison],
    *,
    answer: Answer,
    skipped: str | None,
    interrupted: str | None,
) -> list[str]:
    """Sentences for the top of the report and the terminal; the first is the answer."""
    lines: list[str] = []
    peak = analytic.periods[-1]
    sizing = next((r.sizing for r in peak.routes if r.sizing is not None), None)
    if sim is None:
        if sizing is not None:
            lines.append(
                f"The analytic plan needs {_replicas(sizing.replicas)} at the peak of "
                f"{peak.tasks_per_s:.3g} tasks/s, {sizing.replicas_with_failover} with "
                f"{_lost(sizing.failures_tolerated)} lost."
            )
        if skipped:
            lines.append(f"Not simulated: {skipped}.")
        return lines
    lines += [_capital(line) for line in _answer_lines(analytic, sim, answer)]
    lines += _tenant_lines(sim)
    if sim.knee is not None:
        k = sim.knee
        interval = (
            f" (95% interval {k.tasks_per_s_low:.3g}–{k.tasks_per_s_high:.3g} over "
            f"{len(k.seeds)} seeds, each where its attainment crosses the target, "
            "interpolated between the two loads that bracket it)"
            if len(k.seeds) > 1
            else ""
        )
        saturated = [s for s in k.seeds if s.knee.stopped == "saturated"]
        if saturated:
            lines.append(
                f"The SLO does not limit {_knee_of(k)}: attainment stays at target "
                f"up to saturation, {k.saturation_tasks_per_s:.3g} tasks/s completed (the "
                f"knee search stopped there, at {saturated[0].knee.load_factor:.3g}× the "
                "peak); tighten the SLO to plan for latency."
            )
        elif k.found:
            lines.append(
                f"The knee of {_knee_of(k)} is {k.tasks_per_s:.3g} tasks/s{interval}, "
                f"{k.load_factor:.2g}× the peak (a steady load at the peak's mix, bursts "
                "left out; `headway sweep --search` scales the file as written, bursts "
                "included)."
            )
        else:
            lines.append(_capital(f"{_knee_of(k)} miss the target even at a fraction of the peak."))
        if k.stability is not None:
            lines.append(_stability_line(k.stability))
    if sim.bursts:
        b = max(sim.bursts, key=lambda x: x.fluid_backlog_tasks)
        ratio = b.peak_rate_per_s / peak.tasks_per_s if peak.tasks_per_s else 0.0
        head = (
            f"A {b.overload_s:g} s burst to {b.peak_rate_per_s:g} tasks/s ({ratio:.2g}× the peak)"
        )
        fluid = f"{b.fluid_drain_s:.0f} s" if b.fluid_drain_s is not None else "never"
        if b.measured_drain_s is None:
            lines.append(f"{head} is still queued when the run ends (fluid model: {fluid}).")
        elif b.peak_calls <= b.baseline_calls * 1.2 + 2:
            lines.append(f"{head} is absorbed without a queue (fluid model: drains in {fluid}).")
        else:
            lines.append(
                f"{head} clears {b.measured_drain_s:.0f} s after it ends, with "
                f"{b.measured_backlog_tasks:.0f} tasks above normal at worst (fluid model: "
                f"{b.fluid_backlog_tasks:.0f} tasks, {fluid})."
            )
    if sim.cost is not None and sim.cost.cost_per_successful_task is not None:
        c = sim.cost.cost_per_successful_task
        lines.append(f"A successful task costs ${c:.4g} (${c * 1000:.3g} per thousand).")
    differs = [c for c in comparison if c.differs]
    if differs and sizing is not None and answer.basis == "measured":
        lines.append(
            f"{len(differs)} figures of the uncalibrated simulation differ from the analytic "
            "plan by more than 20% (reasons in \u201cAnalytic and simulated\u201d)."
        )
    elif differs and sizing is not None:
        lines.append(
            f"The analytic plan asks for {_replicas(sizing.replicas_with_failover)}; "
            f"{len(differs)} figures differ from the simulation by more than 20% "
            "(reasons in \u201cAnalytic and simulated\u201d)."
        )
    if sim.cluster_source.startswith("default"):
        lines.append(
            f"No --cluster given: the simulation used the {sim.cluster_source}; give "
            "--cluster for your own."
        )
    if interrupted:
        lines.append(f"Stopped during {interrupted}: the figures above are what had finished.")
    return lines


def summarize_bad_days(matrix: BadDayMatrix | None) -> list[str]:
    """One sentence: the worst bad day of each preset, by SLO attainment."""
    if matrix is None or not matrix.cells:
        return []
    parts = []
    for preset in matrix.presets:
        cells = [c for c in matrix.cells if c.preset == preset and c.scenario != "baseline"]
        if not cells:
            continue
        worst = min(cells, key=lambda c: c.slo_attainment)
        parts.append(f"{worst.slo_attainment:.0%} under {preset} ({worst.scenario})")
    if not parts:
        return []
    return [f"On the worst bad day SLO attainment falls to {'; '.join(parts)}."]


def _factor(value: float) -> str:
    return f"{value:.3g}×"


def summarize_growth(growth: Growth | None) -> list[str]:
    """The growth what-if in two sentences: what saturates first and at what growth, and
    what the asked growth needs (replicas, and the fixed limits replicas cannot fix)."""
    if growth is None:
        return []
    if growth.binding is None or growth.binding_growth is None:
        first = "Growth: no resource with a known capacity saturates."
    else:
        first = (
            f"Growth: {growth.binding} saturates first, at {_factor(growth.binding_growth)} "
            "today's peak."
        )
    needs = "; ".join(
        f"route {r.route} {_replicas(r.replicas)} ("
        + (
            f"{r.replicas_with_failover} with {_lost(r.replicas_with_failover - r.replicas)} lost, "
            if r.replicas_with_failover > r.replicas
            else ""
        )
        + f"limited by {r.limited_by})"
        for r in growth.routes
    )
    second = f"At {_factor(growth.factor)}: {needs or 'no route to size'}"
    if growth.fixed_limits_exceeded:
        second += (
            "; limits that replicas cannot fix: " + ", ".join(growth.fixed_limits_exceeded) + "."
        )
    elif any(r.fixed for r in growth.resources):
        second += "; every fixed external limit holds."
    else:
        second += "; the workload declares no fixed external limit."
    return [first, second]
