"""Bounded retries: when a failed attempt may be tried again, and after how long.

:meth:`RetryPolicy.next_attempt` takes ``now``, how many attempts were made, what the last
one did (:class:`AttemptOutcome`), the server's ``Retry-After`` if any, and an injected
``numpy.random.Generator`` for jitter; it returns :class:`RetryAfter` or :class:`GiveUp`.
Its only memory is the retry budget: two sliding-window counters (original requests, and
retries granted), fed with ``now``. Drivers call :meth:`RetryPolicy.record_request` once
per original request (not per retry), so that retries never earn budget themselves.

Rules, in order (the first that gives up decides; seed 000: "retries must fit the same
resource budget ... finite attempt counts and deadlines prevent indefinite accumulation";
seed 003: "bounded retry policy" contains "duplicate work and retry storms"):

1. ``STREAM_STARTED``: a token was already relayed to the client. The client has part of
   an answer; a second attempt would duplicate or contradict it.
2. ``NOT_IDEMPOTENT``: the operation may have had an effect (a refund); its outcome goes
   to reconciliation, not to a retry "merely because the service is busy" (seed 000).
3. ``NOT_RETRYABLE``: the request itself is invalid (a 4xx), or the server refused it and
   said no retry can help (a shed with no ``retry_after_s``). A refusal that names no
   time but invites a retry (``THROTTLED``: a 429 without ``Retry-After``) goes on to the
   backoff.
4. ``ATTEMPTS_EXHAUSTED``: ``attempt >= max_attempts``.
5. The delay: ``backoff = min(backoff_max_s, backoff_base_s * 2**(attempt - 1))``, then
   jitter (``full``: uniform(0, backoff); ``equal``: backoff/2 + uniform(0, backoff/2);
   ``none``: backoff), then at least the server's ``Retry-After`` when honoured.
   ``DEADLINE``: the retry would start at or after the request's deadline.
6. ``BUDGET_EXHAUSTED``: retries granted in the window would exceed
   ``max(budget_min_retries, budget_ratio * requests in the window)``.

Only a granted retry is counted, so a refusal spends no budget.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Literal, TypeAlias

import msgspec
import numpy as np

from headway.core.policy._checks import require
from headway.core.policy.decisions import Shed
from headway.core.policy.rates import WindowCounter

__all__ = [
    "AttemptOutcome",
    "FailureKind",
    "GiveUp",
    "GiveUpReason",
    "RetryAfter",
    "RetryConfig",
    "RetryDecision",
    "RetryPolicy",
    "refusal_kind",
]


class RetryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How failed attempts are retried (the same knobs as a workload's
    ``clients.retries``, plus the budget)."""

    max_attempts: int = 3
    """Attempts in all, including the first (1 = never retry)."""

    backoff_base_s: float = 0.5
    """Backoff before the first retry; it doubles on each further attempt."""

    backoff_max_s: float = 30.0
    """Upper bound of one backoff (before ``Retry-After`` is applied)."""

    jitter: Literal["full", "equal", "none"] = "full"
    """``full``: wait uniform(0, backoff), which spreads a herd of clients the most;
    ``equal``: backoff/2 + uniform(0, backoff/2); ``none``: exactly the backoff."""

    honour_retry_after: bool = True
    """Wait at least the server's ``retry_after_s`` when it sends one: the gateway
    computes it from its drain rate, so it is the best estimate of when room exists."""

    budget: bool = True
    """Apply the retry budget below; ``False`` models clients without one (what most
    deployments run today): every retry the attempts allow is sent."""

    budget_ratio: float = 0.1
    """Retries allowed as a fraction of the original requests in the window: under a
    storm, load grows by at most this factor (the per-client budget of Google's SRE book,
    "Handling Overload"; Finagle and Envoy default to 0.2)."""

    budget_min_retries: int = 3
    """Retries always allowed per window, so that a quiet service can still retry."""

    budget_window_s: float = 10.0
    """The sliding window over which requests and retries are counted."""

    def __post_init__(self) -> None:
        require(
            1 <= self.max_attempts <= 100,
            "retries",
            "max_attempts",
            self.max_attempts,
            "use 1 (never retry) to 100",
        )
        require(
            math.isfinite(self.backoff_base_s) and self.backoff_base_s >= 0,
            "retries",
            "backoff_base_s",
            self.backoff_base_s,
            "use seconds >= 0, e.g. 0.5",
        )
        require(
            math.isfinite(self.backoff_max_s) and self.backoff_max_s >= self.backoff_base_s,
            "retries",
            "backoff_max_s",
            self.backoff_max_s,
            f"use seconds >= backoff_base_s ({self.backoff_base_s})",
        )
        require(
            self.jitter in ("full", "equal", "none"),
            "retries",
            "jitter",
            self.jitter,
            "use 'full', 'equal' or 'none'",
        )
        require(
            0.0 <= self.budget_ratio <= 1.0,
            "retries",
            "budget_ratio",
            self.budget_ratio,
            "use a fraction in [0, 1], e.g. 0.2 for one retry per five requests",
        )
        require(
            self.budget_min_retries >= 0,
            "retries",
            "budget_min_retries",
            self.budget_min_retries,
            "use 0 or more",
        )
        require(
            math.isfinite(self.budget_window_s) and self.budget_window_s > 0,
            "retries",
            "budget_window_s",
            self.budget_window_s,
            "use seconds > 0, e.g. 10",
        )


class FailureKind(enum.Enum):
    """What went wrong with an attempt."""

    REFUSED = "refused"
    """Shed by admission (429/503 with a reason): the work was never started. Without a
    ``Retry-After``, the server said no retry can help."""

    THROTTLED = "throttled"
    """Shed with 429 and no ``Retry-After``: a retry may pass, but the server could name
    no time it would keep (a tenant far over its budget), so the client's own backoff
    paces it."""

    CONNECT_ERROR = "connect_error"
    """The request never reached the server."""

    UPSTREAM_ERROR = "upstream_error"
    """The server failed after receiving it (5xx, reset)."""

    TIMEOUT = "timeout"
    """The attempt's own timeout fired."""

    INVALID = "invalid"
    """The request itself is wrong (4xx other than 429); never retried."""


def refusal_kind(shed: Shed) -> FailureKind:
    """What a shed is to the client's retry policy: ``THROTTLED`` when it names no time
    but invites a retry (``client_backoff``), else ``REFUSED``."""
    return FailureKind.THROTTLED if shed.client_backoff else FailureKind.REFUSED


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptOutcome:
    """What the failed attempt did, and what the operation allows."""

    kind: FailureKind
    """How it failed."""

    first_token_received: bool = False
    """A generated token reached the client before the failure."""

    idempotent: bool = True
    """The operation may be repeated safely (a completion is; a refund is not)."""

    deadline_s: float | None = None
    """The request's absolute deadline; a retry that cannot start before it is not made."""


class GiveUpReason(enum.Enum):
    """Why no retry is made."""

    STREAM_STARTED = "stream_started"
    """A token was already relayed; a retry would duplicate the stream."""

    NOT_IDEMPOTENT = "not_idempotent"
    """The operation may have had an effect; reconcile instead."""

    NOT_RETRYABLE = "not_retryable"
    """The request is invalid, or the server said no retry can help."""

    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    """``max_attempts`` were made."""

    DEADLINE = "deadline"
    """The retry could not start before the request's deadline."""

    BUDGET_EXHAUSTED = "budget_exhausted"
    """The retry budget of the window is spent."""


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Retry after ``delay_s`` seconds."""

    delay_s: float
    """Seconds to wait before the next attempt."""


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Do not retry."""

    reason: GiveUpReason
    """Why."""

    detail: str = ""
    """The numbers behind it."""


RetryDecision: TypeAlias = RetryAfter | GiveUp
"""The outcome of :meth:`RetryPolicy.next_attempt`."""


class RetryPolicy:
    """The retry policy and its budget (see the module docstring for the rules)."""

    def __init__(self, config: RetryConfig | None = None) -> None:
        self.config = config if config is not None else RetryConfig()
        self._requests = WindowCounter(self.config.budget_window_s)
        self._retries = WindowCounter(self.config.budget_window_s)

    def reconfigure(self, config: RetryConfig) -> None:
        """Take ``config`` from now on (a live reload); the budget's counts are kept
        unless the window's length changed."""
        if config.budget_window_s != self.config.budget_window_s:
            self._requests = WindowCounter(config.budget_window_s)
            self._retries = WindowCounter(config.budget_window_s)
        self.config = config

    def record_request(self, now: float) -> None:
        """Count one original request (its first attempt) at ``now``."""
        self._requests.add(now)
        self._retries.total(now)  # keep both windows on the same clock

    def budget(self, now: float) -> tuple[float, float, float]:
        """``(requests, retries, allowed)`` in the window ending at ``now``."""
        requests = self._requests.total(now)
        retries = self._retries.total(now)
        allowed = max(float(self.config.budget_min_retries), self.config.budget_ratio * requests)
        return requests, retries, allowed

    def backoff_s(self, attempt: int) -> float:
        """The backoff after ``attempt`` attempts, before jitter."""
        cfg = self.config
        exponent = min(attempt - 1, 1023)  # 2**1023 is the largest finite double power
        return min(cfg.backoff_max_s, cfg.backoff_base_s * 2.0**exponent)

    def delay_s(self, attempt: int, rng: np.random.Generator) -> float:
        """The backoff after ``attempt`` attempts, jittered (without a ``Retry-After``):
        what a client waits after a refusal that names no time."""
        return self._jittered(self.backoff_s(attempt), rng)

    def _jittered(self, backoff_s: float, rng: np.random.Generator) -> float:
        jitter = self.config.jitter
        if jitter == "full":
            return float(rng.uniform(0.0, backoff_s))
        if jitter == "equal":
            return backoff_s / 2 + float(rng.uniform(0.0, backoff_s / 2))
        return backoff_s

    def next_attempt(
        self,
        now: float,
        attempt: int,
        outcome: AttemptOutcome,
        retry_after_s: float | None,
        rng: np.random.Generator,
    ) -> RetryDecision:
        """Whether to retry after ``attempt`` failed attempts (1 after the first), and when.

        ``retry_after_s`` is the server's ``Retry-After`` (None: not sent). A granted
        retry is counted against the budget at ``now``.
        """
        cfg = self.config
        if attempt < 1:
            raise ValueError(f"attempt counts attempts made, so it is >= 1 (got {attempt})")
        if outcome.first_token_received:
            return GiveUp(GiveUpReason.STREAM_STARTED, "a token was already relayed")
        if not outcome.idempotent:
            return GiveUp(GiveUpReason.NOT_IDEMPOTENT, "the operation is not idempotent")
        if outcome.kind is FailureKind.INVALID:
            return GiveUp(GiveUpReason.NOT_RETRYABLE, "the request is invalid")
        if outcome.kind is FailureKind.REFUSED and retry_after_s is None:
            return GiveUp(GiveUpReason.NOT_RETRYABLE, "the server said no retry can help")
        if attempt >= cfg.max_attempts:
            return GiveUp(
                GiveUpReason.ATTEMPTS_EXHAUSTED, f"{attempt} of {cfg.max_attempts} attempts made"
            )

        delay_s = self._jittered(self.backoff_s(attempt), rng)
        if cfg.honour_retry_after and retry_after_s is not None:
            delay_s = max(delay_s, retry_after_s)
        if outcome.deadline_s is not None and now + delay_s >= outcome.deadline_s:
            return GiveUp(
                GiveUpReason.DEADLINE,
                f"a retry at {now + delay_s:.3f} s would start after the deadline "
                f"{outcome.deadline_s:.3f} s",
            )

        requests, retries, allowed = self.budget(now)
        if cfg.budget and retries + 1 > allowed:
            return GiveUp(
                GiveUpReason.BUDGET_EXHAUSTED,
                f"{retries:.0f} retries for {requests:.0f} requests in the last "
                f"{cfg.budget_window_s:g} s; the budget allows {allowed:.1f}",
            )
        self._retries.add(now)
        return RetryAfter(delay_s)
