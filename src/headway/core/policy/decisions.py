"""What an admission decision is: a value, never an exception.

Every offered request gets exactly one :data:`Decision`:

* :class:`Admit`: dispatch it now.
* :class:`Enqueue`: it may wait, in the named queue, within its deadline.
* :class:`Shed`: refuse it now, truthfully: a :class:`ShedReason` and, when a retry can
  help, ``retry_after_s`` computed from the state that caused the refusal (a queue's
  measured drain rate, a token bucket's refill time, a breaker's probe time), never a
  constant. ``retry_after_s`` is None when no retry can help (the request can never
  fit, or its fixed deadline cannot be met), or, with ``client_backoff``, when a retry
  may help but no time can be named that would be kept (a tenant far over its budget
  whose every promisable turn is taken): the client paces itself.

The drivers map these to their world in one table each (the live gateway: 429 with
``Retry-After``, 503, 400; the simulator: the request's terminal state and reason).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

__all__ = [
    "CLIENT_BACKOFF_MEANING",
    "SHED_REASON_MEANINGS",
    "Admit",
    "Decision",
    "Enqueue",
    "Shed",
    "ShedReason",
]


class ShedReason(enum.Enum):
    """Why a request was refused. :data:`SHED_REASON_MEANINGS` gives each a one-line meaning."""

    QUEUE_FULL = "queue_full"
    DEADLINE_UNMEETABLE = "deadline_unmeetable"
    TENANT_CONCURRENCY = "tenant_concurrency"
    TENANT_TOKEN_RATE = "tenant_token_rate"
    KV_PROJECTION = "kv_projection"
    TOO_LARGE = "too_large"
    DOWNSTREAM_UNHEALTHY = "downstream_unhealthy"
    DRAINING = "draining"
    EXPIRED = "expired"
    DEGRADED_OPTIONAL = "degraded_optional"

    @property
    def meaning(self) -> str:
        """One line that says what happened, for logs, reports and error bodies."""
        return SHED_REASON_MEANINGS[self]


SHED_REASON_MEANINGS: Final[Mapping[ShedReason, str]] = {
    ShedReason.QUEUE_FULL: "its queue (priority band or tenant) holds as many requests as "
    "it may; retry after the measured time for the backlog to drain",
    ShedReason.DEADLINE_UNMEETABLE: "the predicted wait plus service exceeds the time left "
    "before its deadline, so it is refused at arrival instead of timing out later",
    ShedReason.TENANT_CONCURRENCY: "its tenant already has as many requests in flight "
    "(running or queued) as the tenant's limit allows",
    ShedReason.TENANT_TOKEN_RATE: "its tenant's token budget (a token bucket) lacks the "
    "tokens it projects; retry after the bucket's refill time",
    ShedReason.KV_PROJECTION: "its projected KV blocks do not fit the replica's free blocks "
    "now, and the queue cannot hold it until they do",
    ShedReason.TOO_LARGE: "its projected KV blocks exceed what the replica can ever hold "
    "(after the safety reserve); no retry helps, shorten the prompt or max_tokens",
    ShedReason.DOWNSTREAM_UNHEALTHY: "the engines or a dependency behind the gateway are "
    "failing; retry after the next health probe",
    ShedReason.DRAINING: "this instance is draining and takes no new work; retry on "
    "another instance, or after the replacement is ready",
    ShedReason.EXPIRED: "it waited in a queue until its deadline passed and was removed "
    "before dispatch (never sent upstream)",
    ShedReason.DEGRADED_OPTIONAL: "it is marked optional or speculative and a degraded mode "
    "that sheds optional work is on; retry after the mode may have left, or send it as "
    "required",
}


@dataclass(frozen=True, slots=True)
class Admit:
    """Dispatch the request now: a slot is free, nothing is queued ahead, and its
    projected KV blocks fit."""


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Let the request wait in ``queue`` (a priority band) until a slot frees."""

    queue: str
    """The queue (priority band) it waits in."""

    predicted_wait_s: float | None = None
    """The wait the policy predicted from the queue's drain rate, for reports (None: not
    predictable, nothing drained within the window)."""

    front: bool = False
    """A retry that presented a valid retry ticket: it joins the front of its tenant's
    line in the band, past the queue bounds (its place was promised when it was shed)."""


_BACKOFF_REASONS: Final = frozenset({ShedReason.TENANT_TOKEN_RATE})
"""The reasons whose shed may leave the pacing to the client (``client_backoff``): a
tenant's budget, whose turns run out when it is refused faster than its bucket refills."""

CLIENT_BACKOFF_MEANING: Final = (
    "its tenant's token budget is spent and every turn it can promise is taken; back off "
    "and retry later (no time can be named that would be kept)"
)
"""What a ``client_backoff`` shed means, for its error body (instead of its reason's)."""


@dataclass(frozen=True, slots=True)
class Shed:
    """Refuse the request now, with the reason and when a retry may succeed."""

    reason: ShedReason
    """Why."""

    retry_after_s: float | None
    """Seconds after which a retry may find room, computed from state; None when no retry
    can help, or (``client_backoff``) when no time can be named."""

    detail: str = ""
    """The numbers behind the decision, for the error body and logs."""

    ticket: int | None = None
    """A retry ticket (see :class:`~headway.core.policy.admission.AdmissionPolicy`): a
    retry that presents it after ``retry_after_s`` is queued at the front of its line
    instead of being judged again against a full queue. None: no promise."""

    client_backoff: bool = False
    """With ``retry_after_s`` None: a retry may pass later, but no turn can be promised,
    so none is named (HTTP 429 without ``Retry-After``; the client retries on its own
    backoff). False with ``retry_after_s`` None: no retry can help."""

    def __post_init__(self) -> None:
        if self.client_backoff and (
            self.retry_after_s is not None or self.reason not in _BACKOFF_REASONS
        ):
            raise ValueError(
                f"Shed.client_backoff names no time and is a budget's, so retry_after_s "
                f"must be None (got {self.retry_after_s}) and the reason one of "
                f"{sorted(r.value for r in _BACKOFF_REASONS)} (got {self.reason.value})"
            )
        if self.client_backoff and self.ticket is not None:
            raise ValueError(
                "Shed.client_backoff promises no turn, so it carries no ticket "
                f"(got ticket {self.ticket}) for reason {self.reason.value}"
            )
        if self.retry_after_s is not None and not (
            math.isfinite(self.retry_after_s) and self.retry_after_s >= 0
        ):
            raise ValueError(
                f"Shed.retry_after_s must be a finite number >= 0 or None "
                f"(got {self.retry_after_s}) for reason {self.reason.value}"
            )


Decision: TypeAlias = Admit | Enqueue | Shed
"""The outcome of an admission check."""
