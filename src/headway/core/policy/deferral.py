"""Deferral: a refused request of a deferrable class is accepted for later instead.

Seed 002 (item 7): "return a truthful retry-after or asynchronous receipt"; seed 000:
"intentionally asynchronous work can be accepted with a different completion
expectation". A priority band is declared deferrable (``deferrable``); a request of that
band that admission sheds for a reason a wait can fix (the queue's or the tenant's
limits, capacity, the engines' health: any :class:`~headway.core.policy.decisions.Shed`
whose ``retry_after_s`` is not None) is deferred: the driver stores it and runs it later
inside the ``background`` share, and the client fetches the result. It is not deferred
when no wait helps (``too_large``, a deadline shorter than the service alone), when the
instance is draining, when it wants a stream (its answer is fetched whole), when the
deferred backlog already holds ``max_queued`` requests (then the shed stands, truthfully),
or when its tenant's budget has no turn left to promise (``client_backoff``: the tenant
is refused faster than its bucket refills, and deferring its excess would fill the
backlog that every tenant shares with work its budget cannot pay for in any time that
can be named).

:func:`should_defer` is the one decision; the live gateway calls it on every shed, and a
simulator driver can call it the same way.
"""

from __future__ import annotations

import math

import msgspec

from headway.core.policy._checks import require
from headway.core.policy.decisions import Shed, ShedReason
from headway.core.policy.queues import BANDS, Band

__all__ = ["DeferralConfig", "should_defer"]

_NEVER_DEFERRED = frozenset({ShedReason.DRAINING, ShedReason.TOO_LARGE, ShedReason.EXPIRED})
"""Reasons a deferral cannot fix: this instance takes no work, the request never fits, or
it already waited out its deadline in the line."""


class DeferralConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which requests may be deferred, and how many and for how long."""

    deferrable: list[Band] = msgspec.field(default_factory=list)
    """Priority bands whose sheds become deferrals (e.g. ``[background]``). Empty: none."""

    max_queued: int = 10_000
    """Deferred requests not yet finished (queued or running) at most; past it a shed
    stands."""

    retention_s: float = 86_400.0
    """A deferred request and its result are kept this long after it was accepted; then
    it expires (never run if it had not run; its prompt and result are deleted)."""

    def __post_init__(self) -> None:
        for band in self.deferrable:
            require(band in BANDS, "receipts", "deferrable", band, f"use bands of {BANDS}")
        require(self.max_queued >= 1, "receipts", "max_queued", self.max_queued, "use 1 or more")
        require(
            math.isfinite(self.retention_s) and self.retention_s > 0,
            "receipts",
            "retention_s",
            self.retention_s,
            "use seconds > 0, e.g. 86400 (a day)",
        )


def should_defer(
    shed: Shed, band: Band, *, stream: bool, queued: int, config: DeferralConfig
) -> bool:
    """True when ``shed``, of a request of ``band``, becomes a deferral (module
    docstring); ``queued``: the deferred requests not yet finished."""
    return (
        band in config.deferrable
        and not stream
        and shed.retry_after_s is not None
        and not shed.client_backoff
        and shed.reason not in _NEVER_DEFERRED
        and queued < config.max_queued
    )
