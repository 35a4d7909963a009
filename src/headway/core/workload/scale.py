"""Scale a workload's offered load by a factor (for sweeps and knee searches).

Every arrival rate is multiplied: base rates, on/off rates, schedule steps, bursts given
as rates (multiplier bursts scale with their base), and trace replays (through their
``rate_scale``). Planning rates declared on sources scale too. Token sizes, mixes and
SLOs are unchanged.
"""

from __future__ import annotations

import msgspec

from headway.core.workload.spec import (
    Arrivals,
    Burst,
    Constant,
    GammaArrivals,
    OnOff,
    PoissonArrivals,
    Schedule,
    Source,
    TraceReplay,
    WorkloadSpec,
)


def _burst(b: Burst, f: float) -> Burst:
    return msgspec.structs.replace(
        b,
        rate_per_s=None if b.rate_per_s is None else b.rate_per_s * f,
        add_rate_per_s=None if b.add_rate_per_s is None else b.add_rate_per_s * f,
    )


def scale_arrivals(arrivals: Arrivals, factor: float) -> Arrivals:
    """The same process with every rate times ``factor``."""
    if isinstance(arrivals, TraceReplay):
        return msgspec.structs.replace(arrivals, rate_scale=arrivals.rate_scale * factor)
    bursts = [_burst(b, factor) for b in arrivals.bursts]
    if isinstance(arrivals, Constant | PoissonArrivals | GammaArrivals):
        return msgspec.structs.replace(
            arrivals, rate_per_s=arrivals.rate_per_s * factor, bursts=bursts
        )
    if isinstance(arrivals, OnOff):
        return msgspec.structs.replace(
            arrivals,
            on_rate_per_s=arrivals.on_rate_per_s * factor,
            off_rate_per_s=arrivals.off_rate_per_s * factor,
            bursts=bursts,
        )
    assert isinstance(arrivals, Schedule)
    steps = [msgspec.structs.replace(s, rate_per_s=s.rate_per_s * factor) for s in arrivals.steps]
    return msgspec.structs.replace(arrivals, steps=steps, bursts=bursts)


def _source(source: Source, f: float) -> Source:
    return msgspec.structs.replace(
        source,
        arrivals=scale_arrivals(source.arrivals, f),
        busy_rate_per_s=None if source.busy_rate_per_s is None else source.busy_rate_per_s * f,
        peak_rate_per_s=None if source.peak_rate_per_s is None else source.peak_rate_per_s * f,
    )


def scale_workload(spec: WorkloadSpec, factor: float) -> WorkloadSpec:
    """``spec`` with its offered load times ``factor`` (> 0)."""
    if not factor > 0:
        raise ValueError(f"load factor must be > 0 (got {factor})")
    return msgspec.structs.replace(spec, sources=[_source(s, factor) for s in spec.sources])
