"""A bad day as a value: a name, a one-line summary, what it changes, and a pure
``apply(spec, cluster) -> (spec, cluster)`` that returns modified copies
(``msgspec.structs.replace``), so scenarios compose by applying them in order
(:func:`compose`; ``a+b`` on the command line).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from headway.core.workload.spec import WorkloadSpec
from headway.sim.cluster import ClusterSpec

Transform = Callable[[WorkloadSpec, ClusterSpec], tuple[WorkloadSpec, ClusterSpec]]
"""A scenario's pure transformation of a workload and a cluster."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named bad day: what it models (``summary``), what it changes in the workload and
    the cluster (``changes``), and the pure transformation that does it."""

    name: str
    summary: str
    changes: str
    transform: Transform

    def apply(self, spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
        """Modified copies of ``spec`` and ``cluster`` (the inputs are left as they were)."""
        return self.transform(spec, cluster)


def compose(*scenarios: Scenario) -> Scenario:
    """One scenario that applies ``scenarios`` in order (named ``a+b``)."""
    if not scenarios:
        raise ValueError("compose needs at least one scenario")
    if len(scenarios) == 1:
        return scenarios[0]
    parts = tuple(scenarios)

    def transform(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
        for scenario in parts:
            spec, cluster = scenario.apply(spec, cluster)
        return spec, cluster

    return Scenario(
        name="+".join(s.name for s in parts),
        summary="; ".join(s.summary for s in parts),
        changes=" Then: ".join(s.changes for s in parts),
        transform=transform,
    )
