"""Bad days: seed 002's "Inject bad days" list as named, composable scenarios, and the
matrix of gateway presets × scenarios that ``headway simulate --bad-days`` prints.

A :class:`Scenario` is a value: a name, a one-line summary, what it changes, and a pure
``apply(spec, cluster) -> (spec, cluster)`` that returns modified copies
(``msgspec.structs.replace``), so scenarios compose by applying them in order
(:func:`compose`; ``a+b`` on the command line). Every time a scenario sets (a fault, a
burst window) is a fraction of the workload's ``duration_s``, so a two-minute run sees the
same bad day as a ten-minute one. :func:`run_bad_days` applies each scenario to the
workload at the requested load, simulates it under each gateway preset on an executor
(:mod:`headway.executors`: worker processes or Ray), and returns a :class:`BadDayMatrix`:
goodput, attainment, tails, sheds, amplification and cost per successful task for every
(scenario, preset) cell. The same seed gives the same matrix, whichever executor ran it.

The scenarios (seed 002: "one provider or replica pool unavailable; cache cold after
deploy; prompts twice normal length; retry storm from a downstream timeout; large tenant
burst; autoscaler delayed; tool latency feeding back into agent concurrency"):

==========================  ==============================================================
``baseline``                nothing changed
``replica-lost-prefill``    half the replicas (at least one, one survives) fail at a third
                            of the run, at a step with prefill work
``replica-lost-decode``     the same, at a decode-only step
``cache-cold``              prefix caches flushed at the start and after a deploy mid-run
``long-prompts``            every class's prompts twice as long
``retry-storm``             steps 3× slower for a window; clients time out and retry with
                            no retry budget
``tenant-burst``            the largest tenant sends 5× its rate for a window
``autoscaler``              the reference for ``autoscaler-delayed``: the cluster's
                            autoscaler, or a default one, on time
``autoscaler-delayed``      the same autoscaler, detecting and starting replicas 3× later
``slow-tool``               tool calls (and downstream services) 5× slower
==========================  ==============================================================
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, get_args

import msgspec
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from headway import executors
from headway.core.errors import ConfigError
from headway.core.policy.autoscaler import AutoscalerConfig
from headway.core.trace_data import TraceData
from headway.core.workload import distributions
from headway.core.workload.arrivals import RateProfile, apply_bursts, rate_profile
from headway.core.workload.compile import compile_workload
from headway.core.workload.scale import scale_workload
from headway.core.workload.spec import (
    Arrivals,
    Burst,
    Distribution,
    Empirical,
    Exponential,
    Fixed,
    Gamma,
    JointTokens,
    Lognormal,
    OnOff,
    Poisson,
    PoissonArrivals,
    Source,
    TaskClass,
    TraceReplay,
    Uniform,
    WorkloadSpec,
)
from headway.executors import LocalExecutor, PointExecutor
from headway.files.jsonout import to_json
from headway.files.output import write_text_atomic
from headway.sim.cluster import ClusterSpec
from headway.sim.faults import CacheFlush, ReplicaLost, Slowdown
from headway.sim.gateway import GatewayPreset
from headway.sim.results import SimResult
from headway.sim.run import simulate_compiled
from headway.sim.simulator import SimOptions

__all__ = [
    "DEFAULT_SCENARIOS",
    "PRESETS",
    "SCENARIOS",
    "SCHEMA",
    "BadDayCell",
    "BadDayMatrix",
    "Scenario",
    "ScenarioInfo",
    "compose",
    "get_scenario",
    "matrix_table",
    "mean_rate_per_s",
    "price_per_replica_hour",
    "reference_autoscaler",
    "replica_seconds",
    "run_bad_days",
    "scale_distribution",
    "storm_timeout_s",
    "tenant_rates_per_s",
]

SCHEMA = "headway.bad-days/1"

PRESETS: tuple[GatewayPreset, ...] = get_args(GatewayPreset)
"""Every gateway preset, the matrix's default columns: the baseline most deployments run
(``fifo-unbounded``) and ``headway-default``."""

EVENT_AT_FRACTION = 1 / 3
"""Faults and windows start a third of the way into the run: after a steady state, with
time left to see the recovery."""

WINDOW_FRACTION = 0.25
"""Windowed bad days (the storm's slowdown, the tenant's burst) last a quarter of the run."""

DEPLOY_AT_FRACTION = 0.5
"""``cache-cold``'s mid-run deploy, half way through."""

PROMPT_FACTOR = 2.0
"""``long-prompts``: prompts twice their normal length (seed 002)."""

STORM_SLOWDOWN_FACTOR = 3.0
"""``retry-storm``: steps take this many times longer during the window (the downstream
that clients time out on)."""

STORM_TIMEOUT_TTFT_MULTIPLE = 2.0
"""``retry-storm``: without a client timeout in the workload, clients give up on an attempt
after this many times the loosest ``ttft_s`` promise (no class times out before its own
first-token promise is broken twice over)."""

STORM_TIMEOUT_DEFAULT_S = 10.0
"""``retry-storm``'s client timeout when no class names a ``ttft_s`` or ``e2e_s``."""

STORM_MIN_ATTEMPTS = 3
"""``retry-storm``: clients make at least this many attempts (the first and two retries)."""

TENANT_BURST_FACTOR = 5.0
"""``tenant-burst``: the largest tenant's arrival rate, in multiples of its mean, during
the window."""

AUTOSCALER_DELAY_FACTOR = 3.0
"""``autoscaler-delayed``: detection and replica start-up take this many times longer."""

AUTOSCALER_REFERENCE_RUN_S = 600.0
"""The run length the default :class:`AutoscalerConfig` timings suit; an added default
autoscaler has its timings scaled by ``min(1, duration_s / this)`` so a short run still
sees it act."""

TOOL_SLOWDOWN_FACTOR = 5.0
"""``slow-tool``: tool calls and downstream service times take this many times longer."""

Transform = Callable[[WorkloadSpec, ClusterSpec], tuple[WorkloadSpec, ClusterSpec]]
"""A scenario's pure transformation of a workload and a cluster."""

_R = msgspec.structs.replace


# --------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named bad day: what it models (``summary``), what it changes in the workload and
    the cluster (``changes``), and the pure transformation that does it."""

    name: str
    summary: str
    changes: str
    transform: Transform

    def apply(self, spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
        """Modified copies of ``spec`` and ``cluster`` (the inputs are left as they were)."""
        return self.transform(spec, cluster)


def compose(*scenarios: Scenario) -> Scenario:
    """One scenario that applies ``scenarios`` in order (named ``a+b``)."""
    if not scenarios:
        raise ValueError("compose needs at least one scenario")
    if len(scenarios) == 1:
        return scenarios[0]
    parts = tuple(scenarios)

    def transform(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
        for scenario in parts:
            spec, cluster = scenario.apply(spec, cluster)
        return spec, cluster

    return Scenario(
        name="+".join(s.name for s in parts),
        summary="; ".join(s.summary for s in parts),
        changes=" Then: ".join(s.changes for s in parts),
        transform=transform,
    )


def _baseline(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    return spec, cluster


def _replica_lost(phase: str) -> Transform:
    def transform(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
        replicas = max(cluster.replicas, 2)
        lost = max(1, replicas // 2)
        fault = ReplicaLost(
            at_s=spec.duration_s * EVENT_AT_FRACTION,
            replicas=lost,
            phase="prefill" if phase == "prefill" else "decode",
        )
        return spec, _R(cluster, replicas=replicas, faults=[*cluster.faults, fault])

    return transform


def _cache_cold(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    flushes = [CacheFlush(at_s=0.0), CacheFlush(at_s=spec.duration_s * DEPLOY_AT_FRACTION)]
    return spec, _R(cluster, faults=[*cluster.faults, *flushes])


def scale_distribution(dist: Distribution, factor: float) -> Distribution:
    """``dist`` with every value multiplied by ``factor`` (> 0), caps included.

    Exact for every family but Poisson: a bare number, ``fixed``, ``uniform`` and
    ``empirical`` scale their values; ``lognormal``, ``gamma`` and ``exponential`` scale
    their mean and keep their CV, which is exactly ``factor × X``. A Poisson count keeps
    its family, so only its mean (not its variance) scales as ``factor × X`` would.
    ``min`` and ``max`` scale too, so a cap stays the same quantile.
    """
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"scale factor must be a finite number > 0 (got {factor})")
    if isinstance(dist, float | int):
        return float(dist) * factor
    caps = {
        "min": None if dist.min is None else dist.min * factor,
        "max": None if dist.max is None else dist.max * factor,
    }
    if isinstance(dist, Fixed):
        return _R(dist, value=dist.value * factor, **caps)
    if isinstance(dist, Lognormal | Gamma | Exponential | Poisson):
        return _R(dist, mean=dist.mean * factor, **caps)
    if isinstance(dist, Uniform):
        return _R(dist, low=dist.low * factor, high=dist.high * factor, **caps)
    assert isinstance(dist, Empirical)
    if dist.values is None:
        raise ConfigError(
            f"an empirical distribution still refers to trace {dist.trace!r}, so its values "
            "cannot be scaled; load the workload with headway.files.workload.load_workload, "
            "which inlines them"
        )
    return _R(dist, values=[v * factor for v in dist.values], **caps)


def _scale_joint(joint: JointTokens, factor: float) -> JointTokens:
    if joint.pairs is None:
        raise ConfigError(
            f"joint_tokens still refers to trace {joint.trace!r}, so its prompts cannot be "
            "scaled; load the workload with headway.files.workload.load_workload"
        )
    cap = joint.max_input_tokens
    return _R(
        joint,
        pairs=[(max(1, round(i * factor)), o) for i, o in joint.pairs],
        max_input_tokens=None if cap is None else max(1, round(cap * factor)),
    )


def _long_prompts(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    def longer(cls: TaskClass) -> TaskClass:
        joint = cls.joint_tokens
        return _R(
            cls,
            input_tokens=scale_distribution(cls.input_tokens, PROMPT_FACTOR),
            joint_tokens=None if joint is None else _scale_joint(joint, PROMPT_FACTOR),
        )

    return _R(spec, classes={k: longer(c) for k, c in spec.classes.items()}), cluster


def storm_timeout_s(spec: WorkloadSpec) -> float:
    """The per-attempt client timeout ``retry-storm`` uses when the workload has none."""
    ttfts = [c.slo.ttft_s for c in spec.classes.values() if c.slo.ttft_s is not None]
    if ttfts:
        return STORM_TIMEOUT_TTFT_MULTIPLE * max(ttfts)
    e2es = [c.slo.e2e_s for c in spec.classes.values() if c.slo.e2e_s is not None]
    return max(e2es) if e2es else STORM_TIMEOUT_DEFAULT_S


def _retry_storm(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    start_s = spec.duration_s * EVENT_AT_FRACTION
    slowdown = Slowdown(
        at_s=start_s,
        until_s=start_s + spec.duration_s * WINDOW_FRACTION,
        factor=STORM_SLOWDOWN_FACTOR,
    )
    retries = spec.clients.retries
    retries = _R(
        retries,
        timeout_s=retries.timeout_s if retries.timeout_s is not None else storm_timeout_s(spec),
        max_attempts=max(retries.max_attempts, STORM_MIN_ATTEMPTS),
        budget_ratio=None,
    )
    spec = _R(spec, clients=_R(spec.clients, retries=retries))
    return spec, _R(cluster, faults=[*cluster.faults, slowdown])


def mean_rate_per_s(arrivals: Arrivals, duration_s: float) -> float | None:
    """The mean arrival rate of a rate-based process over ``duration_s`` (bursts
    included; an on/off process at its long-run average); None for a trace replay, whose
    rate is in its file."""
    if isinstance(arrivals, TraceReplay):
        return None
    if isinstance(arrivals, OnOff):
        on_s = distributions.mean(arrivals.on_s)
        off_s = distributions.mean(arrivals.off_s)
        total = on_s + off_s
        base = (
            (arrivals.on_rate_per_s * on_s + arrivals.off_rate_per_s * off_s) / total
            if total > 0
            else arrivals.on_rate_per_s
        )
        flat = RateProfile(np.array([0.0, duration_s]), np.array([base]))
        return apply_bursts(flat, arrivals.bursts).mean_rate_per_s()
    return rate_profile(arrivals, duration_s).mean_rate_per_s()


def _tenant_shares(spec: WorkloadSpec, source: Source) -> dict[str, float]:
    shares = source.tenants or {name: t.share for name, t in spec.tenants.items()}
    total = sum(shares.values())
    return {name: v / total for name, v in shares.items()} if total > 0 else {}


def tenant_rates_per_s(spec: WorkloadSpec) -> dict[str, float]:
    """Each tenant's mean task arrival rate over the run, from the rate-based sources."""
    rates = dict.fromkeys(spec.tenants, 0.0)
    for source in spec.sources:
        rate = mean_rate_per_s(source.arrivals, spec.duration_s)
        if rate is None:
            continue
        for tenant, share in _tenant_shares(spec, source).items():
            rates[tenant] = rates.get(tenant, 0.0) + rate * share
    return rates


def _tenant_burst(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    rates = tenant_rates_per_s(spec)
    if not rates or max(rates.values()) <= 0:
        raise ConfigError(
            "tenant-burst: no tenant has traffic from a rate-based source (trace replays "
            "carry their rate in the file); add a source with an arrival rate, or leave "
            "tenant-burst out of --scenarios"
        )
    tenant = max(rates, key=lambda name: rates[name])  # the first of equals, in file order
    start_s = spec.duration_s * EVENT_AT_FRACTION
    window_s = spec.duration_s * WINDOW_FRACTION
    extra: list[Source] = []
    taken = {s.name for s in spec.sources}
    for source in spec.sources:
        rate = mean_rate_per_s(source.arrivals, spec.duration_s)
        share = _tenant_shares(spec, source).get(tenant, 0.0)
        if rate is None or rate * share <= 0:
            continue
        burst = Burst(
            start_s=start_s,
            duration_s=window_s,
            add_rate_per_s=(TENANT_BURST_FACTOR - 1) * rate * share,
        )
        name = f"{source.name}+{tenant}-burst"
        while name in taken:  # composed with itself: a second burst of its own
            name += "'"
        taken.add(name)
        extra.append(
            Source(
                name=name,
                arrivals=PoissonArrivals(rate_per_s=0.0, bursts=[burst]),
                mix=source.mix,
                tenants={tenant: 1.0},
            )
        )
    return _R(spec, sources=[*spec.sources, *extra]), cluster


def _time_scaled(config: AutoscalerConfig, factor: float) -> AutoscalerConfig:
    return _R(
        config,
        evaluation_interval_s=config.evaluation_interval_s * factor,
        detection_delay_s=config.detection_delay_s * factor,
        startup_delay_s=config.startup_delay_s * factor,
        scale_up_cooldown_s=config.scale_up_cooldown_s * factor,
        scale_down_cooldown_s=config.scale_down_cooldown_s * factor,
    )


def reference_autoscaler(spec: WorkloadSpec, cluster: ClusterSpec) -> AutoscalerConfig:
    """The cluster's autoscaler, or (without one) the default :class:`AutoscalerConfig`
    between ``replicas − 1`` (at least 1) and ``2 × replicas``, its timings scaled by
    ``min(1, duration_s / AUTOSCALER_REFERENCE_RUN_S)``."""
    if cluster.autoscaler is not None:
        return cluster.autoscaler
    n = cluster.replicas
    config = AutoscalerConfig(min_replicas=max(1, n - 1), max_replicas=2 * n)
    return _time_scaled(config, min(1.0, spec.duration_s / AUTOSCALER_REFERENCE_RUN_S))


def _autoscaler(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    return spec, _R(cluster, autoscaler=reference_autoscaler(spec, cluster))


def _autoscaler_delayed(
    spec: WorkloadSpec, cluster: ClusterSpec
) -> tuple[WorkloadSpec, ClusterSpec]:
    config = reference_autoscaler(spec, cluster)
    delayed = _R(
        config,
        detection_delay_s=config.detection_delay_s * AUTOSCALER_DELAY_FACTOR,
        startup_delay_s=config.startup_delay_s * AUTOSCALER_DELAY_FACTOR,
    )
    return spec, _R(cluster, autoscaler=delayed)


def _has_tools(cls: TaskClass) -> bool:
    return distributions.mean(cls.tools_per_call) > 0


def _slow_tool(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    factor = TOOL_SLOWDOWN_FACTOR
    classes = {
        name: _R(cls, tool_latency_s=scale_distribution(cls.tool_latency_s, factor))
        if _has_tools(cls) and cls.tool_service is None
        else cls
        for name, cls in spec.classes.items()
    }
    services = {
        name: _R(s, service_time_s=scale_distribution(s.service_time_s, factor))
        for name, s in spec.services.items()
    }
    if classes == spec.classes and services == spec.services:
        return spec, cluster
    return _R(spec, classes=classes, services=services), cluster


_ALL: tuple[Scenario, ...] = (
    Scenario("baseline", "nothing changed", "Nothing.", _baseline),
    Scenario(
        "replica-lost-prefill",
        "half the replicas lost while they run prefill work",
        "Adds a `replica_lost` fault at a third of the run, `phase: prefill`, losing half "
        "the replicas (at least one; a one-replica cluster gets a second replica so that "
        "one survives).",
        _replica_lost("prefill"),
    ),
    Scenario(
        "replica-lost-decode",
        "half the replicas lost while they run decode-only steps",
        "Adds a `replica_lost` fault at a third of the run, `phase: decode`, losing half "
        "the replicas (at least one; a one-replica cluster gets a second replica so that "
        "one survives).",
        _replica_lost("decode"),
    ),
    Scenario(
        "cache-cold",
        "prefix caches cold after a deploy",
        "Adds `cache_flush` faults at the start and half way through the run (a deploy "
        "that restarts the engines).",
        _cache_cold,
    ),
    Scenario(
        "long-prompts",
        "prompts twice their normal length",
        "Multiplies every class's `input_tokens` (values and `min`/`max` caps) and "
        "`joint_tokens` prompts by 2; `max_tokens` and outputs are unchanged (token "
        "counts replayed from a trace are not scaled).",
        _long_prompts,
    ),
    Scenario(
        "retry-storm",
        "retry storm after a downstream timeout",
        "Adds a `slowdown` fault (steps 3× longer) from a third of the run for a quarter "
        "of it; clients time out an attempt with no first token after "
        "`clients.retries.timeout_s` (the workload's, else 2× the loosest `ttft_s`) and "
        "retry with at least 3 attempts and no retry budget (`budget_ratio: null`).",
        _retry_storm,
    ),
    Scenario(
        "tenant-burst",
        "the largest tenant bursting",
        "Adds, for each source of the tenant with the highest mean task rate, a source "
        "of its traffic alone that raises its rate to 5× its mean from a third of the "
        "run for a quarter of it.",
        _tenant_burst,
    ),
    Scenario(
        "autoscaler",
        "an autoscaler on time (the reference for autoscaler-delayed)",
        "Keeps the cluster's `autoscaler`; without one, adds the default autoscaler "
        "(queue delay, target 1 s) between replicas − 1 and 2 × replicas, its timings "
        "scaled to the run (× min(1, duration_s / 600 s)).",
        _autoscaler,
    ),
    Scenario(
        "autoscaler-delayed",
        "the autoscaler detecting and starting replicas late",
        "The autoscaler of `autoscaler`, with `detection_delay_s` and `startup_delay_s` "
        "multiplied by 3.",
        _autoscaler_delayed,
    ),
    Scenario(
        "slow-tool",
        "a slow external tool feeding back into agent concurrency",
        "Multiplies `tool_latency_s` of every class with tool calls, and every service's "
        "`service_time_s`, by 5 (service timeouts unchanged).",
        _slow_tool,
    ),
)

SCENARIOS: Mapping[str, Scenario] = {s.name: s for s in _ALL}
"""Every scenario by name, in the matrix's default order."""

DEFAULT_SCENARIOS: tuple[str, ...] = tuple(SCENARIOS)
"""The scenarios a matrix runs by default: all of them."""


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    """``did you mean 'x'? `` for the known name that starts with ``name`` or is closest
    to it, or nothing."""
    names = list(known)
    close = [k for k in names if name and k.startswith(name)]
    close = close or difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}? " if close else ""


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; ``a+b`` composes ``a`` then ``b``. Unknown names raise
    :class:`ConfigError` with the closest known name."""
    parts = [p.strip() for p in name.split("+")]
    found = []
    for part in parts:
        scenario = SCENARIOS.get(part)
        if scenario is None:
            raise ConfigError(
                f"unknown bad-day scenario {part!r}; {_did_you_mean(part, SCENARIOS)}choose from "
                f"{', '.join(SCENARIOS)} (join names with + to compose them)"
            )
        found.append(scenario)
    return compose(*found)


def _check_presets(presets: Sequence[str]) -> list[GatewayPreset]:
    known: dict[str, GatewayPreset] = {p: p for p in PRESETS}
    checked: list[GatewayPreset] = []
    for name in presets:
        preset = known.get(name)
        if preset is None:
            raise ConfigError(
                f"unknown gateway preset {name!r}; {_did_you_mean(name, known)}choose from "
                f"{', '.join(PRESETS)}"
            )
        checked.append(preset)
    if not checked:
        raise ConfigError(f"no gateway preset given; choose from {', '.join(PRESETS)}")
    return checked


# --------------------------------------------------------------------------------------
# The matrix
# --------------------------------------------------------------------------------------


class ScenarioInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A scenario of the matrix, as run."""

    name: str
    summary: str
    changes: str
    changed: bool
    """False when the scenario found nothing to change in this workload and cluster (say,
    ``slow-tool`` on a workload without tool calls): its cells repeat the baseline."""


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


class _Job(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker process needs to simulate one cell."""

    scenario: str
    preset: GatewayPreset
    spec: WorkloadSpec
    cluster: ClusterSpec
    seed: int
    price_per_replica_hour: float | None


def _run_cell(
    job: _Job, traces: Mapping[str, TraceData] | None, options: SimOptions | None
) -> tuple[BadDayCell, str]:
    """Simulate one cell (in a worker process); the cell and its replica-seconds basis."""
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
        preset=job.preset,
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
    ``gateway.preset`` is then set to each preset, its other gateway settings kept. Every
    cell uses ``seed`` (default: the workload's), so the same inputs give the same
    matrix. ``on_cell`` is called in this process as each cell finishes (for progress).
    """
    if not (math.isfinite(load) and load > 0):
        raise ConfigError(f"load must be > 0 (got {load}); 1 is the file's load")
    if jobs < 1:
        raise ConfigError(f"jobs must be >= 1 (got {jobs})")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ConfigError(f"duration_s must be > 0 (got {duration_s})")
    checked = _check_presets(presets)
    chosen = [get_scenario(name) for name in scenarios]
    if not chosen:
        raise ConfigError(f"no bad-day scenario given; choose from {', '.join(SCENARIOS)}")
    base = spec if duration_s is None else _R(spec, duration_s=duration_s)
    base = scale_workload(base, load) if load != 1 else base
    run_seed = spec.seed if seed is None else seed
    infos: list[ScenarioInfo] = []
    work: list[_Job] = []
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
            work.append(
                _Job(
                    scenario=scenario.name,
                    preset=preset,
                    spec=s_spec,
                    cluster=_R(s_cluster, gateway=gateway),
                    seed=run_seed,
                    price_per_replica_hour=price,
                )
            )

    def done(_index: int, result: tuple[BadDayCell, str]) -> None:
        if on_cell is not None:
            on_cell(result[0])

    calls = [(job, traces, options) for job in work]
    runs_on = LocalExecutor(min(jobs, len(work))) if executor is None else executor
    try:
        results = runs_on.map(_run_cell, calls, on_done=done)
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


# --------------------------------------------------------------------------------------
# The command line: ``headway simulate WORKLOAD --bad-days``
# --------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--bad-days`` flags of ``headway simulate``."""
    parser.add_argument(
        "--bad-days",
        action="store_true",
        help="run the bad-day matrix (gateway presets × scenarios) and print one table",
    )
    parser.add_argument(
        "--scenarios",
        default=None,
        help=f"with --bad-days: comma-separated scenarios, a+b composes (default: all: "
        f"{','.join(DEFAULT_SCENARIOS)})",
    )
    parser.add_argument(
        "--presets",
        default=None,
        help=f"with --bad-days: comma-separated gateway presets (default: {','.join(PRESETS)})",
    )
    parser.add_argument(
        "--jobs", type=int, default=None, help="with --bad-days: worker processes (default: CPUs)"
    )
    executors.add_arguments(parser, "the matrix's cells", only_with="--bad-days")


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse the ``--bad-days`` flags without ``--bad-days``."""
    given = [
        flag
        for flag, value in (
            ("--scenarios", args.scenarios),
            ("--presets", args.presets),
            ("--jobs", args.jobs),
            ("--executor", args.executor),
            ("--ray-address", args.ray_address),
        )
        if value is not None
    ]
    if given and not args.bad_days:
        raise ConfigError(f"{', '.join(given)} only apply to the matrix; add --bad-days")


def _names(text: str | None, flag: str, default: Iterable[str]) -> list[str]:
    if text is None:
        return list(default)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"{flag} is empty (got {text!r}); give comma-separated names")
    return names


def command(
    args: argparse.Namespace,
    spec: WorkloadSpec,
    cluster: ClusterSpec,
    traces: Mapping[str, TraceData] | None,
) -> int:
    """``headway simulate WORKLOAD --bad-days``: run the matrix, print one table (or
    ``--json``), write ``bad-days.json`` under ``--out``."""
    scenarios = _names(args.scenarios, "--scenarios", DEFAULT_SCENARIOS)
    presets = _names(args.presets, "--presets", PRESETS)
    for name in scenarios:  # unknown names fail before any simulation starts
        get_scenario(name)
    _check_presets(presets)
    jobs = executors.jobs_or_cpus(args.jobs)
    progress = Progress(
        TextColumn("bad days"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    cells = len(scenarios) * len(presets)
    executor = executors.from_arguments(args, jobs=min(jobs, cells))
    try:
        with progress:
            task = progress.add_task("", total=cells)

            def advance(cell: BadDayCell) -> None:
                progress.update(task, advance=1, description=f"{cell.scenario} / {cell.preset}")

            matrix = run_bad_days(
                spec,
                cluster,
                presets=presets,
                scenarios=scenarios,
                load=args.load,
                duration_s=args.duration_s,
                seed=args.seed,
                traces=traces,
                options=SimOptions(skip_decode=not args.no_skip),
                on_cell=advance,
                executor=executor,
            )
    finally:
        executor.close()
    text = to_json(matrix)
    if args.out is not None:
        write_text_atomic(Path(args.out) / "bad-days.json", text)
    if args.json:
        sys.stdout.write(text)
        return 0
    console = Console()
    table = matrix_table(matrix)
    if not console.is_terminal:  # piped or captured: keep each row on one line
        natural = Console(width=1000).measure(table).maximum
        console = Console(width=max(console.width, natural))
    console.print(table)
    for line in matrix_notes(matrix):
        console.print(line, highlight=False)
    if args.out is not None:
        console.print(f"wrote {Path(args.out) / 'bad-days.json'}", highlight=False)
    return 0


def _fmt_s(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _fmt_cost(value: float | None) -> str:
    """Two significant digits, never in scientific notation (0.000083, 0.52, 12)."""
    if value is None:
        return "—"
    if value >= 10:
        return f"{value:.0f}"
    return np.format_float_positional(value, precision=2, unique=False, fractional=False)


def matrix_table(matrix: BadDayMatrix) -> Table:
    """The matrix as one table: a row per (scenario, preset), scenarios in sections."""
    table = Table(
        title=f"{matrix.workload}: bad days at {matrix.load_factor:g}× load, "
        f"{matrix.duration_s:g} s, seed {matrix.seed}, {matrix.cluster_replicas} replica(s)"
    )
    table.add_column("scenario", no_wrap=True)
    table.add_column("preset", no_wrap=True)
    for name in ("goodput/s", "SLO att", "task att", "TTFT p99", "e2e p99", "shed"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("top shed reason", no_wrap=True)
    for name in ("t/out", "cancel", "failed", "amplif", "replica-h", "$/task"):
        table.add_column(name, justify="right", no_wrap=True)
    changed = {s.name: s.changed for s in matrix.scenarios}
    for i, info in enumerate(matrix.scenarios):
        cells = [c for c in matrix.cells if c.scenario == info.name]
        for j, c in enumerate(cells):
            unchanged = not changed[info.name] and info.name != "baseline"
            label = "" if j else f"{info.name} *" if unchanged else info.name
            table.add_row(
                label,
                c.preset,
                f"{c.goodput_per_s:.2f}",
                f"{c.slo_attainment:.1%}",
                f"{c.task_attainment:.1%}",
                _fmt_s(c.ttft_p99_s),
                _fmt_s(c.e2e_p99_s),
                f"{c.shed}",
                c.top_shed_reason or "—",
                f"{c.timed_out}",
                f"{c.cancelled}",
                f"{c.failed}",
                f"{c.amplification:.2f}",
                f"{c.replica_s / 3600:.3f}",
                _fmt_cost(c.cost_per_successful_task),
                end_section=j == len(cells) - 1 and i < len(matrix.scenarios) - 1,
            )
    return table


def matrix_notes(matrix: BadDayMatrix) -> list[str]:
    """What a reader of :func:`matrix_table` needs to know: unchanged scenarios, the cost
    basis."""
    notes = []
    unchanged = [s.name for s in matrix.scenarios if not s.changed and s.name != "baseline"]
    if unchanged:
        notes.append(
            f"* changes nothing in this workload and cluster: {', '.join(unchanged)} "
            "(its rows repeat the baseline)"
        )
    if matrix.price_per_replica_hour is None:
        notes.append(
            "$/task: no price; set price_per_replica_hour in the cluster file (or "
            "routes.<name>.replica.price_per_hour in the workload)"
        )
    else:
        notes.append(
            f"$/task: replica-hours ({matrix.replica_s_basis}) × "
            f"{matrix.price_per_replica_hour:g} per replica-hour / tasks that met their deadline"
        )
    return notes
