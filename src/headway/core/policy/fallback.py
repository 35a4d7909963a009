"""Fallback routes: used only when they keep the task's meaning.

Seed 000: "If a model route fails, a substitute is permitted only when its data policy,
tool behavior, and evaluated task quality satisfy the route's requirements." A route
declares its ``fallback`` (the workload's ``routes.<name>.fallback``), its
``data_policy`` and its ``quality_class``. :meth:`FallbackPolicy.choose` follows the
declared chain from the failed route for at most ``max_hops`` steps and returns the first
route whose data policy and quality class equal the *failed route's* and whose health is
at least ``min_health``; otherwise :class:`NoFallback` with the reason of the nearest
candidate, and the caller fails the request truthfully instead of answering with a route
that was never evaluated for it.

The workload's :class:`~headway.core.workload.spec.Route` satisfies :class:`RouteView`;
health comes from the driver as a mapping (a missing route counts as healthy).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import msgspec

from headway.core.policy._checks import require

__all__ = [
    "FallbackConfig",
    "FallbackDecision",
    "FallbackPolicy",
    "FallbackReason",
    "NoFallback",
    "RouteView",
    "UseFallback",
]


class FallbackConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """When a failed route may hand its calls to another."""

    enabled: bool = True
    """Off: a failed route's calls fail (nothing substitutes)."""

    max_hops: int = 1
    """How far along the declared chain to look (1: only the route's own ``fallback``).
    Longer chains are allowed but each hop must still match the failed route."""

    min_health: float = 0.5
    """A fallback whose health score (1 healthy, 0 down) is below this is skipped."""

    def __post_init__(self) -> None:
        require(self.max_hops >= 1, "fallback", "max_hops", self.max_hops, "use 1 or more")
        require(
            math.isfinite(self.min_health) and 0.0 <= self.min_health <= 1.0,
            "fallback",
            "min_health",
            self.min_health,
            "use a score in [0, 1]",
        )


class RouteView(Protocol):
    """What the fallback policy reads about a route."""

    @property
    def fallback(self) -> str | None: ...
    @property
    def data_policy(self) -> str: ...
    @property
    def quality_class(self) -> str: ...


class FallbackReason(enum.Enum):
    """Why no fallback was chosen."""

    DISABLED = "disabled"
    """Fallback is turned off."""

    NONE_DECLARED = "none_declared"
    """The chain ends: no (further) fallback is declared."""

    UNKNOWN_ROUTE = "unknown_route"
    """A route in the chain is not defined."""

    DATA_POLICY_MISMATCH = "data_policy_mismatch"
    """The candidate handles data under a different policy."""

    QUALITY_MISMATCH = "quality_mismatch"
    """The candidate was evaluated in a different quality class."""

    UNHEALTHY = "unhealthy"
    """The candidate's health is below ``min_health``."""

    CYCLE = "cycle"
    """The chain returns to a route already tried."""


@dataclass(frozen=True, slots=True)
class UseFallback:
    """Send the call to ``route``."""

    route: str
    """The substitute route."""

    hops: int
    """Its distance along the chain (1: the failed route's own fallback)."""


@dataclass(frozen=True, slots=True)
class NoFallback:
    """No route may substitute."""

    reason: FallbackReason
    """Why the nearest candidate (or the chain) was refused."""

    detail: str = ""
    """Every candidate looked at, and why each was refused."""


FallbackDecision: TypeAlias = UseFallback | NoFallback
"""The outcome of :meth:`FallbackPolicy.choose`."""


class FallbackPolicy:
    """Chooses a substitute route for a failed one (see the module docstring)."""

    def __init__(self, config: FallbackConfig | None = None) -> None:
        self.config = config if config is not None else FallbackConfig()

    def choose(
        self,
        now: float,
        route: str,
        routes: Mapping[str, RouteView],
        health: Mapping[str, float] | None = None,
    ) -> FallbackDecision:
        """The fallback for a call that failed on ``route`` at ``now``."""
        del now  # the choice is state-based; `now` is part of the policy contract
        cfg = self.config
        if not cfg.enabled:
            return NoFallback(FallbackReason.DISABLED, "fallback is disabled")
        origin = routes.get(route)
        if origin is None:
            return NoFallback(FallbackReason.UNKNOWN_ROUTE, f"route {route!r} is not defined")
        health = health if health is not None else {}
        seen = {route}
        refusals: list[tuple[FallbackReason, str]] = []
        current = origin
        for hop in range(1, cfg.max_hops + 1):
            name = current.fallback
            if name is None:
                refusals.append((FallbackReason.NONE_DECLARED, "the chain ends"))
                break
            if name in seen:
                refusals.append((FallbackReason.CYCLE, f"{name!r} was already tried"))
                break
            seen.add(name)
            candidate = routes.get(name)
            if candidate is None:
                refusals.append((FallbackReason.UNKNOWN_ROUTE, f"{name!r} is not defined"))
                break
            refusal = self._refusal(origin, name, candidate, health.get(name, 1.0))
            if refusal is None:
                return UseFallback(name, hop)
            refusals.append(refusal)
            current = candidate
        reason = refusals[0][0] if refusals else FallbackReason.NONE_DECLARED
        return NoFallback(reason, f"from {route!r}: " + "; ".join(text for _, text in refusals))

    def _refusal(
        self, origin: RouteView, name: str, candidate: RouteView, health: float
    ) -> tuple[FallbackReason, str] | None:
        if candidate.data_policy != origin.data_policy:
            return (
                FallbackReason.DATA_POLICY_MISMATCH,
                f"{name!r} has data policy {candidate.data_policy!r}, "
                f"the route needs {origin.data_policy!r}",
            )
        if candidate.quality_class != origin.quality_class:
            return (
                FallbackReason.QUALITY_MISMATCH,
                f"{name!r} is quality class {candidate.quality_class!r}, "
                f"the route needs {origin.quality_class!r}",
            )
        if health < self.config.min_health:
            return (
                FallbackReason.UNHEALTHY,
                f"{name!r} health {health:.2f} < {self.config.min_health:.2f}",
            )
        return None
