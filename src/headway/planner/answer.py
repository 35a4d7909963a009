"""The plan's answer: the replica count it leads with, and what that count rests on.

A simulated count is only as good as its step-time model. A profile that ``headway
calibrate`` fitted (``--profile``, or the cluster's ``profile``) models the user's engine;
the roofline is a model of a GPU and a model shape, not a measurement of any engine. So a
per-replica capacity the workload declares as measured (``routes.<name>.replica``) wins
over an uncalibrated simulation, and a count from an uncalibrated simulation says so.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from headway.planner.analytic import AnalyticPlan, Sizing
from headway.planner.simulated import PoolsSearch, SimulatedPlan
from headway.sim.cluster import pool_replicas

Basis = Literal["calibrated", "measured", "uncalibrated", "analytic", "none"]


class PoolAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """One pool's count in the answer."""

    pool: str
    """``pools.<name>``'s name, or ``prefill`` / ``decode``."""
    replicas: int | None
    """Its replicas with ``planning.failures_tolerated`` lost in it."""
    holding_peak: int | None
    """Its replicas with all up."""


class Answer(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``plan.json``'s ``answer``: the replicas the plan recommends, and from what."""

    replicas: int | None
    """Replicas that hold the peak with ``planning.failures_tolerated`` lost (None: no
    count was found); with pools, in all (``failures_tolerated`` lost in each pool)."""
    holding_peak: int | None
    """Replicas that hold the peak with all up."""
    basis: Basis
    """``calibrated``: the simulation, with a step-time profile measured on the engine;
    ``measured``: the route's declared per-replica capacity (the analytic sizing), which
    wins over an uncalibrated simulation; ``uncalibrated``: the simulation's roofline,
    nothing measured; ``analytic``: the declared capacity, nothing simulated; ``none``:
    nothing to size from."""
    route: str | None
    """The route whose declared capacity sized it (``measured``, ``analytic``; None for
    pools: each pool's routes)."""
    pools: list[PoolAnswer] = []
    """Each pool's count (a cluster of pools, or a disaggregated one's prefill and
    decode; left out for one pool)."""


def peak_sizing(analytic: AnalyticPlan) -> tuple[str, Sizing] | None:
    """The first route sized from a declared capacity at the peak, and its sizing."""
    return next(
        ((r.route, r.sizing) for r in analytic.periods[-1].routes if r.sizing is not None),
        None,
    )


def _pools_answer(analytic: AnalyticPlan, sim: SimulatedPlan, pools: PoolsSearch) -> Answer:
    """The answer for a cluster of pools or a disaggregated one: the simulation's counts,
    or for pools whose every route declares a measured capacity (and an uncalibrated
    simulation), each pool sized from its routes' declared capacity. A capacity measured
    on colocated replicas sizes no prefill or decode pool: there the simulation leads."""
    calibrated = sim.cluster.step_time == "profile"
    sizings = {r.route: r.sizing for r in analytic.periods[-1].routes}
    declared = (
        pools.kind == "pools"
        and not calibrated
        and all(sizings.get(r) is not None for p in pools.pools for r in p.routes)
    )
    if declared:
        answers = []
        for p in pools.pools:
            held = sum(s.replicas for r in p.routes if (s := sizings[r]) is not None)
            answers.append(
                PoolAnswer(pool=p.name, replicas=held + pools.failures_tolerated, holding_peak=held)
            )
        basis: Basis = "measured"
    else:
        answers = [
            PoolAnswer(pool=p.name, replicas=p.recommended, holding_peak=p.holding_peak)
            for p in pools.pools
        ]
        basis = "calibrated" if calibrated else "uncalibrated"
    found = all(a.replicas is not None for a in answers)
    return Answer(
        replicas=sum(a.replicas or 0 for a in answers) if found else None,
        holding_peak=sum(a.holding_peak or 0 for a in answers) if found else None,
        basis=basis,
        route=None,
        pools=answers,
    )


def plan_answer(analytic: AnalyticPlan, sim: SimulatedPlan | None) -> Answer:
    """Which count the plan leads with: a calibrated simulation, else a declared
    measurement, else the uncalibrated simulation (saying so)."""
    if sim is not None and sim.pools is not None:
        return _pools_answer(analytic, sim, sim.pools)
    if sim is not None and pool_replicas(sim.cluster):  # pools, their search not run
        basis: Basis = "calibrated" if sim.cluster.step_time == "profile" else "uncalibrated"
        return Answer(replicas=None, holding_peak=None, basis=basis, route=None)
    declared = peak_sizing(analytic)
    search = sim.replica_search if sim is not None else None
    if sim is not None and (sim.cluster.step_time == "profile" or declared is None):
        return Answer(
            replicas=search.recommended if search is not None else None,
            holding_peak=search.holding_peak if search is not None else None,
            basis="calibrated" if sim.cluster.step_time == "profile" else "uncalibrated",
            route=None,
        )
    if declared is None:
        return Answer(replicas=None, holding_peak=None, basis="none", route=None)
    route, sizing = declared
    return Answer(
        replicas=sizing.replicas_with_failover,
        holding_peak=sizing.replicas,
        basis="measured" if sim is not None else "analytic",
        route=route,
    )
