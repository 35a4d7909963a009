"""Whether a calibration can be trusted: the drift check and the confidence check.

A host whose speed changes during a calibration (other jobs, thermal limits, a noisy
neighbour) gives a profile of no particular moment. Two checks catch it, and
``headway calibrate`` exits 1 naming what failed instead of writing a profile that looks
fine:

- **drift**: the reference probe opens every round and closes the run; the line through
  its median decode steps (least squares over the run) must not rise or fall by more than
  ``max_drift`` (relative) from the run's start to its end.
- **confidence**: a coefficient's confidence interval (:func:`~headway.calibrate.fit.
  bootstrap_intervals`) must not move the prediction of the sample it matters most to by
  more than ``max_ci_impact``: half the interval's width times its leverage. A coefficient
  that explains little of any measured time (a tiny attention cost at short contexts) may
  be known loosely without harm; one that carries a step's time may not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from headway.calibrate.fit import ProbeSamples

__all__ = [
    "DEFAULT_LIMITS",
    "TrustLimits",
    "ci_impacts",
    "drift_line",
    "problems",
    "reference_drift",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustLimits:
    """The thresholds of the checks (``--max-drift``, ``--max-ci-impact``)."""

    max_drift: float = 0.15
    """Largest relative change of the reference probe's step time from its first run."""
    max_ci_impact: float = 0.25
    """Largest share of a sample's time that a coefficient's 95% half-interval may move."""

    def __post_init__(self) -> None:
        for name in ("max_drift", "max_ci_impact"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be a fraction > 0 (got {value}), e.g. 0.15 for 15%")


DEFAULT_LIMITS = TrustLimits()


def reference_drift(probes: Sequence[ProbeSamples]) -> tuple[list[float], float]:
    """The reference probe's median step times in the order they ran, and how far the
    host's speed moved over the run: the relative change, from the first reference to
    the last, of the least-squares line through them all (0 with fewer than two).

    A line, not the worst single reference against the first: on an idle two-core VM
    the same reference probe measured 18.5 to 26.5 ms within a minute, back to back, so
    one probe against another tells noise, not drift (two calibrations of vLLM's CPU
    build were refused at +25% from one slow reference among four, the last within 7%
    of the first). A host that really slows moves every later reference, and the line.
    A reference probe the fit left out (its steps scattered, or its tokens came in
    bursts) measured the host's disturbance, not the engine's speed: it is left out
    here too."""
    steps = [
        p.typical_gap_s
        for p in probes
        if p.shape.kind == "reference" and not p.discarded and p.typical_gap_s is not None
    ]
    if len(steps) < 2:
        return steps, 0.0
    start, end = drift_line(steps)
    return steps, abs(end / start - 1.0) if start > 0 else math.inf


def drift_line(steps_s: Sequence[float]) -> tuple[float, float]:
    """The least-squares line through ``steps_s`` (at 0, 1, 2, ...): its values at the
    first and at the last."""
    n = len(steps_s)
    mean_x = (n - 1) / 2
    mean_y = sum(steps_s) / n
    sxx = sum((i - mean_x) ** 2 for i in range(n))
    slope = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(steps_s)) / sxx
    return mean_y - slope * mean_x, mean_y + slope * mean_x


def ci_impacts(
    intervals: Mapping[str, tuple[float, float]], leverage: Mapping[str, float]
) -> dict[str, float]:
    """Half of each coefficient's interval times its leverage: how far its uncertainty
    moves the prediction of the sample it matters most to (a fraction of that time)."""
    out: dict[str, float] = {}
    for name in leverage:
        lo, hi = intervals[name]
        out[name] = (hi - lo) / 2 * leverage[name] if leverage[name] > 0 else 0.0
    return out


def problems(
    *,
    steps_s: Sequence[float],
    drift: float,
    intervals: Mapping[str, tuple[float, float]],
    impacts: Mapping[str, float],
    values: Mapping[str, float],
    limits: TrustLimits = DEFAULT_LIMITS,
) -> list[str]:
    """One line per failed check, naming the parameter, the value and the limit."""
    out: list[str] = []
    if drift > limits.max_drift:
        first, last = drift_line(steps_s)
        measured = ", ".join(f"{s * 1e3:.3g}" for s in steps_s)
        out.append(
            f"drift: the reference probe's decode step went from {first * 1e3:.3g} ms to "
            f"{last * 1e3:.3g} ms ({last / first - 1:+.0%}) during the run (the line "
            f"through {measured} ms), above --max-drift {limits.max_drift:.0%}: the "
            "host's speed changed; rerun on a quiet machine"
        )
    for name in impacts:
        if impacts[name] > limits.max_ci_impact:
            lo, hi = intervals[name]
            out.append(
                f"{name}: {values[name]:.3g} s, 95% interval [{lo:.3g}, {hi:.3g}] moves the "
                f"predicted time by up to {impacts[name]:.0%}, above --max-ci-impact "
                f"{limits.max_ci_impact:.0%}: the probes disagree; rerun on a quiet "
                "machine or with more --rounds"
            )
    return out
