"""Fit the affine step-time model to probe timings.

Unknowns (seconds per unit): ``overhead``, ``per_prefill_token``, ``per_prefill_pair``,
``per_decode_seq``, ``per_decode_kv_token``, ``per_prefill_seq`` and, when a shared probe
ran, ``per_decode_shared_kv_token`` (an
:class:`~headway.core.engine.steptime.AffineStepTime`; the last as its
``shared_kv_read_ratio``, its ratio to ``per_decode_kv_token``). Samples:

- a prefill probe's TTFT (the fastest of its repeats; prompt ``P``, alone on the engine,
  in ``n = ceil(P / budget)`` chunks):
  ``n·(overhead + per_prefill_seq) + P·per_prefill_token + P(P+1)/2·per_prefill_pair``
  (chunk pairs ``c·p + c(c+1)/2`` sum to ``P(P+1)/2`` whatever the chunking);
- a decode segment (``k`` steps of ``B`` sequences, all decoding): the mean gap
  ``(t_end − t_start)/k`` is ``overhead + B·per_decode_seq + KV·per_decode_kv_token``,
  where ``KV`` is the mean over the segment of ``Σ context`` (``P + i`` for the step after
  token ``i``, per sequence); a shared probe's ``S`` shared tokens (its prefix times
  ``B − 1``) cost ``per_decode_shared_kv_token`` each in place of ``per_decode_kv_token``.

The fit is non-negative least squares on relative errors (each decode row divided by
its probe's typical step time, a prefill row by the larger of the median TTFT and its
own), so short steps count as much as long prefills; samples far off a first
fit (a stall of the client or the machine) are dropped and the fit repeated.

:func:`bootstrap_intervals` refits on probes drawn with replacement among the repeats of
each shape (the rounds of the plan): the spread of each coefficient over those refits is
its confidence interval, which a host whose speed wandered during the run widens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import nnls

from headway.calibrate.plan import ProbePlan, ProbeShape
from headway.calibrate.probe import ProbeResult, StreamTiming
from headway.core.engine.steptime import AffineStepTime

__all__ = [
    "PARAMETERS",
    "SHARED_PARAMETER",
    "FitOutcome",
    "ProbeSamples",
    "Samples",
    "bootstrap_intervals",
    "collect_samples",
    "fit_step_time",
    "fitted_parameters",
    "pool",
    "probe_samples",
]

PARAMETERS = (
    "overhead_s",
    "per_prefill_token_s",
    "per_prefill_pair_s",
    "per_decode_seq_s",
    "per_decode_kv_token_s",
    "per_prefill_seq_s",
    "per_decode_shared_kv_token_s",
)
"""The fitted coefficients, in the order of the regression's columns; the last
(:data:`SHARED_PARAMETER`) only when a shared probe gave samples
(:func:`fitted_parameters`)."""

SHARED_PARAMETER = PARAMETERS[-1]
"""The cost of a shared KV read, which the profile keeps as ``shared_kv_read_ratio``."""


@dataclass(slots=True)
class Samples:
    """Measurements in engine seconds."""

    ttft: list[tuple[int, int, float]]
    """``(prompt tokens, prefill chunks, TTFT)`` of prefill probes."""
    gaps: list[tuple[int, float, float, float, float, int]]
    """``(sequences, mean KV tokens, mean step time, weight, typical step time, shared KV
    tokens)`` of decode segments; the typical time is the probe's median, the scale of
    its errors; the shared tokens are :attr:`ProbeShape.shared_kv_tokens`."""
    num_discarded_probes: int = 0
    """Decode probes left out because their step times scattered (a disturbed run)."""


@dataclass(slots=True)
class ProbeSamples:
    """The samples of one probe, kept apart so that the bootstrap can redraw probes."""

    shape: ProbeShape
    ttft: tuple[int, int, float] | None = None
    """``(prompt tokens, prefill chunks, TTFT)`` of a prefill probe."""
    gaps: list[tuple[int, float, float, float, float, int]] = field(default_factory=list)
    """Its decode segments, as in :attr:`Samples.gaps`."""
    typical_gap_s: float | None = None
    """The median of its decode segments (None: it had none)."""
    discarded: bool = False
    """Its segments scattered (a disturbed run): they are left out of the fit."""


@dataclass(frozen=True, slots=True)
class FitOutcome:
    """The fitted model and how well it explains the samples."""

    step_time: AffineStepTime
    coefficients: dict[str, float]
    """Each fitted coefficient (:func:`fitted_parameters`) in seconds per unit."""
    rms_relative_error: float
    max_relative_error: float
    leverage: dict[str, float]
    """For each coefficient, the largest share of a sample's measured time that one unit
    of it explains (``max_i a_ij / y_i``): times a coefficient's uncertainty, how far it
    moves the prediction of the sample it matters most to."""


def _window(streams: list[StreamTiming]) -> tuple[float, float]:
    """When every stream is decoding: from the last first token to the first last token."""
    start = max(s.token_times_s[0] for s in streams)
    end = min(s.token_times_s[-1] for s in streams)
    return start, end


def probe_samples(
    results: list[ProbeResult], plan: ProbePlan, time_scale: float
) -> list[ProbeSamples]:
    """The samples of each probe (times × ``time_scale``), in the order they ran."""
    out: list[ProbeSamples] = []
    k = plan.segment_steps
    for result in results:
        streams = [s for s in result.streams if len(s.token_times_s) >= 2]
        if len(streams) < len(result.streams):
            continue
        shape = result.shape
        probe = ProbeSamples(shape=shape)
        out.append(probe)
        if shape.concurrency == 1:
            (s,) = streams
            p = s.prompt_tokens
            chunks = math.ceil(p / plan.max_num_batched_tokens)
            probe.ttft = (p, chunks, (s.token_times_s[0] - s.sent_s) * time_scale)
        batch = len(streams)
        start, end = _window(streams)
        rows: list[tuple[float, float]] = []
        # Streams that never all decoded at once (a late first token, a busy host) have
        # no common window: no decode segment.
        for s in streams if start < end else ():
            times = s.token_times_s
            i0 = next(i for i, t in enumerate(times) if t >= start) + 1
            i1 = max(i for i, t in enumerate(times) if t <= end) - 1
            p = s.prompt_tokens
            i = i0
            while i + k <= i1:
                mean_gap = (times[i + k] - times[i]) / k * time_scale
                kv = batch * (p + i + (k - 1) / 2)
                rows.append((kv, mean_gap))
                i += k
        if not rows:
            continue
        # A stall makes one segment long and, as the stream catches up, the next ones
        # short: within one probe the true step time varies little, so drop those; a
        # probe whose segments scatter widely was disturbed throughout: drop it whole.
        values = np.asarray([g for _, g in rows])
        typical = float(np.median(values))
        probe.typical_gap_s = typical
        # Gaps under any engine's step are tokens that arrived together: a client that
        # could not read for a while (a busy host) got a run of them in one read.
        bunched = typical < _MIN_STEP_S
        if bunched or np.median(np.abs(values - typical)) > _PROBE_SCATTER * typical:
            probe.discarded = True
            continue
        shared = shape.shared_kv_tokens
        probe.gaps = [
            (batch, kv, g, 1.0 / batch, typical, shared)
            for kv, g in rows
            if _PROBE_BAND[0] * typical <= g <= _PROBE_BAND[1] * typical
        ]
    return out


def disturbed(result: ProbeResult, plan: ProbePlan, time_scale: float) -> bool:
    """Whether a probe measured a disturbance rather than the engine: it gave no decode
    step the fit would use (a stream ended early, no common window, or its steps
    scattered or came bunched)."""
    probes = probe_samples([result], plan, time_scale)
    return not probes or probes[0].discarded or probes[0].typical_gap_s is None


def pool(probes: Sequence[ProbeSamples]) -> Samples:
    """The fit's samples from a set of probes: every decode segment, and per prompt
    length the fastest TTFT."""
    ttft_by_prompt: dict[tuple[int, int], list[float]] = {}
    gaps: list[tuple[int, float, float, float, float, int]] = []
    for probe in probes:
        if probe.ttft is not None:
            p, chunks, seconds = probe.ttft
            ttft_by_prompt.setdefault((p, chunks), []).append(seconds)
        gaps.extend(probe.gaps)
    # Lateness (a busy client, server or machine) only ever adds time: the fastest
    # repeat is the closest to the engine's own time.
    ttft = [(p, c, min(ts)) for (p, c), ts in sorted(ttft_by_prompt.items())]
    discarded = sum(1 for probe in probes if probe.discarded)
    return Samples(ttft=ttft, gaps=gaps, num_discarded_probes=discarded)


def collect_samples(results: list[ProbeResult], plan: ProbePlan, time_scale: float) -> Samples:
    """TTFT and decode-segment samples from the probes (times × ``time_scale``)."""
    return pool(probe_samples(results, plan, time_scale))


_MIN_STEP_S = 1e-4
"""No engine's decode step is shorter (engine seconds): a probe whose typical gap is
(a loaded CI host once measured 6.7 µs) timed its client's reads, not the engine."""

_PROBE_SCATTER = 0.15
"""A probe whose segments deviate from their median by more than this (median absolute
deviation, relative) is left out."""

_PROBE_BAND = (0.6, 1.6)
"""Decode segments outside this band around their probe's median gap are stalls."""

_TRIM_ROUNDS = 3
_TRIM_SPREADS = 5.0
_MIN_TRIM_RELATIVE = 0.05
_MIN_KEPT = 0.75
"""Never drop more than a quarter of the samples as outliers."""


def _nnls(
    a: np.ndarray[Any, np.dtype[np.float64]],
    y: np.ndarray[Any, np.dtype[np.float64]],
    w: np.ndarray[Any, np.dtype[np.float64]],
) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Weighted non-negative least squares; columns are scaled to unit norm for the
    solver (they differ by many orders of magnitude)."""
    aw = a * w[:, None]
    norms = np.linalg.norm(aw, axis=0)
    norms[norms == 0] = 1.0
    theta_scaled, _ = nnls(aw / norms, y * w)
    result: np.ndarray[Any, np.dtype[np.float64]] = theta_scaled / norms
    return result


def fit_step_time(samples: Samples) -> FitOutcome:
    """Non-negative least squares on relative errors; see the module docstring.

    Raises:
        ValueError: with too few samples to fit six unknowns.
    """
    outcome, _ = _fit(samples)
    return outcome


def _fit(samples: Samples) -> tuple[FitOutcome, np.ndarray[Any, np.dtype[np.float64]]]:
    rows: list[list[float]] = []
    ys: list[float] = []
    weights: list[float] = []
    refs: list[float] = []
    # A TTFT's error is lateness, about the same size at every prompt length, or the
    # host's speed, a fraction of the TTFT, whichever is larger: the short prompts share
    # one scale (the median TTFT), a longer one's is its own. Against one shared scale a
    # few per cent of a multi-second prefill outweighed the short prompts that pin the
    # per-request cost (a CPU vLLM at 4,096 tokens: its fitted per_prefill_seq_s ranged
    # 0-99 ms over the bootstrap and calibrate refused the fit).
    ttft_scale = float(np.median([t for _, _, t in samples.ttft])) if samples.ttft else 1.0
    for p, chunks, t in samples.ttft:
        rows.append([chunks, p, p * (p + 1) / 2, 0.0, 0.0, chunks, 0.0])
        ys.append(t)
        weights.append(1.0)
        refs.append(max(ttft_scale, t))
    # A shared read has a column of its own: the KV column counts the other reads.
    for b, kv, t, w, typical, shared in samples.gaps:
        rows.append([1.0, 0.0, 0.0, b, kv - shared, 0.0, shared])
        ys.append(t)
        weights.append(w)
        refs.append(typical)
    if len(samples.ttft) < 3 or len(samples.gaps) < 3:
        raise ValueError(
            f"too few samples to fit ({len(samples.ttft)} prefill, {len(samples.gaps)} "
            "decode); probe more prompt lengths or longer outputs"
        )
    a = np.asarray(rows, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    ref = np.asarray(refs, dtype=np.float64)
    if not np.all(ref > 0):
        raise ValueError("a measured time is not positive: the clock or the stream is broken")
    w = np.sqrt(np.asarray(weights)) / ref
    keep = np.ones(len(y), dtype=bool)
    for _ in range(_TRIM_ROUNDS + 1):
        theta = _nnls(a[keep], y[keep], w[keep])
        rel = (a @ theta - y) / ref
        # A sample hit by a stall of the client, the network or the machine is far off
        # the fit: drop those and refit (the decode segments are many and redundant).
        spread = float(np.median(np.abs(rel[keep])))
        limit = max(_MIN_TRIM_RELATIVE, _TRIM_SPREADS * spread)
        outliers = keep & (np.abs(rel) > limit)
        outliers[: len(samples.ttft)] = False  # one sample per prompt length: keep them
        if not outliers.any() or (keep & ~outliers).sum() < _MIN_KEPT * len(y):
            break
        keep &= ~outliers
    rel = rel[keep]
    names = fitted_parameters(samples)
    values = {name: float(value) for name, value in zip(PARAMETERS, theta, strict=True)}
    fields = {name: values[name] for name in PARAMETERS if name != SHARED_PARAMETER}
    shared_s, per_kv_s = values[SHARED_PARAMETER], values["per_decode_kv_token_s"]
    step = AffineStepTime(
        **fields,
        shared_kv_read_ratio=shared_s / per_kv_s
        if SHARED_PARAMETER in names and per_kv_s > 0
        else 1.0,
    )
    leverage = np.max(a[keep] / y[keep][:, None], axis=0)
    outcome = FitOutcome(
        step_time=step,
        coefficients={name: values[name] for name in names},
        rms_relative_error=float(np.sqrt(np.mean(rel**2))),
        max_relative_error=float(np.max(np.abs(rel))),
        leverage={
            name: float(v) for name, v in zip(PARAMETERS, leverage, strict=True) if name in names
        },
    )
    return outcome, theta


def fitted_parameters(samples: Samples) -> tuple[str, ...]:
    """The coefficients the samples determine: all of :data:`PARAMETERS`, or all but
    ``per_decode_shared_kv_token_s`` when no decode segment read shared KV tokens (no
    shared probe, or an engine without prefix caching: the profile's
    ``shared_kv_read_ratio`` stays 1, a shared read costs what another does)."""
    if any(g[5] > 0 for g in samples.gaps):
        return PARAMETERS
    return tuple(name for name in PARAMETERS if name != SHARED_PARAMETER)


def bootstrap_intervals(
    probes: Sequence[ProbeSamples],
    *,
    resamples: int = 200,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """A ``confidence`` interval for each coefficient: refit ``resamples`` times on probes
    drawn with replacement among the repeats of each shape, and take the percentiles.

    Resamples too thin to fit (a shape's every repeat unusable) are skipped.

    Raises:
        ValueError: when no resample can be fitted.
    """
    rng = np.random.default_rng(seed)
    by_shape: dict[tuple[str, int, int, int], list[ProbeSamples]] = {}
    for probe in probes:
        by_shape.setdefault(probe.shape.key, []).append(probe)
    groups = list(by_shape.values())
    thetas: list[np.ndarray[Any, np.dtype[np.float64]]] = []
    names = fitted_parameters(pool(probes))
    for _ in range(resamples):
        drawn = [g[int(i)] for g in groups for i in rng.integers(0, len(g), size=len(g))]
        try:
            resample = pool(drawn)
            if fitted_parameters(resample) != names:  # every shared probe unusable
                continue
            _, theta = _fit(resample)
        except ValueError:
            continue
        thetas.append(theta)
    if not thetas:
        raise ValueError(f"none of {resamples} resamples of the probes could be fitted")
    tail = (1.0 - confidence) / 2 * 100
    lows = np.percentile(np.asarray(thetas), tail, axis=0)
    highs = np.percentile(np.asarray(thetas), 100 - tail, axis=0)
    return {
        name: (float(lo), float(hi))
        for name, lo, hi in zip(PARAMETERS, lows, highs, strict=True)
        if name in names
    }
