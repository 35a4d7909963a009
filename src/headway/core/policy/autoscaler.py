"""Autoscaling: add or remove replicas from one load signal, late and slowly, as real ones do.

:meth:`Autoscaler.decide` takes ``now`` and an :class:`AutoscalerSignals` snapshot (ready
and starting replicas, the measured signals) and returns a :data:`ScaleDecision`:
:class:`ScaleUp` (with the time the new replicas will be ready), :class:`ScaleDown` or
:class:`Hold`. It never reads a clock; its memory is when the current breach started,
the recommendations seen during it, and when it last scaled. The driver applies a
decision (boots the replicas, drains the removed ones) and reports them as ``starting``
and then ``ready`` in later snapshots.

The rule is the Kubernetes Horizontal Pod Autoscaler's, with its stabilisation window
and rate limits mapped onto explicit fields::

    ratio   = value / target                       value: the signal (per replica for
                                                   admitted_tokens_per_replica)
    desired = ceil(ready * ratio)                  HPA: ceil(current * value / target)
    breach  = ratio > 1 + tolerance  (up)          HPA: no action within the 10% band
              ratio < 1 - tolerance  (down)
    current = ready + starting                     a booting replica already counts

1. Bounds first: ``current < min_replicas`` scales up to ``min_replicas`` at once, and
   ``current > max_replicas`` scales down to ``max_replicas`` at once.
2. Between evaluations (``evaluation_interval_s``) and without a measured signal: hold.
3. A breach must persist for ``detection_delay_s`` (evaluated at every interval, every
   one in breach the same way) before anything happens: a spike shorter than that does
   nothing (seed 002: "overload is detected in 10 seconds").
4. Up: ``desired`` is the *smallest* recommendation seen during the breach (HPA's
   scale-up stabilisation), so a transient peak inside the window is not chased;
   ``count = min(desired - current, max_step, max_replicas - current)``, and not within
   ``scale_up_cooldown_s`` of the previous scale-up. Starting replicas are in ``current``,
   so a breach that persists while one boots does not add a second one for the same load.
   ``ScaleUp.ready_at_s = now + startup_delay_s``: seed 002's point is that this capacity
   arrives after the requests that asked for it have met or missed their deadlines.
5. Down: ``desired`` is the *largest* recommendation seen during the breach (HPA's
   scale-down stabilisation); never while a replica is starting, never within
   ``scale_down_cooldown_s`` of any scaling; at most ``max_step_down`` at a time, and
   not below ``min_replicas``.

What HPA does that this does not: per-pod metrics with missing-pod handling (a snapshot
here is already aggregated), several metrics at once (one signal per autoscaler; run two
and take the larger), and percentage-based rate policies (``max_step`` is a count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypeAlias

import msgspec

from headway.core.policy._checks import require

__all__ = [
    "SIGNALS",
    "Autoscaler",
    "AutoscalerConfig",
    "AutoscalerSignals",
    "Hold",
    "ScaleDecision",
    "ScaleDown",
    "ScaleUp",
    "Signal",
]

Signal = Literal[
    "queue_delay_s", "admitted_tokens_per_replica", "kv_occupancy", "deadline_miss_ratio"
]
"""What the autoscaler watches (see :class:`AutoscalerSignals` for each one's meaning)."""

SIGNALS: tuple[Signal, ...] = (
    "queue_delay_s",
    "admitted_tokens_per_replica",
    "kv_occupancy",
    "deadline_miss_ratio",
)


class AutoscalerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """When and how much to scale (the rule is in the module docstring)."""

    signal: Signal = "queue_delay_s"
    """The signal: ``queue_delay_s`` (how long admitted requests wait before dispatch),
    ``admitted_tokens_per_replica`` (admitted prompt + output tokens per second, per ready
    replica), ``kv_occupancy`` (fraction of KV blocks in use, mean over ready replicas)
    or ``deadline_miss_ratio`` (fraction of recent requests that missed their deadline).
    Seed 000: react "using queue age and resource saturation together rather than queue
    length alone"."""

    target: float = 1.0
    """The comfortable value of the signal (seconds, tokens per second per replica, or a
    fraction): the autoscaler sizes the pool so that the signal comes back to it."""

    tolerance: float = 0.1
    """No action while ``value / target`` is within ``1 ± tolerance`` (HPA's default band
    of 10%), so that noise around the target does not flap the pool."""

    evaluation_interval_s: float = 15.0
    """Seconds between evaluations (HPA's sync period is 15 s); calls in between hold."""

    detection_delay_s: float = 30.0
    """A breach must last this long, at every evaluation, before the autoscaler acts (a
    stabilisation window): shorter spikes do nothing. 0 acts on the first evaluation."""

    startup_delay_s: float = 120.0
    """Seconds from a scale-up decision until the new replica serves (scheduling, image
    pull, model load, compilation, warm-up)."""

    min_replicas: int = 1
    """Never fewer replicas (ready plus starting) than this; at least 1."""

    max_replicas: int = 16
    """Never more replicas (ready plus starting) than this."""

    scale_up_cooldown_s: float = 60.0
    """Seconds after a scale-up before the next scale-up; the replicas it added are still
    starting for much of it, and counted, so this only bounds the pace."""

    scale_down_cooldown_s: float = 300.0
    """Seconds after any scaling before a scale-down (HPA's scale-down stabilisation is
    300 s): removing capacity right after adding it is the flapping this prevents."""

    max_step: int = 4
    """Replicas added by one scale-up at most."""

    max_step_down: int = 1
    """Replicas removed by one scale-down at most."""

    def __post_init__(self) -> None:
        require(
            self.signal in SIGNALS,
            "autoscaler",
            "signal",
            self.signal,
            f"use one of {', '.join(SIGNALS)}",
        )
        require(
            math.isfinite(self.target) and self.target > 0,
            "autoscaler",
            "target",
            self.target,
            "use the signal's comfortable value, > 0 (e.g. 0.5 s of queue delay)",
        )
        if self.signal in ("kv_occupancy", "deadline_miss_ratio"):
            require(
                self.target <= 1.0,
                "autoscaler",
                "target",
                self.target,
                f"{self.signal} is a fraction, so use a target in (0, 1], e.g. 0.8",
            )
        require(
            0.0 <= self.tolerance < 1.0,
            "autoscaler",
            "tolerance",
            self.tolerance,
            "use a fraction in [0, 1), e.g. 0.1 for HPA's 10% band",
        )
        for name in (
            "detection_delay_s",
            "startup_delay_s",
            "scale_up_cooldown_s",
            "scale_down_cooldown_s",
        ):
            value = getattr(self, name)
            require(
                math.isfinite(value) and value >= 0,
                "autoscaler",
                name,
                value,
                "use seconds >= 0",
            )
        require(
            math.isfinite(self.evaluation_interval_s) and self.evaluation_interval_s > 0,
            "autoscaler",
            "evaluation_interval_s",
            self.evaluation_interval_s,
            "use seconds > 0, e.g. 15",
        )
        require(
            self.min_replicas >= 1,
            "autoscaler",
            "min_replicas",
            self.min_replicas,
            "use 1 or more (scale to zero is not modelled)",
        )
        require(
            self.max_replicas >= self.min_replicas,
            "autoscaler",
            "max_replicas",
            self.max_replicas,
            f"use a count >= min_replicas ({self.min_replicas})",
        )
        require(self.max_step >= 1, "autoscaler", "max_step", self.max_step, "use 1 or more")
        require(
            self.max_step_down >= 1,
            "autoscaler",
            "max_step_down",
            self.max_step_down,
            "use 1 or more",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoscalerSignals:
    """What the driver measured at ``now``; a signal is None when it was not measured
    (no requests in the window), and the autoscaler then holds."""

    ready_replicas: int
    """Replicas serving now."""

    starting_replicas: int = 0
    """Replicas decided but not yet ready; they count toward capacity."""

    queue_delay_s: float | None = None
    """Recent queue delay of admitted requests (the driver picks mean or a percentile)."""

    admitted_tokens_per_s: float | None = None
    """Tokens admitted per second over the window, all replicas together; divided by the
    ready replicas for ``admitted_tokens_per_replica``."""

    kv_occupancy: float | None = None
    """Fraction of KV blocks in use, mean over ready replicas."""

    deadline_miss_ratio: float | None = None
    """Fraction of recent requests that missed their deadline (or were shed for it)."""

    def __post_init__(self) -> None:
        if self.ready_replicas < 0 or self.starting_replicas < 0:
            raise ValueError(
                f"replica counts must be >= 0 (got ready {self.ready_replicas}, "
                f"starting {self.starting_replicas})"
            )
        names = ("queue_delay_s", "admitted_tokens_per_s", "kv_occupancy", "deadline_miss_ratio")
        for name in names:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(
                    f"signal {name} must be a finite number >= 0 or None (got {value})"
                )

    @property
    def current_replicas(self) -> int:
        """Ready plus starting: the capacity already decided."""
        return self.ready_replicas + self.starting_replicas


@dataclass(frozen=True, slots=True)
class ScaleUp:
    """Start ``count`` replicas now; they serve from ``ready_at_s``."""

    count: int
    """Replicas to add (>= 1)."""

    ready_at_s: float
    """When they will be ready: the decision time plus ``startup_delay_s``."""

    reason: str
    """The numbers behind the decision."""


@dataclass(frozen=True, slots=True)
class ScaleDown:
    """Drain and remove ``count`` ready replicas."""

    count: int
    """Replicas to remove (>= 1)."""

    reason: str
    """The numbers behind the decision."""


@dataclass(frozen=True, slots=True)
class Hold:
    """Change nothing."""

    reason: str
    """Why not (within tolerance, breach too short, cooling down, at a bound, ...)."""


ScaleDecision: TypeAlias = ScaleUp | ScaleDown | Hold
"""The outcome of :meth:`Autoscaler.decide`."""


class Autoscaler:
    """The autoscaling rule and its memory (see the module docstring)."""

    def __init__(self, config: AutoscalerConfig | None = None) -> None:
        self.config = config if config is not None else AutoscalerConfig()
        self.next_evaluation_s: float | None = None
        """When the next evaluation is due (None: at the first call)."""
        self._breach: Literal["up", "down"] | None = None
        self._breach_since_s = 0.0
        self._recommended = 0
        self._last_up_s: float | None = None
        self._last_scale_s: float | None = None

    def signal_value(self, signals: AutoscalerSignals) -> float | None:
        """The configured signal's value in ``signals`` (per replica where it says so)."""
        name = self.config.signal
        if name == "admitted_tokens_per_replica":
            total = signals.admitted_tokens_per_s
            if total is None or signals.ready_replicas == 0:
                return None
            return total / signals.ready_replicas
        value: float | None = getattr(signals, name)
        return value

    def _reset_breach(self) -> None:
        self._breach = None

    def _scaled(self, now: float, up: bool) -> None:
        self._last_scale_s = now
        if up:
            self._last_up_s = now
        self._reset_breach()

    def decide(self, now: float, signals: AutoscalerSignals) -> ScaleDecision:
        """Scale up, scale down or hold at ``now`` (calls must come in time order)."""
        cfg = self.config
        current = signals.current_replicas
        if current < cfg.min_replicas:
            count = cfg.min_replicas - current
            self._scaled(now, up=True)
            return ScaleUp(
                count,
                now + cfg.startup_delay_s,
                f"{current} replicas (ready plus starting) is below min_replicas "
                f"{cfg.min_replicas}",
            )
        if current > cfg.max_replicas:
            count = min(current - cfg.max_replicas, signals.ready_replicas)
            if count > 0:
                self._scaled(now, up=False)
                return ScaleDown(
                    count, f"{current} replicas is above max_replicas {cfg.max_replicas}"
                )
        if self.next_evaluation_s is not None and now < self.next_evaluation_s:
            return Hold(f"next evaluation at {self.next_evaluation_s:.3f} s")
        self.next_evaluation_s = now + cfg.evaluation_interval_s

        value = self.signal_value(signals)
        if value is None or signals.ready_replicas == 0:
            self._reset_breach()
            return Hold(f"{cfg.signal} not measured, or no replica ready")
        ratio = value / cfg.target
        desired = math.ceil(signals.ready_replicas * ratio)
        direction: Literal["up", "down"] | None = None
        if ratio > 1 + cfg.tolerance and desired > current:
            direction = "up"
        elif ratio < 1 - cfg.tolerance and desired < current:
            direction = "down"
        if direction is None:
            self._reset_breach()
            return Hold(
                f"{cfg.signal} {value:.4g} vs target {cfg.target:g} (ratio {ratio:.3f}); "
                f"desired {desired}, current {current}: nothing to do"
            )
        if self._breach != direction:
            self._breach = direction
            self._breach_since_s = now
            self._recommended = desired
        elif direction == "up":
            self._recommended = min(self._recommended, desired)
        else:
            self._recommended = max(self._recommended, desired)
        lasted_s = now - self._breach_since_s
        what = (
            f"{cfg.signal} {value:.4g} vs target {cfg.target:g} (ratio {ratio:.3f}) for "
            f"{lasted_s:g} s; desired {self._recommended}, current {current}"
        )
        if lasted_s < cfg.detection_delay_s:
            return Hold(f"{what}; not yet past detection_delay_s {cfg.detection_delay_s:g}")
        return (
            self._scale_up(now, current, what)
            if direction == "up"
            else (self._scale_down(now, signals, current, what))
        )

    def _scale_up(self, now: float, current: int, what: str) -> ScaleDecision:
        cfg = self.config
        if self._last_up_s is not None and now - self._last_up_s < cfg.scale_up_cooldown_s:
            until_s = self._last_up_s + cfg.scale_up_cooldown_s
            return Hold(f"{what}; scale-up cooldown until {until_s:g} s")
        count = min(self._recommended - current, cfg.max_step, cfg.max_replicas - current)
        if count <= 0:
            return Hold(f"{what}; at max_replicas {cfg.max_replicas}")
        self._scaled(now, up=True)
        return ScaleUp(count, now + cfg.startup_delay_s, what)

    def _scale_down(
        self, now: float, signals: AutoscalerSignals, current: int, what: str
    ) -> ScaleDecision:
        cfg = self.config
        if signals.starting_replicas > 0:
            return Hold(f"{what}; {signals.starting_replicas} replicas still starting")
        if self._last_scale_s is not None and now - self._last_scale_s < cfg.scale_down_cooldown_s:
            return Hold(
                f"{what}; scale-down cooldown until "
                f"{self._last_scale_s + cfg.scale_down_cooldown_s:g} s"
            )
        target = max(self._recommended, cfg.min_replicas)
        count = min(current - target, cfg.max_step_down, signals.ready_replicas)
        if count <= 0:
            return Hold(f"{what}; at min_replicas {cfg.min_replicas}")
        self._scaled(now, up=False)
        return ScaleDown(count, what)
