"""Rate primitives the policies share: a sliding-window counter and a token bucket.

Both are small mutable entities fed with ``now`` by their owner; neither reads a clock.
Time must not go backwards between calls on one object (a driver bug, so it raises).

* :class:`WindowCounter` sums what was recorded in the trailing ``window_s`` seconds. The
  queues measure their drain rate with it (requests and tokens dispatched per second), and
  the retry policy counts requests and retries for its budget.
* :class:`TokenBucket` holds up to ``capacity_tokens`` and refills at ``rate_per_s``; the
  admission policy keeps one per tenant for its token-rate budget.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["TokenBucket", "WindowCounter"]


def _check_time(now: float, last_s: float | None, what: str) -> None:
    if not math.isfinite(now):
        raise ValueError(f"{what}: now must be a finite time (got {now})")
    if last_s is not None and now < last_s:
        raise ValueError(
            f"{what}: time went backwards (now={now}, last seen {last_s}); "
            "pass a monotonic clock's reading"
        )


class WindowCounter:
    """Amounts recorded at times ``now``, summed over the trailing ``window_s`` seconds.

    The window at ``now`` is the half-open interval ``(now - window_s, now]``::

        recorded:   x     x  x        x    x
        time:  ---|-----------------------|--->
               now - window_s            now
                  (excluded)         (included)

    An amount recorded at ``t`` counts until ``now`` reaches ``t + window_s``. The count is
    exact (one entry per distinct time, same-time records merge), and each call is O(1)
    amortised.
    """

    __slots__ = ("_events", "_last_s", "_start_s", "_total", "window_s")

    def __init__(self, window_s: float, *, start_s: float | None = None) -> None:
        """Args:
        window_s: length of the trailing window, seconds (> 0).
        start_s: when observation began (None: at the first call). Until a whole window
            has passed, :meth:`rate_per_s` divides by the time observed so far.
        """
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be a finite number > 0 (got {window_s})")
        self.window_s = window_s
        self._events: deque[list[float]] = deque()
        self._total = 0.0
        self._start_s = start_s
        self._last_s = start_s

    def _advance(self, now: float) -> None:
        _check_time(now, self._last_s, "WindowCounter")
        if self._start_s is None:
            self._start_s = now
        self._last_s = now
        horizon = now - self.window_s
        events = self._events
        while events and events[0][0] <= horizon:
            self._total -= events.popleft()[1]
        if not events:
            self._total = 0.0  # no float residue once the window is empty

    def add(self, now: float, amount: float = 1.0) -> None:
        """Record ``amount`` (>= 0) at ``now``."""
        if not (math.isfinite(amount) and amount >= 0):
            raise ValueError(f"WindowCounter.add: amount must be finite and >= 0 (got {amount})")
        self._advance(now)
        if self._events and self._events[-1][0] == now:
            self._events[-1][1] += amount
        else:
            self._events.append([now, amount])
        self._total += amount

    def total(self, now: float) -> float:
        """The sum recorded in ``(now - window_s, now]``."""
        self._advance(now)
        return max(self._total, 0.0)

    def rate_per_s(self, now: float) -> float:
        """:meth:`total` per second of the window, or of the time observed so far when that
        is shorter (0.0 before any time has passed)."""
        total = self.total(now)
        assert self._start_s is not None  # set by _advance
        span_s = min(self.window_s, now - self._start_s)
        return total / span_s if span_s > 0 else 0.0


class TokenBucket:
    """A token bucket: holds up to ``capacity_tokens``, refills at ``rate_per_s``.

    The level is computed from ``now`` on each call (no timer): ``level = min(capacity,
    level + rate_per_s * (now - last))``. A take of ``n`` tokens succeeds only when the
    level is at least ``n``; a request larger than the capacity can never pass, and
    :meth:`wait_s` says so with None.
    """

    __slots__ = ("_last_s", "_level", "capacity_tokens", "rate_per_s")

    def __init__(
        self,
        *,
        rate_per_s: float,
        capacity_tokens: float,
        now: float,
        level_tokens: float | None = None,
    ) -> None:
        """Args:
        rate_per_s: refill rate, tokens per second (> 0).
        capacity_tokens: most tokens held (the burst), > 0.
        now: the time of creation.
        level_tokens: tokens held at ``now`` (None: full).
        """
        if not (math.isfinite(rate_per_s) and rate_per_s > 0):
            raise ValueError(f"rate_per_s must be a finite number > 0 (got {rate_per_s})")
        if not (math.isfinite(capacity_tokens) and capacity_tokens > 0):
            raise ValueError(f"capacity_tokens must be a finite number > 0 (got {capacity_tokens})")
        _check_time(now, None, "TokenBucket")
        self.rate_per_s = rate_per_s
        self.capacity_tokens = capacity_tokens
        level = capacity_tokens if level_tokens is None else level_tokens
        self._level = min(max(level, 0.0), capacity_tokens)
        self._last_s = now

    def level(self, now: float) -> float:
        """Tokens available at ``now`` (refills first)."""
        _check_time(now, self._last_s, "TokenBucket")
        elapsed_s = now - self._last_s
        self._level = min(self.capacity_tokens, self._level + self.rate_per_s * elapsed_s)
        self._last_s = now
        return self._level

    def wait_s(self, now: float, tokens: float) -> float | None:
        """Seconds from ``now`` until ``tokens`` are available (0.0: now), or None when
        ``tokens`` exceed the capacity and no wait is long enough."""
        if tokens > self.capacity_tokens:
            return None
        short = tokens - self.level(now)
        return short / self.rate_per_s if short > 0 else 0.0

    def try_take(self, now: float, tokens: float) -> bool:
        """Take ``tokens`` if available at ``now``; False (and no change) otherwise."""
        if self.level(now) < tokens:
            return False
        self._level -= tokens
        return True

    def take_on_credit(self, now: float, tokens: float) -> None:
        """Take ``tokens`` at ``now`` even if the level goes below zero (a promised retry);
        the debt is repaid by the refill before anything else passes."""
        self._level = self.level(now) - max(tokens, 0.0)

    def give_back(self, now: float, tokens: float) -> None:
        """Return ``tokens`` taken but not used (the level never exceeds the capacity)."""
        self._level = min(self.capacity_tokens, self.level(now) + max(tokens, 0.0))


class CompletionRates:
    """Completed requests per second of each tenant, over the trailing ``window_s``: what
    a tenant-concurrency refusal's Retry-After is computed from (``TenantLoad.
    completions_per_s``). The live gateway's core and the simulator's gateway keep one."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._counters: dict[str, WindowCounter] = {}

    def add(self, now: float, tenant: str) -> None:
        """A request of ``tenant`` completed at ``now``."""
        counter = self._counters.get(tenant)
        if counter is None:
            counter = self._counters[tenant] = WindowCounter(self.window_s, start_s=now)
        counter.add(now)

    def rate_per_s(self, now: float, tenant: str) -> float:
        """``tenant``'s completions per second at ``now`` (0.0 before any)."""
        counter = self._counters.get(tenant)
        return 0.0 if counter is None else counter.rate_per_s(now)
