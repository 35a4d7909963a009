"""Arrival processes as a rate profile plus a renewal process in operational time.

Every rate-based process (constant, Poisson, gamma, on/off, schedule, and bursts layered
on any of them) is one mechanism: a piecewise-constant rate profile ``r(t)`` and a renewal
process with unit mean gap and the requested coefficient of variation (0: evenly spaced,
1: exponential gaps, otherwise gamma gaps). Renewal points ``u_k`` in "operational time"
are mapped to wall time by the inverse of the cumulative rate ``Λ(t) = ∫ r``:
``t_k = Λ⁻¹(u_k)``. A constant profile with CV 1 is exactly a Poisson process; a changing
profile with CV 1 is exactly a non-homogeneous Poisson process; other CVs keep their gap
shape inside every step. Trace replay takes its times from the trace instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from headway.core.errors import WorkloadError
from headway.core.trace_data import TraceData, detect_tick_s
from headway.core.workload import distributions
from headway.core.workload.spec import (
    Arrivals,
    Burst,
    Constant,
    GammaArrivals,
    OnOff,
    PoissonArrivals,
    Schedule,
    TraceReplay,
)

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, eq=False)
class RateProfile:
    """A piecewise-constant rate: ``rates_per_s[i]`` holds on ``[edges_s[i], edges_s[i+1])``."""

    edges_s: FloatArray
    rates_per_s: FloatArray

    def __post_init__(self) -> None:
        if self.edges_s.size != self.rates_per_s.size + 1 or self.rates_per_s.size == 0:
            raise ValueError("RateProfile needs len(edges_s) == len(rates_per_s) + 1 >= 2")
        if np.any(np.diff(self.edges_s) <= 0):
            raise ValueError("RateProfile edges must increase strictly")

    @property
    def horizon_s(self) -> float:
        """The end of the profile."""
        return float(self.edges_s[-1])

    @property
    def durations_s(self) -> FloatArray:
        """The length of each segment."""
        return np.diff(self.edges_s)

    def cumulative(self) -> FloatArray:
        """``Λ`` at each edge: the expected arrivals before it."""
        return np.concatenate(([0.0], np.cumsum(self.rates_per_s * self.durations_s)))

    def mean_rate_per_s(self) -> float:
        """The time-average rate over the profile."""
        return float(self.cumulative()[-1] / self.horizon_s)

    def max_rate_per_s(self) -> float:
        """The highest rate of any segment."""
        return float(self.rates_per_s.max())

    def rate_at(self, t_s: float) -> float:
        """The rate in force at ``t_s``."""
        i = int(np.searchsorted(self.edges_s, t_s, side="right")) - 1
        return float(self.rates_per_s[min(max(i, 0), self.rates_per_s.size - 1)])

    def invert(self, u: FloatArray) -> FloatArray:
        """Map operational times ``u`` (expected-arrival units) to wall times ``Λ⁻¹(u)``.

        Zero-rate segments are skipped: a point lands in the first segment whose
        cumulative range contains it. Points beyond ``Λ(horizon)`` are dropped.
        """
        cum = self.cumulative()
        u = u[u < cum[-1]]
        seg = np.searchsorted(cum, u, side="right") - 1
        seg = np.minimum(seg, self.rates_per_s.size - 1)
        rates = self.rates_per_s[seg]
        return np.asarray(self.edges_s[seg] + (u - cum[seg]) / rates, dtype=np.float64)


def _merge(edges: list[float], rates: list[float]) -> RateProfile:
    """Build a profile, joining neighbours with equal rates."""
    out_edges = [edges[0]]
    out_rates: list[float] = []
    for i, rate in enumerate(rates):
        if edges[i + 1] <= edges[i]:
            continue
        if out_rates and out_rates[-1] == rate:
            out_edges[-1] = edges[i + 1]
        else:
            out_rates.append(rate)
            out_edges.append(edges[i + 1])
    return RateProfile(np.asarray(out_edges, dtype=np.float64), np.asarray(out_rates))


def _burst_windows(burst: Burst, horizon_s: float) -> list[tuple[float, float]]:
    windows = []
    start = burst.start_s
    while start < horizon_s:
        windows.append((start, min(start + burst.duration_s, horizon_s)))
        if burst.every_s is None:
            break
        start += burst.every_s
    return windows


def apply_bursts(profile: RateProfile, bursts: list[Burst]) -> RateProfile:
    """Layer bursts on a profile (in order; a later burst sees the earlier ones)."""
    for burst in bursts:
        for lo, hi in _burst_windows(burst, profile.horizon_s):
            cuts = np.unique(np.concatenate((profile.edges_s, [lo, hi])))
            cuts = cuts[(cuts >= 0) & (cuts <= profile.horizon_s)]
            mids = (cuts[:-1] + cuts[1:]) / 2
            rates = np.array([profile.rate_at(float(m)) for m in mids])
            inside = (mids >= lo) & (mids < hi)
            if burst.rate_per_s is not None:
                rates[inside] = burst.rate_per_s
            elif burst.add_rate_per_s is not None:
                rates[inside] += burst.add_rate_per_s
            elif burst.multiplier is not None:
                rates[inside] *= burst.multiplier
            profile = _merge(cuts.tolist(), rates.tolist())
    return profile


def _schedule_profile(spec: Schedule, horizon_s: float) -> RateProfile:
    edges = [0.0]
    rates: list[float] = []
    t = 0.0
    while t < horizon_s:
        for step in spec.steps:
            rates.append(step.rate_per_s)
            t += step.duration_s
            edges.append(min(t, horizon_s))
            if t >= horizon_s:
                break
        if not spec.repeat and t < horizon_s:
            rates.append(spec.steps[-1].rate_per_s)
            edges.append(horizon_s)
            t = horizon_s
    return _merge(edges, rates)


def _on_off_profile(spec: OnOff, horizon_s: float, rng: np.random.Generator) -> RateProfile:
    edges = [0.0]
    rates: list[float] = []
    on = spec.start_on
    t = 0.0
    while t < horizon_s:
        length = float(distributions.sample(spec.on_s if on else spec.off_s, 1, rng)[0])
        if not length > 0:
            raise WorkloadError(
                "on/off period lengths must be > 0; check `on_s` and `off_s` (a zero or "
                "negative draw would never advance time)"
            )
        rates.append(spec.on_rate_per_s if on else spec.off_rate_per_s)
        t = min(t + length, horizon_s)
        edges.append(t)
        on = not on
    return _merge(edges, rates)


def base_profile(
    arrivals: Arrivals, horizon_s: float, rng: np.random.Generator | None = None
) -> RateProfile:
    """The rate profile of a rate-based process, without its bursts.

    On/off profiles are random and need ``rng``; the others are deterministic.
    """
    if isinstance(arrivals, Constant | PoissonArrivals | GammaArrivals):
        return RateProfile(np.array([0.0, horizon_s]), np.array([arrivals.rate_per_s]))
    if isinstance(arrivals, Schedule):
        return _schedule_profile(arrivals, horizon_s)
    if isinstance(arrivals, OnOff):
        if rng is None:
            raise ValueError("an on/off profile is random: pass rng")
        return _on_off_profile(arrivals, horizon_s, rng)
    raise TypeError(f"{type(arrivals).__name__} has no rate profile")


def gap_cv(arrivals: Arrivals) -> float:
    """The coefficient of variation of the renewal gaps of a rate-based process."""
    if isinstance(arrivals, Constant):
        return 0.0
    if isinstance(arrivals, PoissonArrivals):
        return 1.0
    if isinstance(arrivals, GammaArrivals | OnOff | Schedule):
        return arrivals.cv
    raise TypeError(f"{type(arrivals).__name__} is not a rate-based process")


def renewal_points(total: float, cv: float, rng: np.random.Generator) -> FloatArray:
    """Points of a stationary renewal process with unit mean gap on ``[0, total)``.

    The first point is drawn from the equilibrium distribution (uniform within the first
    gap for evenly spaced points), so the process has no artificial arrival at 0.
    """
    if total <= 0:
        return np.empty(0)
    n_guess = int(total + 6 * math.sqrt(total * max(cv * cv, 1.0)) + 16)
    chunks: list[FloatArray] = []
    start = float(rng.uniform(0.0, 1.0)) if cv == 0 else float(_gaps(1, cv, rng)[0] * rng.random())
    pos = start
    while True:
        gaps = _gaps(n_guess, cv, rng)
        points = pos + np.concatenate(([0.0], np.cumsum(gaps[:-1])))
        chunks.append(points[points < total])
        if points[-1] >= total:
            break
        pos = float(points[-1] + gaps[-1])
    return np.concatenate(chunks)


def _gaps(n: int, cv: float, rng: np.random.Generator) -> FloatArray:
    if cv == 0:
        return np.ones(n)
    if cv == 1:
        return rng.exponential(1.0, n)
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / shape, n)


def rate_profile(
    arrivals: Arrivals, horizon_s: float, rng: np.random.Generator | None = None
) -> RateProfile:
    """The full rate profile of a rate-based process, bursts included."""
    profile = base_profile(arrivals, horizon_s, rng)
    if isinstance(arrivals, TraceReplay):  # pragma: no cover - base_profile raised already
        return profile
    return apply_bursts(profile, arrivals.bursts)


def generate(arrivals: Arrivals, horizon_s: float, rng: np.random.Generator) -> FloatArray:
    """Arrival times on ``[0, horizon_s)`` of a rate-based process, sorted."""
    profile = rate_profile(arrivals, horizon_s, rng)
    cum_total = float(profile.cumulative()[-1])
    points = renewal_points(cum_total, gap_cv(arrivals), rng)
    return profile.invert(points)


@dataclass(frozen=True, slots=True, eq=False)
class ReplayedTrace:
    """Arrival times of a replayed trace and the trace row each came from."""

    arrival_s: FloatArray
    row: npt.NDArray[np.int64]
    tick_s: float | None
    """The detected timestamp tick that ``tick_policy`` acted on, if any."""


def replay(
    spec: TraceReplay, trace: TraceData, horizon_s: float, rng: np.random.Generator
) -> ReplayedTrace:
    """Apply a replay's window, ticks, time scale and rate scale to a trace.

    Order: crop to the window and shift it to start at 0; spread quantised ticks (per
    ``tick_policy``); scale time; thin or replicate; crop to the run's horizon.
    """
    times = trace.arrival_s.astype(np.float64)
    rows = np.arange(times.size, dtype=np.int64)
    if spec.window is not None:
        end = math.inf if spec.window.end_s is None else spec.window.end_s
        keep = (times >= spec.window.start_s) & (times < end)
        times, rows = times[keep] - spec.window.start_s, rows[keep]
    tick_s = detect_tick_s(trace.arrival_s) if spec.tick_policy != "literal" else None
    if spec.tick_policy == "spread" and tick_s is None:
        tick_s = _median_positive_gap(trace.arrival_s)
    if tick_s is not None and spec.tick_policy in ("auto", "spread"):
        times = times + rng.uniform(0.0, tick_s, times.size)
    times = times * spec.time_scale
    if spec.rate_scale != 1.0:
        times, rows = _rescale(times, rows, spec.rate_scale, rng)
    order = np.argsort(times, kind="stable")
    times, rows = times[order], rows[order]
    keep = times <= horizon_s  # a row stamped at the end of a [0, duration_s] export stays
    return ReplayedTrace(times[keep], rows[keep], tick_s)


def _median_positive_gap(arrival_s: FloatArray) -> float | None:
    gaps = np.diff(arrival_s)
    gaps = gaps[gaps > 0]
    return float(np.median(gaps)) if gaps.size else None


def _rescale(
    times: FloatArray, rows: npt.NDArray[np.int64], scale: float, rng: np.random.Generator
) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """Thin (scale < 1) or replicate (scale > 1) a stream of arrivals."""
    if scale < 1.0:
        keep = rng.random(times.size) < scale
        return times[keep], rows[keep]
    whole = math.floor(scale)
    copies = np.full(times.size, whole, dtype=np.int64)
    copies += (rng.random(times.size) < scale - whole).astype(np.int64)
    gap = _median_positive_gap(times) or 0.0
    out_times = np.repeat(times, copies)
    out_rows = np.repeat(rows, copies)
    # The first copy keeps its time; later copies move by a random offset within one gap,
    # so replication does not create synchronous duplicates.
    first = np.zeros(out_times.size, dtype=bool)
    starts = np.cumsum(copies) - copies
    first[starts[copies > 0]] = True
    out_times = out_times + np.where(first, 0.0, rng.uniform(0.0, gap, out_times.size))
    return out_times, out_rows
