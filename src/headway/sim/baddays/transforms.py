"""What each bad day does to a workload and a cluster: pure functions that return modified
copies, and the figures they use (how much slower, how long, how much more).

Every time a transform sets (a fault, a burst window) is a fraction of the workload's
``duration_s``, so a two-minute run sees the same bad day as a ten-minute one.
"""

from __future__ import annotations

import math

import msgspec
import numpy as np

from headway.core.errors import ConfigError
from headway.core.policy.autoscaler import AutoscalerConfig
from headway.core.workload import distributions
from headway.core.workload.arrivals import RateProfile, apply_bursts, rate_profile
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
from headway.sim.baddays.scenario import Transform
from headway.sim.cluster import ClusterSpec
from headway.sim.faults import CacheFlush, ReplicaLost, Slowdown

_R = msgspec.structs.replace

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


def unchanged(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    """``baseline``: the workload and the cluster as they are."""
    return spec, cluster


def replica_lost(phase: str) -> Transform:
    """``replica-lost-<phase>``: half the replicas (at least one; one survives) fail at a
    third of the run, at a step of ``phase`` (``prefill`` or ``decode``)."""

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


def cache_cold(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    """``cache-cold``: prefix caches flushed at the start and after a deploy mid-run."""
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


def long_prompts(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    """``long-prompts``: every class's prompts :data:`PROMPT_FACTOR` times as long."""

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


def retry_storm(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    """``retry-storm``: steps slower for a window, and clients that time out and retry
    with no retry budget."""
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


def tenant_burst(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    """``tenant-burst``: the largest tenant sends :data:`TENANT_BURST_FACTOR` times its
    rate for a window (a source of its traffic alone per source it has)."""
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


def autoscaler_on_time(
    spec: WorkloadSpec, cluster: ClusterSpec
) -> tuple[WorkloadSpec, ClusterSpec]:
    """``autoscaler``: :func:`reference_autoscaler`, on time."""
    return spec, _R(cluster, autoscaler=reference_autoscaler(spec, cluster))


def autoscaler_delayed(
    spec: WorkloadSpec, cluster: ClusterSpec
) -> tuple[WorkloadSpec, ClusterSpec]:
    """``autoscaler-delayed``: :func:`reference_autoscaler`, detecting and starting
    replicas :data:`AUTOSCALER_DELAY_FACTOR` times later."""
    config = reference_autoscaler(spec, cluster)
    delayed = _R(
        config,
        detection_delay_s=config.detection_delay_s * AUTOSCALER_DELAY_FACTOR,
        startup_delay_s=config.startup_delay_s * AUTOSCALER_DELAY_FACTOR,
    )
    return spec, _R(cluster, autoscaler=delayed)


def _has_tools(cls: TaskClass) -> bool:
    return distributions.mean(cls.tools_per_call) > 0


def slow_tool(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    """``slow-tool``: tool calls and downstream services :data:`TOOL_SLOWDOWN_FACTOR`
    times slower (a workload without either is returned as it is)."""
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
