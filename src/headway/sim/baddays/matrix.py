"""The matrix of gateway presets × bad-day scenarios.

:func:`run_bad_days` applies each scenario to the workload at the requested load,
simulates it under each gateway preset on an executor (:mod:`headway.executors`: worker
processes or Ray) and returns a :class:`BadDayMatrix`, one :class:`BadDayCell` per
(scenario, preset). The same seed gives the same matrix, whichever executor ran it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import get_args

import msgspec

from headway.core.errors import ConfigError
from headway.core.trace_data import TraceData
from headway.core.workload.scale import scale_workload
from headway.core.workload.spec import WorkloadSpec
from headway.executors import LocalExecutor, PointExecutor
from headway.sim.baddays.catalogue import DEFAULT_SCENARIOS, SCENARIOS, did_you_mean, get_scenario
from headway.sim.baddays.cell import (
    MODES_OFF,
    BadDayCell,
    CellJob,
    price_per_replica_hour,
    run_cell,
)
from headway.sim.cluster import ClusterSpec
from headway.sim.gateway import GatewayConfig, GatewayPreset
from headway.sim.simulator import SimOptions

_R = msgspec.structs.replace

SCHEMA = "headway.bad-days/1"

PRESETS: tuple[GatewayPreset, ...] = get_args(GatewayPreset)
"""Every gateway preset, the matrix's default columns: the baseline most deployments run
(``fifo-unbounded``) and ``headway-default``."""


def check_presets(presets: Sequence[str]) -> list[GatewayPreset]:
    known: dict[str, GatewayPreset] = {p: p for p in PRESETS}
    checked: list[GatewayPreset] = []
    for name in presets:
        preset = known.get(name)
        if preset is None:
            raise ConfigError(
                f"unknown gateway preset {name!r}; {did_you_mean(name, known)}choose from "
                f"{', '.join(PRESETS)}"
            )
        checked.append(preset)
    if not checked:
        raise ConfigError(f"no gateway preset given; choose from {', '.join(PRESETS)}")
    return checked


class ScenarioInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A scenario of the matrix, as run."""

    name: str
    summary: str
    changes: str
    changed: bool
    """False when the scenario found nothing to change in this workload and cluster (say,
    ``slow-tool`` on a workload without tool calls): its cells repeat the baseline."""


class BadDayMatrix(msgspec.Struct, frozen=True, kw_only=True):
    """Gateway presets × bad-day scenarios for one workload on one cluster."""

    schema: str
    workload: str
    seed: int
    duration_s: float
    load_factor: float
    cluster_replicas: int
    price_per_replica_hour: float | None
    """The price used for cost per successful task (the cluster's, else the workload's
    first route's ``replica.price_per_hour``)."""
    replica_s_basis: str
    """How ``replica_s`` was measured: ``engine`` (the simulator's replica-hours) or
    ``replicas × end_s`` (the starting pool for the whole run)."""
    presets: list[str]
    scenarios: list[ScenarioInfo]
    cells: list[BadDayCell]
    """Scenario-major: every preset of the first scenario, then the next scenario."""

    def cell(self, scenario: str, preset: str) -> BadDayCell:
        """The cell of ``scenario`` under ``preset``."""
        for c in self.cells:
            if c.scenario == scenario and c.preset == preset:
                return c
        raise KeyError(f"no cell for scenario {scenario!r} under preset {preset!r}")


def run_bad_days(
    spec: WorkloadSpec,
    cluster: ClusterSpec,
    *,
    presets: Sequence[str] = PRESETS,
    scenarios: Sequence[str] = DEFAULT_SCENARIOS,
    load: float = 1.0,
    jobs: int = 1,
    duration_s: float | None = None,
    seed: int | None = None,
    traces: Mapping[str, TraceData] | None = None,
    options: SimOptions | None = None,
    on_cell: Callable[[BadDayCell], None] | None = None,
    executor: PointExecutor | None = None,
) -> BadDayMatrix:
    """Simulate every scenario under every gateway preset on ``executor`` (default:
    ``jobs`` local worker processes; 1: in this process).

    The workload is first given ``duration_s`` (default: its own) and scaled to ``load``;
    each scenario (a name, or names joined by ``+``) is applied to that, and the cluster's
    ``gateway.preset`` is then set to each preset, its other gateway settings kept (with
    ``gateway.degraded``, ``headway-default`` also runs with the modes removed, the
    :data:`~headway.sim.baddays.cell.MODES_OFF` cells: what the modes buy). Every
    cell uses ``seed`` (default: the workload's), so the same inputs give the same
    matrix. ``on_cell`` is called in this process as each cell finishes (for progress).
    """
    if not (math.isfinite(load) and load > 0):
        raise ConfigError(f"load must be > 0 (got {load}); 1 is the file's load")
    if jobs < 1:
        raise ConfigError(f"jobs must be >= 1 (got {jobs})")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ConfigError(f"duration_s must be > 0 (got {duration_s})")
    checked = check_presets(presets)
    chosen = [get_scenario(name) for name in scenarios]
    if not chosen:
        raise ConfigError(f"no bad-day scenario given; choose from {', '.join(SCENARIOS)}")
    base = spec if duration_s is None else _R(spec, duration_s=duration_s)
    base = scale_workload(base, load) if load != 1 else base
    run_seed = spec.seed if seed is None else seed
    infos: list[ScenarioInfo] = []
    work: list[CellJob] = []
    for scenario in chosen:
        s_spec, s_cluster = scenario.apply(base, cluster)
        infos.append(
            ScenarioInfo(
                name=scenario.name,
                summary=scenario.summary,
                changes=scenario.changes,
                changed=(s_spec, s_cluster) != (base, cluster),
            )
        )
        price = price_per_replica_hour(s_spec, s_cluster)
        for preset in checked:
            gateway = _R(s_cluster.gateway, preset=preset)
            variants: list[tuple[GatewayConfig, str | None]] = [(gateway, None)]
            if preset == "headway-default" and gateway.degraded is not None:
                variants.append((_R(gateway, degraded=None), MODES_OFF))
            work.extend(
                CellJob(
                    scenario=scenario.name,
                    preset=preset,
                    spec=s_spec,
                    cluster=_R(s_cluster, gateway=variant),
                    seed=run_seed,
                    price_per_replica_hour=price,
                    label=label,
                )
                for variant, label in variants
            )

    def done(_index: int, result: tuple[BadDayCell, str]) -> None:
        if on_cell is not None:
            on_cell(result[0])

    calls = [(job, traces, options) for job in work]
    runs_on = LocalExecutor(min(jobs, len(work))) if executor is None else executor
    try:
        results = runs_on.map(run_cell, calls, on_done=done)
    finally:
        if executor is None:
            runs_on.close()
    bases = sorted({basis for _, basis in results})
    return BadDayMatrix(
        schema=SCHEMA,
        workload=spec.name,
        seed=run_seed,
        duration_s=base.duration_s,
        load_factor=load,
        cluster_replicas=cluster.replicas,
        price_per_replica_hour=price_per_replica_hour(spec, cluster),
        replica_s_basis=", ".join(bases),
        presets=list(checked),
        scenarios=infos,
        cells=[cell for cell, _ in results],
    )
