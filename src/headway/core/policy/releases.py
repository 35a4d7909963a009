"""Route back to the last good release (seed 003: "if error_rate_spikes: route to the
previous release fingerprint").

A *release* is what an upstream serves under its ``revision``: the readiness probe holds
every upstream of a revision to one fingerprint (model revision, tokenizer and template,
engine version, scheduler settings; real token ids where the engine returns them), so a
revision stands for the whole serving contract. :class:`ReleaseGuard` watches each
release over a sliding window of its attempts (errors: an engine's 5xx or a broken
connection, never a client's mistake or an overload refusal; latency: seconds to the
first byte) and decides which release unpinned traffic avoids:

* a release **spikes** when, with at least ``min_attempts`` in the window on it and on
  the release compared with, its error rate exceeds the other's by more than
  ``max_error_rate_increase`` *and* by at least ``min_z`` standard errors (a
  two-proportion z-test on the pooled rate, so that one unlucky error among ten attempts
  is not a spike), or its mean first-byte latency is more than
  ``max_latency_ratio`` times the other's. It is compared with the *best* release (the
  lowest error rate with enough attempts, then the lowest latency), which is never
  routed back itself: with two releases, the good one is the reference and the bad one
  is routed back to it, as the seed says, without the gateway having to know which is
  newer (a release that turns slow because the bad one's traffic moved onto it is not
  compared with the failing one's stale latency);
* a spiking release is **routed back** at once: unpinned calls go to the other
  releases' upstreams (a call pinned to a revision still reaches it; when no upstream of
  another release is ready, calls go where they can rather than nowhere);
* **hysteresis**: it stays routed back for ``hold_s``, then gets traffic again
  (probation, with its window emptied); a spike within ``hold_s`` of its return routes it
  back for twice as long, up to ``max_hold_s``. Each change is a :class:`ReleaseChange`
  the driver logs and counts.

It never reads a clock: the driver passes ``now`` with each attempt and each query.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import msgspec

from headway.core.policy._checks import require

__all__ = ["ReleaseChange", "ReleaseGuard", "ReleaseGuardConfig"]


class ReleaseGuardConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """When a release is routed back (see the module docstring)."""

    enabled: bool = True
    """Off: every ready upstream takes unpinned calls, whatever its release does."""

    window_s: float = 10.0
    """Attempts older than this are forgotten."""

    min_attempts: int = 20
    """Attempts a release needs in the window (and the one it is compared with) before
    it can be judged: fewer say nothing."""

    max_error_rate_increase: float = 0.05
    """A release whose error rate exceeds the best other one's by more than this spikes
    (0.05: five more errors per hundred attempts)."""

    min_z: float = 3.0
    """How many standard errors the error-rate difference must reach (3: about one false
    alarm in a thousand judgements of two equal releases)."""

    max_latency_ratio: float | None = 3.0
    """A release whose mean first-byte latency is more than this many times the best
    other one's spikes (None: latency is not judged)."""

    hold_s: float = 30.0
    """How long a routed-back release stays out before its probation."""

    max_hold_s: float = 600.0
    """The longest hold, however often it relapses."""

    def __post_init__(self) -> None:
        for name in ("window_s", "hold_s", "max_hold_s"):
            value = getattr(self, name)
            require(
                math.isfinite(value) and value > 0, "release_guard", name, value, "use seconds > 0"
            )
        require(
            self.min_attempts >= 1,
            "release_guard",
            "min_attempts",
            self.min_attempts,
            "use 1 or more",
        )
        require(
            math.isfinite(self.min_z) and self.min_z >= 0,
            "release_guard",
            "min_z",
            self.min_z,
            "use a number of standard errors >= 0, such as 3",
        )
        require(
            0.0 <= self.max_error_rate_increase < 1.0,
            "release_guard",
            "max_error_rate_increase",
            self.max_error_rate_increase,
            "use a fraction in [0, 1), such as 0.05",
        )
        ratio = self.max_latency_ratio
        require(
            ratio is None or (math.isfinite(ratio) and ratio > 1.0),
            "release_guard",
            "max_latency_ratio",
            ratio,
            "use a ratio > 1 (such as 3), or null to leave latency out",
        )


@dataclass(frozen=True, slots=True)
class ReleaseChange:
    """A release routed back, or returned to traffic."""

    at_s: float
    revision: str
    routed_back: bool
    """True: unpinned calls avoid it from now; False: its probation began."""
    detail: str
    """Why, with the figures (for the log)."""


@dataclass(slots=True)
class _Release:
    attempts: deque[tuple[float, bool, float]] = field(default_factory=deque)
    """``(at_s, error, first_byte_s)`` per attempt in the window (NaN latency: none)."""
    errors: int = 0
    latency_sum_s: float = 0.0
    latencies: int = 0
    back_until_s: float = -math.inf
    """Routed back until then."""
    hold_s: float = 0.0
    """The last hold (doubled by a relapse within it of the return)."""
    returned_s: float = -math.inf


class ReleaseGuard:
    """Which release unpinned calls avoid now (see the module docstring)."""

    def __init__(self, config: ReleaseGuardConfig | None = None) -> None:
        self.config = config if config is not None else ReleaseGuardConfig()
        self._releases: dict[str, _Release] = {}
        self._avoided: frozenset[str] = frozenset()
        self._changes: list[ReleaseChange] = []

    def observe(
        self, now: float, revision: str | None, *, error: bool, first_byte_s: float | None
    ) -> None:
        """One attempt on an upstream of ``revision`` ended at ``now``: an ``error`` (an
        engine's 5xx, a broken connection) or answered after ``first_byte_s``."""
        if revision is None or not self.config.enabled:
            return
        release = self._releases.get(revision)
        if release is None:
            release = self._releases[revision] = _Release()
        latency = math.nan if first_byte_s is None or error else first_byte_s
        release.attempts.append((now, error, latency))
        release.errors += error
        if latency == latency:  # not NaN
            release.latency_sum_s += latency
            release.latencies += 1
        if len(self._releases) < 2:  # one release: nothing to compare, only the window
            self._forget(now, release)
            return
        self._judge(now)

    def avoided(self, now: float) -> frozenset[str]:
        """The releases unpinned calls avoid now (usually none)."""
        if self._avoided:
            self._end_holds(now)
        return self._avoided

    def known(self) -> list[str]:
        """The releases seen so far."""
        return list(self._releases)

    def changes(self) -> list[ReleaseChange]:
        """The changes since the last call, in order (the driver logs and counts them)."""
        out, self._changes = self._changes, []
        return out

    def view(self, now: float) -> dict[str, dict[str, float | int | bool]]:
        """Per release: attempts and errors in the window, mean first-byte latency, and
        whether it is routed back (for the admin API)."""
        self.avoided(now)
        out: dict[str, dict[str, float | int | bool]] = {}
        for name, r in self._releases.items():
            self._forget(now, r)
            out[name] = {
                "attempts": len(r.attempts),
                "errors": r.errors,
                "mean_first_byte_s": r.latency_sum_s / r.latencies if r.latencies else math.nan,
                "routed_back": name in self._avoided,
            }
        return out

    # -- the rule ---------------------------------------------------------------------------

    def _forget(self, now: float, release: _Release) -> None:
        horizon = now - self.config.window_s
        attempts = release.attempts
        while attempts and attempts[0][0] < horizon:
            _, error, latency = attempts.popleft()
            release.errors -= error
            if latency == latency:
                release.latency_sum_s -= latency
                release.latencies -= 1

    def _end_holds(self, now: float) -> None:
        for name in self._avoided:
            release = self._releases[name]
            if now >= release.back_until_s:
                release.returned_s = now
                release.attempts.clear()  # judged afresh on its probation
                release.errors, release.latency_sum_s, release.latencies = 0, 0.0, 0
                self._avoided = self._avoided - {name}
                self._changes.append(
                    ReleaseChange(
                        now, name, False, f"release {name!r}: back in traffic after its hold"
                    )
                )

    def _judge(self, now: float) -> None:
        cfg = self.config
        self._end_holds(now)
        for r in self._releases.values():
            self._forget(now, r)
        judged = {
            n: r
            for n, r in self._releases.items()
            if len(r.attempts) >= cfg.min_attempts and n not in self._avoided
        }
        if len(judged) < 2:
            return
        best_name = min(judged, key=lambda n: _health_key(judged[n]))
        best = judged[best_name]
        for name, release in judged.items():
            if name == best_name:
                continue
            why = self._spike(release, best)
            if why is None:
                continue
            relapse = now - release.returned_s < release.hold_s
            release.hold_s = min(cfg.max_hold_s, 2 * release.hold_s if relapse else cfg.hold_s)
            release.back_until_s = now + release.hold_s
            self._avoided = self._avoided | {name}
            self._changes.append(
                ReleaseChange(
                    now,
                    name,
                    True,
                    f"release {name!r} routed back to {best_name!r} for "
                    f"{release.hold_s:g} s: {why}",
                )
            )

    def _spike(self, release: _Release, best: _Release) -> str | None:
        """Why ``release`` spikes against ``best`` (None: it does not)."""
        cfg = self.config
        n, n0 = len(release.attempts), len(best.attempts)
        rate, base = release.errors / n, best.errors / n0
        pooled = (release.errors + best.errors) / (n + n0)
        spread = math.sqrt(pooled * (1.0 - pooled) * (1.0 / n + 1.0 / n0))
        if rate - base > cfg.max_error_rate_increase and rate - base >= cfg.min_z * spread:
            return (
                f"error rate {rate:.1%} over {len(release.attempts)} attempts against "
                f"{base:.1%} (more than {cfg.max_error_rate_increase:.1%} above)"
            )
        ratio = cfg.max_latency_ratio
        if ratio is not None and release.latencies and best.latencies:
            mean = release.latency_sum_s / release.latencies
            base_s = best.latency_sum_s / best.latencies
            if base_s > 0 and mean > ratio * base_s:
                return (
                    f"mean first byte {mean:.3f} s against {base_s:.3f} s (more than "
                    f"{ratio:g}× slower)"
                )
        return None


def _health_key(release: _Release) -> tuple[float, float]:
    """Error rate, then mean first-byte latency: the smaller the healthier."""
    mean_s = release.latency_sum_s / release.latencies if release.latencies else math.inf
    return (release.errors / len(release.attempts), mean_s)
