"""Degraded modes: serve shorter, or shed what is optional, under declared pressure.

Seed 002 (items 4–5): "shorten output or context only under an explicit degraded mode"
and "shed optional branches and speculative attempts". A mode is declared for one or more
priority bands (``degraded.modes.<name>``); while it is **on**, a request of those bands

* gets at most ``max_tokens`` output tokens (its own ``max_tokens``, when lower, stands);
* has its prompt trimmed to ``context_tokens`` by the declared ``trim`` rule (the driver
  applies the rule: the live gateway to the request body, the simulator to the call's
  prompt length);
* is shed (``degraded_optional``, with a truthful Retry-After) when it is marked
  optional or speculative and the mode has ``shed_optional``.

A mode is never on silently: it enters when the gateway's pressure reaches any of its
``enter`` thresholds, and leaves only when the pressure is at or below every ``leave``
threshold and it has been on for ``min_on_s`` (hysteresis: two thresholds and a dwell, so
a queue that drains for a moment does not flap it). The admin API may force a mode on or
off, or hand it back to the thresholds. Each change is a :class:`ModeChange` the driver
logs and counts, and every request served degraded says so (:meth:`Degradation.header`).

Pressure (:class:`PressureReading`) is what the core measures on the gateway as a whole:
the oldest queued request's wait and the share of dispatch slots held. It never reads a
clock: the driver passes ``now``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from headway.core.policy._checks import is_finite_at_least, require
from headway.core.policy.queues import BANDS, Band

__all__ = [
    "Degradation",
    "DegradedConfig",
    "DegradedMode",
    "DegradedModes",
    "ModeChange",
    "ModeState",
    "Pressure",
    "PressureReading",
    "Trim",
]

Trim = Literal["oldest_turns", "prompt_head"]
"""How a prompt is trimmed to ``context_tokens``: ``oldest_turns`` drops the oldest chat
messages after the system messages, keeping the last one (a completion's prompt loses
its head); ``prompt_head`` cuts the head of the prompt text, keeping its end."""

_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
Forced = Literal["on", "off", "auto"]


class Pressure(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Thresholds on the gateway's pressure (a field left out is not a condition)."""

    queue_delay_s: float | None = None
    """The oldest queued request's wait, seconds."""

    slot_utilization: float | None = None
    """Dispatched requests / dispatch slots of the ready upstreams (0..1; no ready slot
    with work waiting or running reads 1)."""

    def named(self) -> dict[str, float]:
        """The thresholds given, by signal."""
        return {
            k: v
            for k in ("queue_delay_s", "slot_utilization")
            if (v := getattr(self, k)) is not None
        }


@dataclass(frozen=True, slots=True)
class PressureReading:
    """The gateway's pressure at one moment (:class:`Pressure`'s signals, measured)."""

    queue_delay_s: float
    slot_utilization: float

    def signal(self, name: str) -> float:
        """One signal by name."""
        return float(getattr(self, name))


class DegradedMode(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One degraded mode (see the module docstring)."""

    bands: list[Band]
    """The priority bands it applies to (each band has one mode at most)."""

    max_tokens: int | None = None
    """Output cap while on (None: output untouched)."""

    context_tokens: int | None = None
    """Prompt limit while on, tokens (None: prompt untouched)."""

    trim: Trim = "oldest_turns"
    """How a prompt over ``context_tokens`` is trimmed."""

    shed_optional: bool = False
    """While on, shed the requests marked optional or speculative (live: the header
    ``x-headway-optional: true``; simulated: a workload class with ``optional: true``)."""

    enter: Pressure | None = None
    """It enters when the pressure reaches any of these (None: only the admin API turns it
    on)."""

    leave: Pressure | None = None
    """It leaves when the pressure is at or below every one of these (None: half of each
    ``enter`` threshold)."""

    min_on_s: float = 10.0
    """Once on by pressure, it stays on at least this long."""

    def __post_init__(self) -> None:
        section = "degraded.modes"
        require(bool(self.bands), section, "bands", self.bands, "name at least one band")
        for band in self.bands:
            require(band in BANDS, section, "bands", band, f"use bands of {BANDS}")
        require(
            self.max_tokens is None or self.max_tokens >= 1,
            section, "max_tokens", self.max_tokens, "use 1 or more, or leave it out",
        )  # fmt: skip
        require(
            self.context_tokens is None or self.context_tokens >= 1,
            section, "context_tokens", self.context_tokens, "use 1 or more, or leave it out",
        )  # fmt: skip
        require(
            self.max_tokens is not None or self.context_tokens is not None or self.shed_optional,
            section, "max_tokens", None,
            "a mode must change something: set max_tokens, context_tokens or shed_optional",
        )  # fmt: skip
        require(
            is_finite_at_least(self.min_on_s, 0.0), section, "min_on_s", self.min_on_s,
            "use seconds >= 0, e.g. 10",
        )  # fmt: skip
        for name, pressure in (("enter", self.enter), ("leave", self.leave)):
            if pressure is None:
                continue
            for signal, value in pressure.named().items():
                require(
                    math.isfinite(value) and value >= 0,
                    section, f"{name}.{signal}", value, "use a number >= 0",
                )  # fmt: skip
        if self.enter is not None:
            require(
                bool(self.enter.named()), section, "enter", self.enter,
                "name queue_delay_s or slot_utilization, or leave enter out (admin only)",
            )  # fmt: skip
            for signal, low in self.leave_thresholds().items():
                high = self.enter.named().get(signal)
                require(
                    high is None or low < high,
                    section, f"leave.{signal}", low,
                    f"must be below enter.{signal} ({high}) so the mode does not flap",
                )  # fmt: skip

    def leave_thresholds(self) -> dict[str, float]:
        """The leave thresholds in force (``leave``, or half of each ``enter``)."""
        if self.leave is not None:
            return self.leave.named()
        return {k: v / 2 for k, v in (self.enter.named() if self.enter else {}).items()}


class DegradedConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``degraded`` section: modes by name."""

    modes: dict[str, DegradedMode] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for name, mode in self.modes.items():
            require(
                bool(_NAME.match(name)), "degraded", "modes", name,
                "name a mode with lowercase letters, digits, '-' or '_' (at most 40)",
            )  # fmt: skip
            for band in mode.bands:
                require(
                    band not in seen, f"degraded.modes.{name}", "bands", band,
                    f"band {band!r} already has mode {seen.get(band)!r}; one mode per band",
                )  # fmt: skip
                seen[band] = name

    def mode_of(self, band: str) -> str | None:
        """The mode declared for ``band`` (None: none)."""
        for name, mode in self.modes.items():
            if band in mode.bands:
                return name
        return None


@dataclass(frozen=True, slots=True)
class ModeChange:
    """A mode turned on or off (the driver logs it and counts it)."""

    mode: str
    on: bool
    at_s: float
    cause: str
    """``pressure: queue_delay_s 1.3 >= 1`` or ``admin: on``."""


@dataclass(slots=True)
class ModeState:
    """One mode's state."""

    on: bool = False
    since_s: float = 0.0
    forced: Forced = "auto"
    served: int = 0
    """Requests it changed (capped, trimmed or shed) so far."""


@dataclass(frozen=True, slots=True)
class Degradation:
    """What a mode changed of one request (the driver applies it and tells the client)."""

    mode: str
    max_tokens: int | None = None
    """The output cap now applied (None: output untouched)."""
    asked_max_tokens: int | None = None
    """What the request asked for (None: it sent none)."""
    context_tokens: int | None = None
    """Trim the prompt to this (None: untouched)."""
    trim: Trim = "oldest_turns"
    shed: bool = False
    """It is optional and the mode sheds optional requests."""
    retry_after_s: float = 1.0
    """For a shed: when the mode may have left."""

    def header(self) -> str:
        """The ``x-headway-degraded`` value: the mode and what changed, e.g.
        ``brief; max_tokens=256 (asked 1024); context_tokens=4000 (oldest_turns)``."""
        parts = [self.mode]
        if self.max_tokens is not None:
            asked = "none" if self.asked_max_tokens is None else self.asked_max_tokens
            parts.append(f"max_tokens={self.max_tokens} (asked {asked})")
        if self.context_tokens is not None:
            parts.append(f"context_tokens={self.context_tokens} ({self.trim})")
        if self.shed:
            parts.append("shed optional")
        return "; ".join(parts)


@dataclass(slots=True)
class DegradedModes:
    """The modes' states, driven by pressure readings and the admin API."""

    config: DegradedConfig
    states: dict[str, ModeState] = field(default_factory=dict)
    _changes: list[ModeChange] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.states = {name: ModeState() for name in self.config.modes}

    def reconfigure(self, config: DegradedConfig) -> None:
        """Swap in ``config``: a mode still declared keeps its state; a new one starts off."""
        self.config = config
        self.states = {name: self.states.get(name, ModeState()) for name in config.modes}

    def changes(self) -> list[ModeChange]:
        """The changes since the last call, in order."""
        out, self._changes = self._changes, []
        return out

    def update(self, now: float, reading: PressureReading) -> None:
        """Enter or leave each automatic mode on ``reading`` (module docstring)."""
        for name, mode in self.config.modes.items():
            state = self.states[name]
            if state.forced != "auto" or mode.enter is None:
                continue
            if not state.on:
                for signal, high in mode.enter.named().items():
                    value = reading.signal(signal)
                    if value >= high:
                        self._set(name, True, now, f"pressure: {signal} {value:.3g} >= {high:g}")
                        break
            elif now - state.since_s >= mode.min_on_s:
                low = mode.leave_thresholds()
                if all(reading.signal(s) <= v for s, v in low.items()):
                    said = ", ".join(
                        f"{s} {reading.signal(s):.3g} <= {v:g}" for s, v in low.items()
                    )
                    self._set(name, False, now, f"pressure: {said}")

    def force(self, now: float, name: str, forced: Forced) -> None:
        """The admin API: ``on`` or ``off`` until told ``auto`` (then the thresholds
        decide from the next reading). Raises KeyError for an undeclared mode."""
        state = self.states[name]
        state.forced = forced
        if forced != "auto" and state.on != (forced == "on"):
            self._set(name, forced == "on", now, f"admin: {forced}")

    def _set(self, name: str, on: bool, now: float, cause: str) -> None:
        state = self.states[name]
        state.on, state.since_s = on, now
        self._changes.append(ModeChange(name, on, now, cause))

    def degrade(
        self,
        now: float,
        band: str,
        *,
        max_tokens: int | None,
        prompt_tokens: int,
        optional: bool,
    ) -> Degradation | None:
        """What the mode of ``band``, if on, changes of a request that asked for
        ``max_tokens`` with a prompt of ``prompt_tokens`` (None: nothing changes)."""
        name = self.config.mode_of(band)
        if name is None or not self.states[name].on:
            return None
        mode = self.config.modes[name]
        state = self.states[name]
        if optional and mode.shed_optional:
            state.served += 1
            left_s = mode.min_on_s - (now - state.since_s) if state.forced == "auto" else 0.0
            return Degradation(name, shed=True, retry_after_s=max(1.0, left_s))
        cap = mode.max_tokens
        capped = cap is not None and (max_tokens is None or max_tokens > cap)
        limit = mode.context_tokens
        trimmed = limit is not None and prompt_tokens > limit
        if not (capped or trimmed):
            return None
        state.served += 1
        return Degradation(
            name,
            max_tokens=cap if capped else None,
            asked_max_tokens=max_tokens,
            context_tokens=limit if trimmed else None,
            trim=mode.trim,
        )
