"""Pools of replicas per route, as the simulator runs them (the cluster file's ``pools``).

Pool ``p`` holds replicas ``bounds[p][0] .. bounds[p][1] - 1``, each with its own model
and engine where the cluster file gives them; a call goes only to the pool of its route
(``route_pool[route index]``), picked there by the pool's own router. Seed 000: separate
queues and worker pools for unlike work.

When a route's pool has no routable replica (lost, starting, draining), the core
:class:`~headway.core.policy.fallback.FallbackPolicy`, the live gateway's, picks a
substitute along the route's declared ``fallback`` chain (same data policy and quality
class, healthy enough); the call then goes to that route's pool, and fails when none is
allowed, as the live gateway refuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from headway.core.policy.fallback import FallbackPolicy, RouteView, UseFallback

__all__ = ["RoutePools"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutePools:
    """Which replicas each route's calls may use, and what may stand in for a route."""

    names: tuple[str, ...]
    """The pools, in the cluster file's order."""
    bounds: tuple[tuple[int, int], ...]
    """Per pool: its replicas, ``lo`` to ``hi - 1``."""
    route_pool: tuple[int, ...]
    """Per workload route (the compiled workload's ``route_names`` order): its pool."""
    route_names: tuple[str, ...] = ()
    """The compiled workload's routes (the names the fallback policy reads)."""
    routes: Mapping[str, RouteView] = field(default_factory=dict)
    """The workload's routes: their ``fallback``, ``data_policy`` and ``quality_class``."""
    fallback: FallbackPolicy | None = None
    """The cluster's fallback policy (None: no route declares a fallback, or it is off)."""

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.names):
            raise ValueError("one bound per pool")
        if any(p < 0 or p >= len(self.names) for p in self.route_pool):
            raise ValueError("every route needs a pool")

    def fallback_pool(self, now: float, route: int, health: Callable[[int], float]) -> int:
        """The pool a call of route ``route`` goes to when its own has nothing routable
        (``health(pool)``: its routable share of replicas): the pool of the substitute
        the core policy allows, or -1 (none: the call fails, truthfully)."""
        if self.fallback is None:
            return -1
        health_by_route = {
            name: health(self.route_pool[r]) for r, name in enumerate(self.route_names)
        }
        decision = self.fallback.choose(now, self.route_names[route], self.routes, health_by_route)
        if not isinstance(decision, UseFallback):
            return -1
        return self.route_pool[self.route_names.index(decision.route)]
