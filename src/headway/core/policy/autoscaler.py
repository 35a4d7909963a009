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
here is already aggregated), and percentage-based rate policies (``max_step`` is a count).

``kind: predictive`` (seed 003: "combine queue delay, admitted token work, cache occupancy,
active sequences, deadline misses, and load per replica"; seed 002: "predict short-horizon
offered load") replaces step 3's one-signal ``desired`` and nothing else: the same
breach, detection, stabilisation, cooldown and step rules then apply to it::

    pressure   = max(value_i / target_i)           every measured signal of
                                                   :class:`PredictiveConfig` (HPA's
                                                   several-metrics rule: the largest)
    capacity   = admitted tokens per ready replica while they are full (queue delay, KV
                 occupancy or active sequences at target; deadline misses lag, so not
                 them), smoothed; starting from replica_tokens_per_s when declared
    forecast   = Holt's damped trend of offered tokens/s (:mod:`.load_forecast`),
                 startup_delay_s ahead: the load when a replica started now serves
    peak       = the largest offered load measured over the last peak_hold_s
    ahead      = forecast / capacity, or ready × pressure if larger while the forecast
                 is still above what the ready replicas carry
    floor      = peak / capacity, × warm_surge if startup_delay_s > recovery_objective_s
    need       = ahead                       if ahead > current (the forecast adds)
                 min(current, max(ahead, floor))   else (the floor only keeps)
    desired    = ceil(need); ratio = need / current (for the tolerance band)

Before any capacity is known: ``need = ready × pressure`` (HPA's rule on the combined
signals), and with a start-up longer than the recovery objective no scale-down at all:
the predictive autoscaler does not remove a replica it could not bring back in time and
whose load it cannot measure (seed 003: "keep warm capacity when model loading and
compilation take longer than the service's recovery objective"). Sizing a scale-down for
the peak of the last ``peak_hold_s`` (default: start-up plus the scale-down cooldown) is
what keeps a load that comes and goes faster than a replica starts from flapping the
pool: the capacity stays for the next high phase. The floor never starts a replica: once
a burst has gone, a replica that would be ready for it arrives to no work.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal, TypeAlias

import msgspec

from headway.core.policy._checks import require
from headway.core.policy.load_forecast import HoltForecast

__all__ = [
    "SIGNALS",
    "Autoscaler",
    "AutoscalerConfig",
    "AutoscalerSignals",
    "Hold",
    "PredictiveConfig",
    "ScaleDecision",
    "ScaleDown",
    "ScaleUp",
    "Signal",
    "window_queue_delay_s",
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


class PredictiveConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The signals' targets and the forecast of ``kind: predictive`` (module docstring)."""

    queue_delay_target_s: float = 1.0
    """Comfortable queue delay of admitted requests, seconds."""

    kv_occupancy_target: float = 0.8
    """Comfortable fraction of KV blocks in use (mean over ready replicas)."""

    deadline_miss_target: float = 0.05
    """Tolerated fraction of recent requests that missed their deadline."""

    active_sequences_target: float | None = None
    """Comfortable running sequences per ready replica (None: not a signal)."""

    replica_tokens_per_s: float | None = None
    """Tokens per second (prompt + output) one replica carries inside its SLO, e.g. from
    ``headway plan``; also the target of admitted tokens per replica. It is the starting
    value, refined by what full replicas admit. None: unknown until replicas are full."""

    alpha: float = 0.5
    """Holt's level smoothing, per evaluation: half the weight on the newest sample."""

    beta: float = 0.3
    """Holt's slope smoothing: a ramp is believed after two or three evaluations."""

    damping: float = 0.9
    """Holt's trend damping per evaluation: a slope is carried at most 9 evaluations'
    worth (``φ / (1 − φ)``), 135 s at HPA's 15 s (about the default start-up), however
    long the start-up."""

    recovery_objective_s: float = 60.0
    """How long the service may run short of capacity after a surge. When
    ``startup_delay_s`` is longer, scaling up cannot meet it, so capacity is kept warm."""

    warm_surge: float = 1.5
    """With start-up past the recovery objective, keep capacity for this multiple of the
    recent peak load (the surge the pool must absorb before a new replica is ready)."""

    peak_hold_s: float | None = None
    """Scale-down sizes for the peak of this many seconds; None: ``startup_delay_s +
    scale_down_cooldown_s`` (capacity removed now would be back no sooner)."""

    def __post_init__(self) -> None:
        for name in ("queue_delay_target_s", "warm_surge"):
            value = getattr(self, name)
            require(
                math.isfinite(value) and value > 0,
                "autoscaler.predictive",
                name,
                value,
                "use a number > 0",
            )
        for name in ("kv_occupancy_target", "deadline_miss_target", "alpha", "beta", "damping"):
            value = getattr(self, name)
            require(
                math.isfinite(value) and 0 < value <= 1,
                "autoscaler.predictive",
                name,
                value,
                "use a fraction in (0, 1]",
            )
        for name in ("active_sequences_target", "replica_tokens_per_s", "peak_hold_s"):
            value = getattr(self, name)
            require(
                value is None or (math.isfinite(value) and value > 0),
                "autoscaler.predictive",
                name,
                value,
                "use a number > 0, or leave it out",
            )
        require(
            math.isfinite(self.recovery_objective_s) and self.recovery_objective_s >= 0,
            "autoscaler.predictive",
            "recovery_objective_s",
            self.recovery_objective_s,
            "use seconds >= 0",
        )


class AutoscalerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """When and how much to scale (the rule is in the module docstring)."""

    kind: Literal["reactive", "predictive"] = "reactive"
    """``reactive``: HPA's rule on ``signal``; ``predictive``: the same rule on the
    combined signals and the offered-load forecast of ``predictive``."""

    predictive: PredictiveConfig = msgspec.field(default_factory=PredictiveConfig)
    """Targets and forecast settings of ``kind: predictive`` (unused when reactive)."""

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
            self.kind in ("reactive", "predictive"),
            "autoscaler",
            "kind",
            self.kind,
            "use reactive or predictive",
        )
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
    """Recent queue delay (both drivers: :func:`window_queue_delay_s`)."""

    admitted_tokens_per_s: float | None = None
    """Tokens admitted per second over the window, all replicas together; divided by the
    ready replicas for ``admitted_tokens_per_replica``."""

    kv_occupancy: float | None = None
    """Fraction of KV blocks in use, mean over ready replicas."""

    deadline_miss_ratio: float | None = None
    """Fraction of recent requests that missed their deadline (or were shed for it)."""

    offered_tokens_per_s: float | None = None
    """Tokens (prompt + expected output) of the requests that arrived per second over the
    window, admitted or not: the offered load the predictive autoscaler forecasts."""

    active_sequences: float | None = None
    """Sequences running now, all ready replicas together."""

    def __post_init__(self) -> None:
        if self.ready_replicas < 0 or self.starting_replicas < 0:
            raise ValueError(
                f"replica counts must be >= 0 (got ready {self.ready_replicas}, "
                f"starting {self.starting_replicas})"
            )
        names = (
            "queue_delay_s",
            "admitted_tokens_per_s",
            "kv_occupancy",
            "deadline_miss_ratio",
            "offered_tokens_per_s",
            "active_sequences",
        )
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


def window_queue_delay_s(waited_s: float, dispatched: int, oldest_waiting_s: float) -> float:
    """The queue delay of one evaluation window: the mean wait of the ``dispatched``
    requests that left the queue in it (``waited_s`` their waits together), and at least
    ``oldest_waiting_s``, how long the oldest request still waiting has waited so far.

    Slots that free together leave windows in which nothing is dispatched while the queue
    grows; read as the mean alone, such a window says "no delay", resets the breach and a
    saturated pool is never scaled up."""
    mean_s = waited_s / dispatched if dispatched else 0.0
    return max(mean_s, oldest_waiting_s)


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
        p = self.config.predictive
        self.forecast = HoltForecast(p.alpha, p.beta, p.damping)
        """The offered-load forecast (``kind: predictive``; one sample per evaluation)."""
        self.capacity_tokens_per_s: float | None = p.replica_tokens_per_s
        """Tokens per second one replica carries: declared, or learned while saturated."""
        self._peaks: deque[tuple[float, float]] = deque()

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

        sized = self._predict(now, signals) if cfg.kind == "predictive" else self._react(signals)
        if isinstance(sized, Hold):
            self._reset_breach()
            return sized
        ratio, desired, why, may_shrink = sized
        direction: Literal["up", "down"] | None = None
        if ratio > 1 + cfg.tolerance and desired > current:
            direction = "up"
        elif ratio < 1 - cfg.tolerance and desired < current and may_shrink:
            direction = "down"
        if direction is None:
            self._reset_breach()
            return Hold(
                f"{why} (ratio {ratio:.3f}); desired {desired}, current {current}: nothing to do"
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
            f"{why} (ratio {ratio:.3f}) for {lasted_s:g} s; desired {self._recommended}, "
            f"current {current}"
        )
        if lasted_s < cfg.detection_delay_s:
            return Hold(f"{what}; not yet past detection_delay_s {cfg.detection_delay_s:g}")
        return (
            self._scale_up(now, current, what)
            if direction == "up"
            else (self._scale_down(now, signals, current, what))
        )

    def _react(self, signals: AutoscalerSignals) -> tuple[float, int, str, bool] | Hold:
        """HPA on one signal: (ratio, desired, what, may scale down), or Hold unmeasured."""
        cfg = self.config
        value = self.signal_value(signals)
        if value is None or signals.ready_replicas == 0:
            return Hold(f"{cfg.signal} not measured, or no replica ready")
        ratio = value / cfg.target
        desired = math.ceil(signals.ready_replicas * ratio)
        return ratio, desired, f"{cfg.signal} {value:.4g} vs target {cfg.target:g}", True

    def pressure(self, signals: AutoscalerSignals) -> tuple[float, str] | None:
        """The largest ratio of a measured signal to its target, and its name; None when
        no signal is measured or no replica is ready."""
        p = self.config.predictive
        ready = signals.ready_replicas
        if ready == 0:
            return None
        ratios: list[tuple[float, str]] = []
        if signals.queue_delay_s is not None:
            ratios.append((signals.queue_delay_s / p.queue_delay_target_s, "queue_delay_s"))
        if signals.kv_occupancy is not None:
            ratios.append((signals.kv_occupancy / p.kv_occupancy_target, "kv_occupancy"))
        if signals.deadline_miss_ratio is not None:
            miss = signals.deadline_miss_ratio / p.deadline_miss_target
            ratios.append((miss, "deadline_miss_ratio"))
        if signals.active_sequences is not None and p.active_sequences_target is not None:
            per = signals.active_sequences / ready / p.active_sequences_target
            ratios.append((per, "active_sequences"))
        if signals.admitted_tokens_per_s is not None and p.replica_tokens_per_s is not None:
            per = signals.admitted_tokens_per_s / ready / p.replica_tokens_per_s
            ratios.append((per, "admitted_tokens_per_replica"))
        return max(ratios) if ratios else None

    def _predict(
        self, now: float, signals: AutoscalerSignals
    ) -> tuple[float, int, str, bool] | Hold:
        """The combined-signal, forecast rule of ``kind: predictive`` (module docstring)."""
        cfg = self.config
        p = cfg.predictive
        ready = signals.ready_replicas
        found = self.pressure(signals)
        if found is None:
            return Hold("no signal measured, or no replica ready")
        pressure, worst = found
        admitted = signals.admitted_tokens_per_s
        if self._full(signals) and admitted is not None:
            measured = admitted / ready  # a full replica admits what it can carry
            known = self.capacity_tokens_per_s
            if known is not None:
                self.capacity_tokens_per_s = known + p.alpha * (measured - known)
            elif measured > 0:  # a full window that admitted nothing does not start it
                self.capacity_tokens_per_s = measured
        load = signals.offered_tokens_per_s
        if load is None:
            load = admitted
        forecast = None
        if load is not None:
            self.forecast.observe(load)
            forecast = self.forecast.forecast(cfg.startup_delay_s / cfg.evaluation_interval_s)
        hold_s = p.peak_hold_s
        if hold_s is None:
            hold_s = cfg.startup_delay_s + cfg.scale_down_cooldown_s
        peaks = self._peaks
        if load is not None:  # seen, not forecast: a forecast's overshoot is not held
            peaks.append((now, load))
        while peaks and peaks[0][0] < now - hold_s:
            peaks.popleft()
        peak = max((v for _, v in peaks), default=0.0)
        warm = cfg.startup_delay_s > p.recovery_objective_s
        capacity = self.capacity_tokens_per_s
        current = signals.current_replicas
        why = f"{worst} at {pressure:.3f}× its target"
        if capacity is None or capacity <= 0 or forecast is None:
            # No load model yet: HPA's rule on the pressure; kept warm, it only grows.
            need = ready * pressure
            may_shrink = not warm
            if warm:
                why += (
                    f"; no replica capacity known and start-up {cfg.startup_delay_s:g} s "
                    f"exceeds the recovery objective {p.recovery_objective_s:g} s: capacity "
                    "kept warm"
                )
        else:
            ahead = forecast / capacity
            if pressure > 1 and forecast > ready * capacity:
                ahead = max(ahead, ready * pressure)  # still overloaded when it is ready
            floor = (p.warm_surge if warm else 1.0) * peak / capacity
            # The forecast adds replicas; the floor only keeps them (it never adds one: a
            # burst's peak is no reason to start a replica once its load has gone).
            need = ahead if ahead > current else min(float(current), max(ahead, floor))
            may_shrink = True
            why += (
                f", offered {load:.4g} tokens/s forecast {forecast:.4g} in "
                f"{cfg.startup_delay_s:g} s, peak {peak:.4g}, {capacity:.4g} per replica"
            )
            if warm:
                why += f", {p.warm_surge:g}× the peak kept warm"
        ratio = need / current if current else math.inf
        return ratio, max(1, math.ceil(need)), why, may_shrink

    def _full(self, signals: AutoscalerSignals) -> bool:
        """A signal that is high while replicas are full now (queue delay, KV occupancy,
        active sequences) is at its target: the admitted rate is what they carry. Deadline
        misses lag (a drained backlog still ends late), so they do not count."""
        p = self.config.predictive
        ready = max(1, signals.ready_replicas)
        return (
            (signals.queue_delay_s is not None and signals.queue_delay_s >= p.queue_delay_target_s)
            or (signals.kv_occupancy is not None and signals.kv_occupancy >= p.kv_occupancy_target)
            or (
                signals.active_sequences is not None
                and p.active_sequences_target is not None
                and signals.active_sequences / ready >= p.active_sequences_target
            )
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
