"""Fault knobs for drills: what a failing engine does, switched on at start or at runtime.

``POST /admin/faults`` takes a :class:`FaultUpdate` (any subset of the knobs) and
``headway emulate --fault NAME=VALUE`` the same names at start. Durations are wall-clock
seconds. :class:`FaultState` holds what is in force; :class:`ScaledStepTime` applies
``slowdown_factor`` to the engine model's step times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from headway.core.engine.steptime import BatchShape, StepTimeModel
from headway.core.errors import ConfigError

__all__ = ["FaultState", "FaultUpdate", "ScaledStepTime", "parse_fault_flag"]


class FaultUpdate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A change to the fault knobs; a knob left out keeps its value."""

    crash: bool | None = None
    """``true``: exit the process at once (exit code 70), dropping every connection."""

    crash_after_s: float | None = None
    """Exit the process this many seconds from now (a crash during a run)."""

    stall: bool | None = None
    """``true``: stop stepping the engine (streams freeze, requests pile up) until
    ``false``."""

    stall_s: float | None = None
    """Stop stepping the engine for this many seconds from now."""

    slowdown_factor: float | None = None
    """Multiply every step's duration by this (> 0; 1 is normal speed)."""

    corrupt_fingerprint: bool | None = None
    """``true``: generate different tokens than the model revision should (a wrong
    artifact), so a readiness fingerprint check fails."""

    refuse_connections_s: float | None = None
    """Close the listening socket for this many seconds (connections are refused), then
    listen again on the same port. Open connections stay up."""

    delay_s: float | None = None
    """Hold every new request this long before the engine sees it (a slow front end)."""

    fail_prompts_over_tokens: int | None = None
    """Answer 500 to every request whose prompt is longer than this many tokens (0: off):
    a bad release that breaks on real traffic while its short readiness probe passes."""

    budget_fraction: float | None = None
    """Honour only this fraction of each request's ``x-headway-budget-ms`` (in (0, 1];
    1 is the whole budget): an engine, or a proxy in front of it, that stops a request
    before its caller's deadline, so the caller sees the engine's deadline answer first."""

    def check(self) -> None:
        """Raise ``ConfigError`` naming the knob when a value is out of range."""
        for name in ("crash_after_s", "stall_s", "refuse_connections_s", "delay_s"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ConfigError(
                    f"fault `{name}` must be a finite number of seconds >= 0 (got {value})",
                    path=f"$.{name}",
                )
        over = self.fail_prompts_over_tokens
        if over is not None and over < 0:
            raise ConfigError(
                f"fault `fail_prompts_over_tokens` must be >= 0 (got {over}); 0 turns it off",
                path="$.fail_prompts_over_tokens",
            )
        fraction = self.budget_fraction
        if fraction is not None and not (0 < fraction <= 1):
            raise ConfigError(
                f"fault `budget_fraction` must be in (0, 1] (got {fraction}); 1 honours the "
                "whole budget, 0.5 stops a request halfway to its caller's deadline",
                path="$.budget_fraction",
            )
        factor = self.slowdown_factor
        if factor is not None and not (factor > 0 and math.isfinite(factor)):
            raise ConfigError(
                f"fault `slowdown_factor` must be a finite number > 0 (got {factor}); "
                "1 is normal speed, 3 makes every step three times as long",
                path="$.slowdown_factor",
            )


@dataclass(slots=True)
class FaultState:
    """The knobs in force. Times are on the server's monotonic clock (seconds)."""

    slowdown_factor: float = 1.0
    corrupt_fingerprint: bool = False
    delay_s: float = 0.0
    fail_prompts_over_tokens: int = 0
    """0: off."""
    budget_fraction: float = 1.0
    stalled_until: float = -math.inf
    """The engine does not step before this time (``inf``: until cleared)."""
    refuse_until: float = -math.inf
    """The listener is closed until this time."""
    crash_at: float = math.inf
    """The process exits at this time."""

    def apply(self, update: FaultUpdate, now: float) -> None:
        """Apply ``update`` at monotonic time ``now`` (checked first)."""
        update.check()
        if update.slowdown_factor is not None:
            self.slowdown_factor = update.slowdown_factor
        if update.corrupt_fingerprint is not None:
            self.corrupt_fingerprint = update.corrupt_fingerprint
        if update.delay_s is not None:
            self.delay_s = update.delay_s
        if update.fail_prompts_over_tokens is not None:
            self.fail_prompts_over_tokens = update.fail_prompts_over_tokens
        if update.budget_fraction is not None:
            self.budget_fraction = update.budget_fraction
        if update.stall is not None:
            self.stalled_until = math.inf if update.stall else -math.inf
        if update.stall_s is not None:
            self.stalled_until = now + update.stall_s
        if update.refuse_connections_s is not None:
            self.refuse_until = now + update.refuse_connections_s
        if update.crash_after_s is not None:
            self.crash_at = now + update.crash_after_s
        if update.crash:
            self.crash_at = now

    def is_stalled(self, now: float) -> bool:
        """True while the engine must not step."""
        return now < self.stalled_until

    def view(self, now: float) -> dict[str, object]:
        """The knobs as JSON-ready values (remaining seconds, ``null`` when off)."""

        def left(until: float) -> float | None:
            if until == math.inf:
                return None
            return max(0.0, until - now) if until > now else 0.0

        return {
            "stall": self.stalled_until == math.inf,
            "stall_s": left(self.stalled_until) if self.stalled_until != math.inf else None,
            "slowdown_factor": self.slowdown_factor,
            "corrupt_fingerprint": self.corrupt_fingerprint,
            "refuse_connections_s": left(self.refuse_until),
            "delay_s": self.delay_s,
            "fail_prompts_over_tokens": self.fail_prompts_over_tokens,
            "budget_fraction": self.budget_fraction,
            "crash_after_s": left(self.crash_at),
        }


@dataclass(slots=True)
class ScaledStepTime:
    """A step-time model whose durations are multiplied by the live ``slowdown_factor``."""

    inner: StepTimeModel
    faults: FaultState

    def step_time_s(self, batch: BatchShape) -> float:
        """The inner model's duration times the slowdown factor."""
        return self.inner.step_time_s(batch) * self.faults.slowdown_factor

    def decode_step_affine(self, num_seqs: int, shared_kv_tokens: int = 0) -> tuple[float, float]:
        """The inner affine form, scaled (the emulator steps one by one and never caches
        it, so a change of factor applies from the next step)."""
        base_s, per_kv_s = self.inner.decode_step_affine(num_seqs, shared_kv_tokens)
        factor = self.faults.slowdown_factor
        return base_s * factor, per_kv_s * factor


def parse_fault_flag(text: str) -> FaultUpdate:
    """``NAME=VALUE`` from ``--fault`` as a one-knob :class:`FaultUpdate`."""
    name, sep, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    known = FaultUpdate.__struct_fields__
    if not sep or name not in known:
        raise ConfigError(
            f"--fault {text!r}: give NAME=VALUE with NAME one of {', '.join(known)} "
            "(e.g. --fault slowdown_factor=3)",
            path=f"--fault {name}",
        )
    value: object
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        value = lowered == "true"
    else:
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(
                f"--fault {name}={raw!r}: the value must be a number or true/false",
                path=f"--fault {name}",
            ) from None
    try:
        update = msgspec.convert({name: value}, FaultUpdate)
    except msgspec.ValidationError as error:
        raise ConfigError(f"--fault {name}={raw!r}: {error}", path=f"--fault {name}") from None
    update.check()
    return update
