"""Deadlines: set once at admission, then only read and passed on.

A request's deadline is an absolute time, ``deadline_s = now + budget_s``, fixed when it is
admitted (STYLE §3.5: "compute deadlines once"). Everything downstream asks how much is
left (:meth:`Deadline.remaining_s`) or derives a tighter deadline for a sub-call
(:meth:`Deadline.for_call`); nothing starts a fresh relative timeout, which is how a
request that waited in three queues ends up with three full budgets.

Across a process boundary the *remaining budget* travels, not the absolute time, because
two machines' monotonic clocks share no origin (gRPC's ``grpc-timeout`` does the same):
:meth:`Deadline.to_header` writes whole milliseconds left into :data:`BUDGET_HEADER`, and
:meth:`Deadline.from_header` turns them back into a deadline on the receiver's clock.
A hop reserve (``hop_reserve_s``) is kept back for the caller to relay the answer or the
error before its own deadline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import msgspec

from headway.core.policy._checks import is_finite_above, is_finite_at_least, require

__all__ = ["BUDGET_HEADER", "Deadline", "DeadlineConfig", "DeadlinePolicy"]

BUDGET_HEADER: Final = "x-headway-budget-ms"
"""The HTTP header that carries a request's remaining budget, whole milliseconds."""


class DeadlineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How budgets become deadlines."""

    default_budget_s: float | None = None
    """Budget of a request that states none (None: such requests have no deadline)."""

    max_budget_s: float | None = None
    """Largest budget a request may ask for; larger ones are clamped (None: no clamp)."""

    hop_reserve_s: float = 0.0
    """Kept back from the budget passed to each downstream call, so that the caller can
    still relay the answer or the error before its own deadline."""

    def __post_init__(self) -> None:
        require(
            is_finite_above(self.default_budget_s, 0.0),
            "deadlines",
            "default_budget_s",
            self.default_budget_s,
            "use seconds > 0, or null for no default deadline",
        )
        require(
            is_finite_above(self.max_budget_s, 0.0),
            "deadlines",
            "max_budget_s",
            self.max_budget_s,
            "use seconds > 0, or null for no clamp",
        )
        require(
            self.default_budget_s is None
            or self.max_budget_s is None
            or self.default_budget_s <= self.max_budget_s,
            "deadlines",
            "default_budget_s",
            self.default_budget_s,
            f"it must be <= max_budget_s ({self.max_budget_s})",
        )
        require(
            is_finite_at_least(self.hop_reserve_s, 0.0),
            "deadlines",
            "hop_reserve_s",
            self.hop_reserve_s,
            "use seconds >= 0, e.g. 0.05",
        )


@dataclass(frozen=True, slots=True)
class Deadline:
    """An absolute deadline on the clock of the process that holds it."""

    deadline_s: float
    """The time by which the request must be done."""

    def __post_init__(self) -> None:
        if math.isnan(self.deadline_s):
            raise ValueError("Deadline.deadline_s must be a time, not NaN")

    @classmethod
    def after(cls, now: float, budget_s: float) -> Deadline:
        """The deadline ``budget_s`` seconds after ``now``."""
        if not (math.isfinite(budget_s) and budget_s >= 0):
            raise ValueError(f"budget_s must be a finite number >= 0 (got {budget_s})")
        return cls(now + budget_s)

    def remaining_s(self, now: float) -> float:
        """Seconds left at ``now`` (0.0 once passed)."""
        return max(self.deadline_s - now, 0.0)

    def expired(self, now: float) -> bool:
        """True at and after the deadline."""
        return now >= self.deadline_s

    def for_call(
        self, now: float, *, reserve_s: float = 0.0, budget_s: float | None = None
    ) -> Deadline:
        """The deadline of a sub-call made at ``now``: this deadline less ``reserve_s``,
        and no later than ``now + budget_s`` when the call has its own budget."""
        end_s = self.deadline_s - reserve_s
        if budget_s is not None:
            end_s = min(end_s, now + budget_s)
        return Deadline(max(end_s, now))

    def to_header(self, now: float) -> str:
        """The remaining budget at ``now`` as :data:`BUDGET_HEADER`'s value (whole
        milliseconds, rounded down so the receiver never believes it has more)."""
        return str(math.floor(self.remaining_s(now) * 1000.0))

    @classmethod
    def from_header(cls, now: float, value: str) -> Deadline:
        """The deadline on this clock for a :data:`BUDGET_HEADER` value received at
        ``now``."""
        text = value.strip()
        if not text.isdigit():
            raise ValueError(
                f"{BUDGET_HEADER} must be whole milliseconds >= 0 (got {value!r}); "
                "send e.g. '12000' for 12 s"
            )
        return cls(now + int(text) / 1000.0)


class DeadlinePolicy:
    """Turns a request's budget into its deadline, once, and passes it on."""

    def __init__(self, config: DeadlineConfig | None = None) -> None:
        self.config = config if config is not None else DeadlineConfig()

    def assign(self, now: float, requested_budget_s: float | None = None) -> Deadline | None:
        """The deadline of a request admitted at ``now`` that asked for
        ``requested_budget_s`` (None: the default budget; no default: no deadline)."""
        cfg = self.config
        budget_s = requested_budget_s if requested_budget_s is not None else cfg.default_budget_s
        if budget_s is None:
            return None
        if cfg.max_budget_s is not None:
            budget_s = min(budget_s, cfg.max_budget_s)
        return Deadline.after(now, budget_s)

    def propagate(
        self, now: float, deadline: Deadline | None, *, call_budget_s: float | None = None
    ) -> Deadline | None:
        """The deadline of a downstream call made at ``now``: the request's deadline less
        ``hop_reserve_s``, and within ``call_budget_s`` if given."""
        if deadline is None:
            return None if call_budget_s is None else Deadline.after(now, call_budget_s)
        return deadline.for_call(now, reserve_s=self.config.hop_reserve_s, budget_s=call_budget_s)
