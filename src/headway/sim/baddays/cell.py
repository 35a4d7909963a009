"""One cell of the bad-day matrix: a scenario's workload and cluster under one gateway
preset, simulated (in a worker process or a Ray task), and what it cost: goodput,
attainment, tails, sheds, amplification and cost per successful task.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import msgspec

from headway.core.trace_data import TraceData
from headway.core.workload.compile import compile_workload
from headway.core.workload.spec import WorkloadSpec
from headway.sim.cluster import ClusterSpec
from headway.sim.faults import ReplicaLost
from headway.sim.gateway import GatewayPreset
from headway.sim.results import SimResult
from headway.sim.run import simulate_compiled
from headway.sim.simulator import SimOptions


class BadDayCell(msgspec.Struct, frozen=True, kw_only=True):
    """One scenario under one gateway preset."""

    scenario: str
    preset: str
    offered_calls: int
    offered_tasks: int
    goodput_per_s: float
    """Calls that met their SLO, per second."""
    slo_attainment: float
    """Calls that met their SLO / calls of the workload (shed, timed out and cancelled
    calls count as misses)."""
    task_attainment: float
    """Tasks that met their deadline / tasks offered."""
    verified_goodput_per_s: float
    """Tasks that met their deadline, per second."""
    ttft_p99_s: float | None
    e2e_p99_s: float | None
    shed: int
    top_shed_reason: str | None
    """The most frequent shed reason (None when nothing was shed)."""
    shed_by_reason: dict[str, int]
    cancelled: int
    timed_out: int
    failed: int
    attempts: int
    amplification: float
    """Attempts / offered calls (retries and duplicates included)."""
    tasks_met_deadline: int
    replica_s: float
    """Replica-seconds the run paid for (see :func:`replica_seconds`; a replica lost to a
    fault is paid for until the run ends: a crash does not stop the bill)."""
    cost_per_successful_task: float | None
    """Replica-hours × price per replica-hour / tasks that met their deadline; None
    without a price or when no task met its deadline."""
    balanced: bool
    """Every offered call ended in exactly one terminal state."""
    note: str | None = None
    """What the figures do not say by themselves (a retry storm that did not form)."""
    degraded_calls: int = 0
    """Calls a degraded mode changed (``gateway.degraded``)."""


MODES_OFF: Final = "headway-default, modes off"
"""The label of the cells that run ``headway-default`` with the cluster's degraded modes
removed: beside its ``headway-default`` cell, what the modes buy."""


def replica_seconds(result: SimResult) -> tuple[float, str]:
    """Replica-seconds a run used, and how they were measured: the simulator's own count
    (``engine.replica_hours``, which follows lost replicas and the autoscaler) when it
    measured any, else the starting pool for the whole run (``replicas × end_s``)."""
    measured_h = result.engine.replica_hours
    if measured_h > 0:
        return measured_h * 3600.0, "engine"
    return float(result.engine.replicas) * result.end_s, "replicas × end_s"


def price_per_replica_hour(spec: WorkloadSpec, cluster: ClusterSpec) -> float | None:
    """The cluster's price, else the workload's first route's ``replica.price_per_hour``."""
    if cluster.price_per_replica_hour is not None:
        return cluster.price_per_replica_hour
    route = next(iter(spec.routes.values()))
    return None if route.replica is None else route.replica.price_per_hour


class CellJob(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker process (or a Ray task) needs to simulate one cell."""

    scenario: str
    preset: GatewayPreset
    spec: WorkloadSpec
    cluster: ClusterSpec
    seed: int
    price_per_replica_hour: float | None
    label: str | None = None
    """The cell's preset column (None: ``preset``)."""


def run_cell(
    job: CellJob, traces: Mapping[str, TraceData] | None, options: SimOptions | None
) -> tuple[BadDayCell, str]:
    """Simulate one cell (where the executor runs it); the cell and its replica-seconds
    basis."""
    workload = compile_workload(job.spec, seed=job.seed, traces=traces)
    result, _ = simulate_compiled(workload, job.cluster, options)
    a = result.accounting
    ranked = sorted(a.shed_by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    replica_s, basis = replica_seconds(result)
    if basis == "engine":  # the engine's count stops at a loss; the bill does not
        replica_s += sum(
            f.replicas * max(0.0, result.end_s - f.at_s)
            for f in job.cluster.faults
            if isinstance(f, ReplicaLost)
        )
    met = result.slo.tasks_met_deadline
    price = job.price_per_replica_hour
    cost = price * replica_s / 3600.0 / met if price is not None and met > 0 else None
    cell = BadDayCell(
        scenario=job.scenario,
        preset=job.label or job.preset,
        offered_calls=a.offered_calls,
        offered_tasks=result.slo.offered_tasks,
        goodput_per_s=result.slo.goodput_per_s,
        slo_attainment=result.slo.attainment,
        task_attainment=result.slo.task_attainment,
        verified_goodput_per_s=result.slo.verified_goodput_per_s,
        ttft_p99_s=result.latencies.ttft.p99_s,
        e2e_p99_s=result.latencies.e2e.p99_s,
        shed=a.shed,
        top_shed_reason=ranked[0][0] if ranked else None,
        shed_by_reason=dict(ranked),
        cancelled=a.cancelled,
        timed_out=a.timed_out,
        failed=a.failed,
        attempts=a.attempts,
        amplification=a.amplification,
        tasks_met_deadline=met,
        replica_s=replica_s,
        cost_per_successful_task=cost,
        balanced=a.balanced,
        note=_note(job.scenario, a.amplification),
        degraded_calls=result.degraded_calls,
    )
    return cell, basis


STORM_AMPLIFICATION: Final = 1.05
"""Below this many attempts per call, ``retry-storm`` did not make a storm."""


def _note(scenario: str, amplification: float) -> str | None:
    """A retry storm that did not form is a result to read, not a calm day: say so."""
    if "retry-storm" in scenario.split("+") and amplification < STORM_AMPLIFICATION:
        return (
            f"no storm formed: {amplification:.2f} attempts per call (the slowdown did not "
            "push first tokens past the clients' timeout)"
        )
    return None
