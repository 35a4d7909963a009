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
from headway.planner.simulated import SimulatedPlan

Basis = Literal["calibrated", "measured", "uncalibrated", "analytic", "none"]


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """``plan.json``'s ``answer``: the replicas the plan recommends, and from what."""

    replicas: int | None
    """Replicas that hold the peak with ``planning.failures_tolerated`` lost (None: no
    count was found)."""
    holding_peak: int | None
    """Replicas that hold the peak with all up."""
    basis: Basis
    """``calibrated``: the simulation, with a step-time profile measured on the engine;
    ``measured``: the route's declared per-replica capacity (the analytic sizing), which
    wins over an uncalibrated simulation; ``uncalibrated``: the simulation's roofline,
    nothing measured; ``analytic``: the declared capacity, nothing simulated; ``none``:
    nothing to size from."""
    route: str | None
    """The route whose declared capacity sized it (``measured``, ``analytic``)."""


def peak_sizing(analytic: AnalyticPlan) -> tuple[str, Sizing] | None:
    """The first route sized from a declared capacity at the peak, and its sizing."""
    return next(
        ((r.route, r.sizing) for r in analytic.periods[-1].routes if r.sizing is not None),
        None,
    )


def plan_answer(analytic: AnalyticPlan, sim: SimulatedPlan | None) -> Answer:
    """Which count the plan leads with: a calibrated simulation, else a declared
    measurement, else the uncalibrated simulation (saying so)."""
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
