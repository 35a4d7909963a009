"""A capacity-limited downstream service: a queue of its own behind the model.

Seed 000: "Database connection pools need their own bounds. Scaling workers from ten to a
hundred may create ten times as many connections without increasing database capacity.
When the bottleneck is an external order API, additional workers may simply increase
waiting and retries." This module models such a dependency exactly, so that the
simulator can show it:

* ``servers`` connections (a database pool), each serving one call at a time;
* an optional rate limit (an external API): a token bucket of ``rate_limit_per_s`` with
  ``burst`` tokens, one token per call, taken when the call starts;
* an optional bound on waiting calls (``queue_limit``): one more is refused at once;
* an optional client-side ``timeout_s``.

Calls are served first come, first served, with service times known when they are
submitted (the simulator draws them), so the whole schedule is computed at submission:
a call starts at the earliest time that is (a) no earlier than the previous call's start
(FIFO), (b) when a connection is free (the earliest-free one: exact for FIFO with known
service times), and (c) when the bucket holds a token; it finishes ``service_s`` later::

    start  = max(now, previous start, earliest free connection, next token)
    finish = start + service_s
    wait   = start - now

Timeouts: when ``wait + service_s > timeout_s`` the caller sees a timeout at
``now + timeout_s``. **If the call had started by then, its work still holds the
connection until ``finish``**: a query keeps running after its client gave up, which is
what makes retries pile onto a saturated dependency (each retry adds work while the
abandoned work still occupies the pool). A call still waiting when its timeout fires is
removed from the queue and never runs (``cancel_waiting_on_timeout``, as a pool's acquire
timeout does); with ``cancel_waiting_on_timeout=False`` it stays queued and runs anyway
(a server-side queue that does not know its client left).

Pure: :meth:`DownstreamService.submit` takes ``now`` (non-decreasing) and a service
time and returns a :class:`DownstreamResult`; nothing reads a clock.
"""

from __future__ import annotations

import enum
import heapq
import math
from dataclasses import dataclass

import msgspec

from headway.core.policy._checks import is_finite_above, require
from headway.core.workload.spec import Service

__all__ = [
    "DownstreamConfig",
    "DownstreamOutcome",
    "DownstreamResult",
    "DownstreamService",
    "DownstreamStatistics",
]


class DownstreamConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The capacity of one downstream service (a workload's ``services.<name>``)."""

    servers: int = 1
    """Calls served at once: connections in the pool, or the API's concurrency."""

    rate_limit_per_s: float | None = None
    """Calls the service accepts per second (a token bucket); None: no rate limit."""

    burst: float = 1.0
    """Tokens the rate-limit bucket holds: this many calls may start at once after an
    idle spell. Only used with ``rate_limit_per_s``."""

    queue_limit: int | None = None
    """Calls that may wait for a connection or a token at once; one more is refused at
    once. None: unbounded (a pool with no acquire limit)."""

    timeout_s: float | None = None
    """The caller's timeout on wait plus service; None: the caller waits for ever."""

    cancel_waiting_on_timeout: bool = True
    """A call still waiting when its timeout fires leaves the queue and never runs (a
    pool's acquire timeout). False: it runs anyway, for nobody."""

    def __post_init__(self) -> None:
        section = "downstream"
        require(self.servers >= 1, section, "servers", self.servers, "use 1 or more connections")
        require(
            is_finite_above(self.rate_limit_per_s, 0.0),
            section,
            "rate_limit_per_s",
            self.rate_limit_per_s,
            "use calls per second > 0, or null for no rate limit",
        )
        require(
            math.isfinite(self.burst) and self.burst >= 1.0,
            section,
            "burst",
            self.burst,
            "use 1 or more tokens (1: calls are spaced evenly at the rate)",
        )
        require(
            self.queue_limit is None or self.queue_limit >= 0,
            section,
            "queue_limit",
            self.queue_limit,
            "use 0 (never wait) or more, or null for no limit",
        )
        require(
            is_finite_above(self.timeout_s, 0.0),
            section,
            "timeout_s",
            self.timeout_s,
            "use seconds > 0, or null for no timeout",
        )

    @classmethod
    def from_service(cls, service: Service) -> DownstreamConfig:
        """The capacity of a workload's ``services.<name>`` (its ``service_time_s`` is
        drawn per call by the compiler, not part of this config)."""
        return cls(
            servers=service.servers,
            rate_limit_per_s=service.rate_limit_per_s,
            burst=service.burst,
            queue_limit=service.queue_limit,
            timeout_s=service.timeout_s,
        )


class DownstreamOutcome(enum.Enum):
    """What the caller sees."""

    COMPLETED = "completed"
    """The answer, at ``finish_s``."""

    TIMED_OUT = "timed_out"
    """The caller's timeout fired at ``submitted_s + timeout_s``."""

    REFUSED = "refused"
    """The queue was full; refused at once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DownstreamResult:
    """The fate of one call."""

    outcome: DownstreamOutcome
    """What the caller sees."""

    submitted_s: float
    """When the call was made."""

    response_s: float
    """When the caller sees ``outcome``: ``finish_s``, the timeout, or at once."""

    start_s: float | None
    """When its work took a connection; None when it never ran (refused, or cancelled
    while waiting)."""

    finish_s: float | None
    """When its work released the connection (may be after ``response_s``: work goes on
    after a timeout); None when it never ran."""

    wait_s: float
    """Time the caller waited before its work started, or until it gave up (0 refused)."""

    @property
    def timed_out(self) -> bool:
        """The caller's timeout fired."""
        return self.outcome is DownstreamOutcome.TIMED_OUT

    @property
    def refused(self) -> bool:
        """The queue was full."""
        return self.outcome is DownstreamOutcome.REFUSED

    @property
    def ran(self) -> bool:
        """Its work occupied a connection (completed, or timed out after starting)."""
        return self.start_s is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class DownstreamStatistics:
    """Counts and times of a service up to ``now``."""

    now_s: float
    """The time they were taken."""

    submitted: int
    """Calls made."""

    completed: int
    """Calls answered in time (decided when they were made: the schedule is exact, so a
    call counts here even if its answer comes after ``now``)."""

    timed_out: int
    """Calls whose caller's timeout fires (``abandoned`` of them never ran); counted
    when they were made, like ``completed``."""

    abandoned: int
    """Timed-out calls cancelled while still waiting."""

    refused: int
    """Calls refused with the queue full."""

    busy_s: float
    """Connection-seconds of work done up to ``now`` (wasted work after timeouts included)."""

    wasted_busy_s: float
    """Connection-seconds of work whose caller had already timed out, up to ``now``."""

    utilisation: float
    """``busy_s / (servers * now_s)``: the fraction of connection time in use."""

    mean_wait_s: float
    """Mean wait of the calls that started (0 when none did)."""

    max_wait_s: float
    """Longest wait of a call that started."""

    waiting: int
    """Calls waiting for a connection or a token at ``now``."""

    in_service: int
    """Calls holding a connection at ``now``."""


class DownstreamService:
    """One downstream service's exact FIFO schedule (see the module docstring)."""

    def __init__(self, config: DownstreamConfig | None = None) -> None:
        self.config = config if config is not None else DownstreamConfig()
        self._free_at = [0.0] * self.config.servers  # a heap: when each connection frees
        self._clock_s = -math.inf
        self._last_start_s = -math.inf
        self._tokens = self.config.burst
        self._tokens_at_s = -math.inf  # the bucket starts full
        self._waiting: list[float] = []  # heap: when each waiting call leaves the queue
        self._running: list[tuple[float, float, float]] = []  # heap (finish, start, timeout)
        self._submitted = 0
        self._completed = 0
        self._timed_out = 0
        self._abandoned = 0
        self._refused = 0
        self._done_busy_s = 0.0
        self._done_wasted_s = 0.0
        self._started = 0
        self._total_wait_s = 0.0
        self._max_wait_s = 0.0

    # ------------------------------------------------------------------ the schedule

    def _tokens_at(self, t: float) -> float:
        rate = self.config.rate_limit_per_s
        if rate is None or self._tokens_at_s == -math.inf:
            return self.config.burst
        return min(self.config.burst, self._tokens + rate * (t - self._tokens_at_s))

    def _start_time(self, now: float) -> float:
        """When a call submitted at ``now`` would start (it does not commit anything)."""
        start = max(now, self._last_start_s, self._free_at[0])
        rate = self.config.rate_limit_per_s
        if rate is not None:
            tokens = self._tokens_at(start)
            if tokens < 1.0:
                start += (1.0 - tokens) / rate
        return start

    def _advance(self, now: float) -> None:
        """Drop the calls that started or finished by ``now`` from the live sets."""
        if now < self._clock_s:
            raise ValueError(
                f"downstream calls must come in time order: now {now} is before the "
                f"previous call at {self._clock_s}"
            )
        self._clock_s = now
        while self._waiting and self._waiting[0] <= now:
            heapq.heappop(self._waiting)
        while self._running and self._running[0][0] <= now:
            finish, start, timeout_at = heapq.heappop(self._running)
            self._done_busy_s += finish - start
            self._done_wasted_s += max(0.0, finish - max(start, timeout_at))

    def predicted_wait_s(self, now: float) -> float:
        """The wait a call made at ``now`` would see before it starts (exact, given the
        calls already made): the downstream-health input of admission."""
        self._advance(now)
        return self._start_time(now) - now

    def submit(self, now: float, service_s: float) -> DownstreamResult:
        """Make a call at ``now`` that needs ``service_s`` of a connection."""
        if not (math.isfinite(service_s) and service_s >= 0):
            raise ValueError(f"service_s must be a finite number >= 0 (got {service_s})")
        self._advance(now)
        cfg = self.config
        self._submitted += 1
        start = self._start_time(now)
        wait_s = start - now
        if wait_s > 0 and cfg.queue_limit is not None and len(self._waiting) >= cfg.queue_limit:
            self._refused += 1
            return DownstreamResult(
                outcome=DownstreamOutcome.REFUSED,
                submitted_s=now,
                response_s=now,
                start_s=None,
                finish_s=None,
                wait_s=0.0,
            )
        timeout_at = math.inf if cfg.timeout_s is None else now + cfg.timeout_s
        if start >= timeout_at and cfg.cancel_waiting_on_timeout:
            self._timed_out += 1
            self._abandoned += 1
            heapq.heappush(self._waiting, timeout_at)  # it holds a queue place until then
            return DownstreamResult(
                outcome=DownstreamOutcome.TIMED_OUT,
                submitted_s=now,
                response_s=timeout_at,
                start_s=None,
                finish_s=None,
                wait_s=timeout_at - now,
            )
        finish = start + service_s
        self._commit(start, finish, timeout_at, wait_s)
        if finish > timeout_at:
            self._timed_out += 1
            return DownstreamResult(
                outcome=DownstreamOutcome.TIMED_OUT,
                submitted_s=now,
                response_s=timeout_at,
                start_s=start,
                finish_s=finish,
                wait_s=min(wait_s, timeout_at - now),
            )
        self._completed += 1
        return DownstreamResult(
            outcome=DownstreamOutcome.COMPLETED,
            submitted_s=now,
            response_s=finish,
            start_s=start,
            finish_s=finish,
            wait_s=wait_s,
        )

    def _commit(self, start: float, finish: float, timeout_at: float, wait_s: float) -> None:
        heapq.heapreplace(self._free_at, finish)
        self._last_start_s = start
        if self.config.rate_limit_per_s is not None:
            self._tokens = self._tokens_at(start) - 1.0
            self._tokens_at_s = start
        if wait_s > 0:
            heapq.heappush(self._waiting, start)
        heapq.heappush(self._running, (finish, start, timeout_at))
        self._started += 1
        self._total_wait_s += wait_s
        self._max_wait_s = max(self._max_wait_s, wait_s)

    # ------------------------------------------------------------------ statistics

    def in_system(self, now: float) -> int:
        """Calls waiting or holding a connection at ``now`` (for Little's law)."""
        self._advance(now)
        return len(self._waiting) + sum(1 for _, start, _ in self._running if start <= now)

    def statistics(self, now: float) -> DownstreamStatistics:
        """Counts, utilisation and waits up to ``now`` (no earlier than the last call)."""
        self._advance(now)
        busy = self._done_busy_s
        wasted = self._done_wasted_s
        in_service = 0
        for finish, start, timeout_at in self._running:
            if start <= now:
                in_service += 1
                busy += min(finish, now) - start
                wasted += max(0.0, min(finish, now) - max(start, timeout_at))
        capacity_s = self.config.servers * now
        return DownstreamStatistics(
            now_s=now,
            submitted=self._submitted,
            completed=self._completed,
            timed_out=self._timed_out,
            abandoned=self._abandoned,
            refused=self._refused,
            busy_s=busy,
            wasted_busy_s=wasted,
            utilisation=busy / capacity_s if capacity_s > 0 else 0.0,
            mean_wait_s=self._total_wait_s / self._started if self._started else 0.0,
            max_wait_s=self._max_wait_s,
            waiting=len(self._waiting),
            in_service=in_service,
        )
