"""Analytic against simulated, figure by figure, with the reason where they disagree.

A figure whose two answers differ by more than :data:`DISAGREE` (relative) gets reasons
drawn from the simulation's own evidence: batching (the simulated engine's per-replica
throughput against the declared one), headroom (the planning factor), variance (tails
missing the SLO below saturation), prefill interference (TTFT is the bound that breaks,
with long prompts) and memory admission (KV occupancy and preemptions).
"""

from __future__ import annotations

import msgspec

from headway.core.workload.spec import WorkloadSpec
from headway.planner.analytic import AnalyticPlan, Period
from headway.planner.points import PlanPoint
from headway.planner.simulated import SimulatedPlan

DISAGREE = 0.2
"""Relative difference above which the report explains the gap."""


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """One figure, both ways."""

    figure: str
    unit: str
    analytic: float | None
    simulated: float | None
    relative_difference: float | None
    """(simulated − analytic) / analytic."""
    differs: bool
    reasons: list[str]


def _rel(a: float | None, s: float | None) -> float | None:
    if a is None or s is None or a == 0:
        return None
    return (s - a) / a


def _near_knee(sim: SimulatedPlan) -> tuple[PlanPoint | None, PlanPoint | None]:
    """The sweep points at and just above the knee."""
    if sim.knee is None or not sim.sweep:
        return None, None
    lf = sim.knee.seeds[0].knee.load_factor
    below = [p for p in sim.sweep if p.sweep.load_factor <= lf + 1e-12]
    above = [p for p in sim.sweep if p.sweep.load_factor > lf + 1e-12]
    return (below[-1] if below else None), (above[0] if above else None)


def output_tokens_per_s_per_replica(sim: SimulatedPlan) -> float | None:
    """Output tokens/s one simulated replica decodes at the knee (None: no knee)."""
    at, _ = _near_knee(sim)
    if at is None or sim.knee is None:
        return None
    return at.sweep.output_tokens_per_s / max(1, sim.knee.replicas)


def _capacity_reasons(spec: WorkloadSpec, peak: Period, sim: SimulatedPlan) -> list[str]:
    reasons: list[str] = []
    _, over = _near_knee(sim)
    cluster = sim.cluster
    declared = [
        (name, route.replica.output_tokens_per_s)
        for name, route in spec.routes.items()
        if route.replica is not None and route.replica.output_tokens_per_s
    ]
    simulated = output_tokens_per_s_per_replica(sim)
    if simulated is not None and declared:
        name, per_replica = declared[0]
        model = (
            "the step-time model is your calibrated profile: one of the two figures is "
            "stale, or they were measured at other settings"
            if cluster.step_time == "profile"
            else "the step-time model is a roofline, not your engine: fit one with "
            "`headway calibrate` and pass it with --profile or in the cluster file"
        )
        if abs(simulated - per_replica) > DISAGREE * per_replica:
            reasons.append(
                f"batching: the simulated {cluster.model} on {cluster.gpu} decodes "
                f"{simulated:,.0f} output tokens/s per replica at the knee (batches of up to "
                f"{cluster.engine.max_num_seqs} sequences), against the {per_replica:,.0f} "
                f"declared in routes.{name}.replica; {model}"
            )
    if spec.planning.planning_factor < 1:
        reasons.append(
            f"headroom: the analytic count plans each replica at "
            f"{spec.planning.planning_factor:.0%} of its measured capacity; the simulation "
            "only asks that SLO attainment stay at target"
        )
    if sim.knee is not None and sim.knee.saturation_tasks_per_s > 0:
        utilization = sim.knee.tasks_per_s / sim.knee.saturation_tasks_per_s
        if utilization < 0.85:
            reasons.append(
                f"variance: attainment falls below target at {utilization:.0%} of the "
                "throughput the cluster reaches saturated; Poisson arrivals and spread in "
                "lengths make tails miss the SLO before the average is at capacity"
            )
    if over is not None:
        bounds = [c.slo.ttft_s for c in spec.classes.values() if c.slo.ttft_s is not None]
        heavy_prompts = peak.input_tokens_per_s > 4 * peak.output_tokens_per_s
        ttft_p99 = over.ttft.p99_s
        if bounds and heavy_prompts and ttft_p99 is not None and ttft_p99 > min(bounds):
            reasons.append(
                "prefill interference: past the knee TTFT is the bound that breaks "
                f"(p99 {ttft_p99:.2f} s against {min(bounds):g} s); prompts carry "
                f"{peak.input_tokens_per_s / max(peak.output_tokens_per_s, 1e-9):.1f}× the "
                "output tokens, and their prefill chunks share steps with decodes"
            )
        if over.kv_usage_max >= 0.95 or over.sweep.preemptions > 0:
            reasons.append(
                f"memory admission: past the knee KV occupancy reaches {over.kv_usage_max:.0%} "
                f"with {over.sweep.preemptions} preemptions; requests wait for KV blocks, not "
                "for compute"
            )
    return reasons


def _analytic_counts(peak: Period, sim: SimulatedPlan) -> tuple[float, float] | None:
    """The analytic plan's replicas (all up, with failures tolerated) for what the
    simulation sized: the first sized route for one pool; for pools the sum over every
    route (each pool with its own failures tolerated), None unless every route is sized;
    None for prefill and decode pools (the analytic plan sizes colocated replicas)."""
    pools = sim.pools
    if pools is None:
        sizing = next((r.sizing for r in peak.routes if r.sizing is not None), None)
        return None if sizing is None else (sizing.replicas, sizing.replicas_with_failover)
    sizings = [r.sizing for r in peak.routes]
    if pools.kind != "pools" or any(s is None for s in sizings):
        return None
    held = sum(s.replicas for s in sizings if s is not None)
    return held, held + pools.failures_tolerated * len(pools.pools)


def compare(spec: WorkloadSpec, analytic: AnalyticPlan, sim: SimulatedPlan) -> list[Comparison]:
    """The side-by-side rows."""
    peak = analytic.periods[-1]
    counts = _analytic_counts(peak, sim)
    rows: list[tuple[str, str, float | None, float | None, list[str]]] = []
    capacity_reasons = _capacity_reasons(spec, peak, sim)
    search = sim.replica_search
    if search is not None:
        rows.append(
            (
                "replicas that hold the peak",
                "replicas",
                float(counts[0]) if counts else None,
                float(search.holding_peak) if search.holding_peak is not None else None,
                capacity_reasons,
            )
        )
        rows.append(
            (
                "replicas with failures tolerated",
                "replicas",
                float(counts[1]) if counts else None,
                float(search.recommended) if search.recommended is not None else None,
                capacity_reasons,
            )
        )
    knee = sim.knee
    out_per_task = peak.output_tokens_per_s / peak.tasks_per_s if peak.tasks_per_s else 0.0
    declared = [
        r.replica.output_tokens_per_s
        for r in spec.routes.values()
        if r.replica is not None and r.replica.output_tokens_per_s
    ]
    if knee is not None:
        analytic_capacity = (
            knee.replicas * declared[0] / out_per_task
            if declared and out_per_task and sim.pools is None
            else None
        )
        rows.append(
            (
                f"tasks/s that {knee.replicas} replicas carry",
                "tasks/s",
                analytic_capacity,
                knee.tasks_per_s,
                capacity_reasons,
            )
        )
    for b in sim.bursts[:3]:
        burst_reasons = []
        if b.simulated_capacity_per_s is not None:
            burst_reasons.append(
                f"capacity: the fluid model drains at the declared {b.fluid_capacity_per_s:g} "
                f"tasks/s; the simulated cluster completes up to "
                f"{b.simulated_capacity_per_s:.3g} tasks/s (its fluid figures: backlog "
                f"{b.fluid_at_simulated_backlog_tasks or 0:.0f}, drain "
                f"{b.fluid_at_simulated_drain_s or 0:.0f} s)"
            )
        burst_reasons.append(
            "batching: a backlog grows the batch, and a bigger batch decodes more tokens per "
            "second, so a real queue drains faster than a fixed-rate fluid; patience and "
            "cancellations remove work the fluid model keeps"
        )
        at = f"burst at {b.start_s:g} s"
        rows.append(
            (
                f"{at}: backlog",
                "tasks",
                b.fluid_backlog_tasks,
                b.measured_backlog_tasks,
                burst_reasons,
            )
        )
        rows.append((f"{at}: drain", "s", b.fluid_drain_s, b.measured_drain_s, burst_reasons))
    cost, run = sim.cost, sim.replay
    if cost is not None and cost.cost_per_successful_task is not None and run is not None:
        # Both sides price the same replayed run: the analytic plan's count (with its
        # failover) for the run's length over every offered task, against the simulated
        # count over the tasks that met their deadline. (The busy period's own cost per
        # task, at its own smaller count, is not the run's: it read -65% here.)
        price = cost.price_per_replica_hour
        analytic_cost = (
            counts[1] * price * cost.run_s / 3600.0 / run.offered_tasks
            if counts is not None and price is not None and run.offered_tasks > 0
            else None
        )
        success = (
            f"success: the simulated cost divides by tasks that met their deadline "
            f"({run.task_attainment:.1%} of offered), the analytic by every offered task"
        )
        replicas = (
            f"replicas: the analytic count is {counts[1]:g}, the simulated {cost.replicas}"
            if counts is not None
            else "replicas: each side prices its own replica count"
        )
        rows.append(
            (
                f"cost per task over the replayed {cost.run_s:g} s",
                "$",
                analytic_cost,
                cost.cost_per_successful_task,
                [success, replicas],
            )
        )
    result = []
    for figure, unit, a, s, reasons in rows:
        rel = _rel(a, s)
        differs = rel is not None and abs(rel) > DISAGREE
        result.append(
            Comparison(
                figure=figure,
                unit=unit,
                analytic=a,
                simulated=s,
                relative_difference=rel,
                differs=differs,
                reasons=reasons if differs else [],
            )
        )
    return result
