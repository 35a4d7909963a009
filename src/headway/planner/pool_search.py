"""The replica search of a cluster with several pools: one count per pool.

**Pools** (the cluster file's ``pools``): a route's calls go to its pool only, so each
pool is searched on its own count, judged by its own routes' SLO attainment (each route
against the strictest target of its classes), the others' counts leaving it alone. The
pools' searches run in lockstep: each round, every pool still searching proposes its
next counts (1, 2, 4, ... then k-section, :func:`~headway.planner.simulated.smallest_count`)
and one simulated point carries a count for every pool, so the pools cost as many points
as the slowest pool's search, not their sum. Pools are isolated, not independent: a task
whose calls use two routes waits on one pool before its next call reaches the other, so
a pool's arrivals shift a little with the other's count; the counts found are therefore
run together, and a pool that misses there gets one more replica until all hold.

**Disaggregation** (prefill and decode replicas): every call passes through both, so
both are judged by the whole cluster's attainment, and the two counts trade against each
other (a short prefill pool queues first tokens, a short decode pool slows every token
after), so neither can be searched alone without fixing the other. The search (1) finds
the smallest ``n`` where ``n`` prefill and ``n`` decode replicas hold (each ample for
the other, with no guess at their ratio), (2) the smallest decode count with ``n`` prefill, (3) the
smallest prefill count with that decode count, and (4) while one fewer of either still
holds beside the other, narrows that one again. Each step only lowers a count that was
seen to hold, so it ends, and it ends on a pair seen to hold where one fewer of either
misses: no smaller pair differs from it in one count.

``planning.failures_tolerated`` is added to *each* pool (a replica lost in every pool at
once), and the points per round stay fixed, so any executor finds the same counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from headway.planner.points import PlanPoint
from headway.planner.simulated import (
    Counts,
    PointRunner,
    PoolSize,
    PoolsSearch,
    ReplicaSearch,
    narrow_count,
    run_search,
    smallest_count,
)
from headway.sim.cluster import pool_replicas
from headway.sim.sweep import attainment_target, route_targets, tenant_targets

__all__ = ["search_pools"]


_METHODS = {
    "pools": "each pool on its own count, judged by its own routes' attainment, the "
    "pools searched in lockstep and their counts verified together",
    "disaggregation": "the smallest n with n prefill and n decode replicas, then decode "
    "with that prefill, then prefill with that decode, then each again while one fewer "
    "still holds",
}


def search_pools(runner: PointRunner) -> tuple[ReplicaSearch, PoolsSearch]:
    """One count per pool for the steady peak, ``failures_tolerated`` added to each; and
    the search in totals (:class:`ReplicaSearch`: its trials the points tried, each with
    its ``pool_replicas``)."""
    spec, cluster = runner.spec, runner.cluster
    names = list(pool_replicas(cluster))
    seed = spec.seed
    target = attainment_target(spec)
    failures = spec.planning.failures_tolerated
    if cluster.pools:
        kind: Literal["pools", "disaggregation"] = "pools"
        wants = route_targets(spec)
        routes = {n: list(cluster.pools[n].routes) for n in names}
        targets = {
            n: max((wants[r] for r in routes[n] if r in wants), default=target) for n in names
        }
        holding = _search_isolated(runner, names, routes, wants)
    else:
        kind = "disaggregation"
        routes = {n: list(spec.routes) for n in names}
        targets = dict.fromkeys(names, target)
        wants = {}
        holding = _search_disaggregated(runner)

    def attainment(point: PlanPoint, name: str) -> float:
        if kind == "disaggregation":
            return point.sweep.slo_attainment
        return _worst_route(point, routes[name], wants)[0]

    sizes: list[PoolSize] = []
    held = all_up = None
    verified = False
    if holding is not None:
        planned = tuple(h + failures for h in holding)
        fewer = [_minus_one(holding, i) for i in range(len(names)) if holding[i] > 1]
        points = runner.steady([(k, 1.0, seed) for k in [holding, planned, *fewer]])
        held, all_up = points[0], points[1]
        below = dict(zip(fewer, points[2:], strict=True))
        verified = all(_holds(kind, held, routes[n], wants, target) for n in names)
        for i, name in enumerate(names):
            one_fewer = below.get(_minus_one(holding, i))
            sizes.append(
                PoolSize(
                    name=name, routes=routes[name], target=targets[name],
                    holding_peak=holding[i], recommended=planned[i],
                    attainment_failures_lost=attainment(held, name),
                    attainment_all_up=attainment(all_up, name),
                    attainment_one_fewer=None if one_fewer is None else attainment(one_fewer, name),
                )
            )  # fmt: skip
    else:
        sizes = [
            PoolSize(
                name=name, routes=routes[name], target=targets[name], holding_peak=None,
                recommended=None, attainment_failures_lost=None, attainment_all_up=None,
                attainment_one_fewer=None,
            )
            for name in names
        ]  # fmt: skip
    trials = sorted(
        (
            p
            for (r, f, s), p in runner.done.items()
            if isinstance(r, tuple) and f == 1.0 and s == seed
        ),
        key=lambda p: (p.replicas, list(p.pool_replicas.values())),
    )
    search = ReplicaSearch(
        target=target,
        peak_tasks_per_s=runner.peak_tasks_per_s,
        failures_tolerated=failures,
        holding_peak=None if holding is None else sum(holding),
        recommended=None if holding is None else sum(holding) + failures * len(names),
        attainment_all_up=None if all_up is None else all_up.sweep.slo_attainment,
        attainment_failures_lost=None if held is None else held.sweep.slo_attainment,
        trials=trials,
        tenant_targets=tenant_targets(spec),
    )
    pools = PoolsSearch(
        kind=kind, failures_tolerated=failures, pools=sizes, holds=verified,
        method=_METHODS[kind],
    )  # fmt: skip
    return search, pools


def _minus_one(counts: tuple[int, ...], i: int) -> tuple[int, ...]:
    return tuple(n - 1 if j == i else n for j, n in enumerate(counts))


def _worst_route(
    point: PlanPoint, routes: Sequence[str], wants: dict[str, float]
) -> tuple[float, float]:
    """(attainment, margin over its target) of the pool's route with the least margin
    (a pool whose routes had no call to judge: (1, 1))."""
    judged = [
        (point.route_attainment[r], point.route_attainment[r] - wants[r])
        for r in routes
        if r in point.route_attainment
    ]
    return min(judged, key=lambda am: am[1], default=(1.0, 1.0))


def _holds(
    kind: str, point: PlanPoint, routes: Sequence[str], wants: dict[str, float], target: float
) -> bool:
    """Whether a pool holds at ``point``: each of its routes at its target (prefill and
    decode: the whole cluster's held attainment at the target)."""
    if kind == "disaggregation":
        return point.sweep.attainment_held >= target
    return all(point.route_attainment[r] >= wants[r] for r in routes if r in point.route_attainment)


def _search_isolated(
    runner: PointRunner,
    names: list[str],
    routes: dict[str, list[str]],
    wants: dict[str, float],
) -> tuple[int, ...] | None:
    """The pools' searches in lockstep (module docstring), then verified together."""
    settings, seed = runner.settings, runner.spec.seed
    searches = {n: smallest_count(settings.max_replicas, settings.points_per_round) for n in names}
    pending = {n: next(s) for n, s in searches.items()}
    last = {n: batch[-1] for n, batch in pending.items()}
    found: dict[str, int | None] = {}

    def count(name: str, i: int) -> int:
        if name in pending:
            batch = pending[name]
            return batch[min(i, len(batch) - 1)]
        return found[name] or last[name]

    while pending:
        width = max(len(b) for b in pending.values())
        vectors = [tuple(count(n, i) for n in names) for i in range(width)]
        points = runner.steady([(v, 1.0, seed) for v in vectors])
        for name in list(pending):
            holds = [
                _holds("pools", points[i], routes[name], wants, 0.0)
                for i in range(len(pending[name]))
            ]
            try:
                pending[name] = searches[name].send(holds)
                last[name] = pending[name][-1]
            except StopIteration as done:
                found[name] = done.value
                del pending[name]
    if any(found[n] is None for n in names):
        return None
    holding = [found[n] or 0 for n in names]
    while True:  # the counts together: a pool that misses there gets one more
        point = runner.steady([(tuple(holding), 1.0, seed)])[0]
        missing = [
            i for i, n in enumerate(names) if not _holds("pools", point, routes[n], wants, 0.0)
        ]
        if not missing:
            return tuple(holding)
        for i in missing:
            holding[i] += 1
            if holding[i] > settings.max_replicas:
                return None


def _search_disaggregated(runner: PointRunner) -> tuple[int, ...] | None:
    """Prefill and decode counts (module docstring)."""
    settings, seed = runner.settings, runner.spec.seed
    target = attainment_target(runner.spec)
    k = settings.points_per_round

    def holds(pairs: Sequence[Counts]) -> list[bool]:
        points = runner.steady([(pair, 1.0, seed) for pair in pairs])
        return [p.sweep.attainment_held >= target for p in points]

    def smallest(search_from: int, fixed: int, *, decode_varies: bool) -> int:
        """The smallest count up to ``search_from`` (which holds) of one role beside
        ``fixed`` of the other."""

        def pairs(ns: list[int]) -> list[bool]:
            return holds([(fixed, n) if decode_varies else (n, fixed) for n in ns])

        found = run_search(narrow_count(0, search_from, k), pairs)
        assert found is not None  # ``search_from`` holds
        return found

    both = run_search(
        smallest_count(settings.max_replicas, k), lambda ns: holds([(n, n) for n in ns])
    )
    if both is None:
        return None
    decode = smallest(both, both, decode_varies=True)
    prefill = smallest(both, decode, decode_varies=False)
    while True:
        fewer_decode, fewer_prefill = holds(
            [(prefill, max(decode - 1, 1)), (max(prefill - 1, 1), decode)]
        )
        if decode > 1 and fewer_decode:
            decode = smallest(decode - 1, prefill, decode_varies=True)
        elif prefill > 1 and fewer_prefill:
            prefill = smallest(prefill - 1, decode, decode_varies=False)
        else:
            return (prefill, decode)
