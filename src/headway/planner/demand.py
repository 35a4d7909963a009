"""Steady demand: the workload at a constant task rate, bursts removed.

The knee and the replica search need a stationary load, so that attainment measures
capacity rather than how a burst happened to fall in the run. :func:`steady_workload`
keeps every class, mix, tenant and client setting and replaces each source's arrivals
by a Poisson process at a stated multiple of its peak rate.
"""

from __future__ import annotations

import msgspec

from headway.core.errors import ConfigError
from headway.core.workload.spec import PoissonArrivals, Source, WorkloadSpec
from headway.planner.analytic import source_rates


def peak_rates(spec: WorkloadSpec) -> dict[str, float]:
    """Peak task rate of each source (declared, or the highest rate of its profile)."""
    rates: dict[str, float] = {}
    for source in spec.sources:
        _, peak = source_rates(source, spec.duration_s)
        if peak is None:
            raise ConfigError(
                f"source `{source.name}` replays a trace and declares no peak_rate_per_s; the "
                "simulated plan needs it: add `peak_rate_per_s` to the source (see "
                "`headway trace stats`), or run `headway plan --analytic-only`",
                path=f"$.sources[{spec.sources.index(source)}].peak_rate_per_s",
            )
        rates[source.name] = peak
    return rates


def peak_tasks_per_s(spec: WorkloadSpec) -> float:
    """The whole workload's peak task rate (every source at its peak at once)."""
    return sum(peak_rates(spec).values())


def steady_workload(spec: WorkloadSpec, load_factor: float, duration_s: float) -> WorkloadSpec:
    """``spec`` with every source Poisson at ``load_factor`` × its peak rate, no bursts."""
    if not load_factor > 0:
        raise ValueError(f"load factor must be > 0 (got {load_factor})")
    rates = peak_rates(spec)
    sources: list[Source] = [
        msgspec.structs.replace(
            s,
            arrivals=PoissonArrivals(rate_per_s=rates[s.name] * load_factor),
            busy_rate_per_s=None,
            peak_rate_per_s=None,
            capacity_per_s=None,
        )
        for s in spec.sources
        if rates[s.name] > 0
    ]
    return msgspec.structs.replace(spec, sources=sources, duration_s=duration_s)
