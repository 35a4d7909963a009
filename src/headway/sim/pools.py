"""Pools of replicas per route, as the simulator runs them (the cluster file's ``pools``).

Pool ``p`` holds replicas ``bounds[p][0] .. bounds[p][1] - 1``, each with its own model
and engine where the cluster file gives them; a call goes only to the pool of its route
(``route_pool[route index]``), picked there by the pool's own router. Seed 000: separate
queues and worker pools for unlike work.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RoutePools"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutePools:
    """Which replicas each route's calls may use."""

    names: tuple[str, ...]
    """The pools, in the cluster file's order."""
    bounds: tuple[tuple[int, int], ...]
    """Per pool: its replicas, ``lo`` to ``hi - 1``."""
    route_pool: tuple[int, ...]
    """Per workload route (the compiled workload's ``route_names`` order): its pool."""

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.names):
            raise ValueError("one bound per pool")
        if any(p < 0 or p >= len(self.names) for p in self.route_pool):
            raise ValueError("every route needs a pool")
