"""The plan's knee set against the KV stability boundary μ and the analytic capacity.

A simulated knee is the most load whose SLO attainment holds; μ
(:mod:`headway.core.engine.stability`) is the most load the KV pool sustains at all. They
answer different questions, so they need not agree, but far apart they point at what
limits the cluster: a knee well below μ means the steps (or ``max_num_seqs``, or the SLO)
bind before the KV pool fills; a knee above μ means the simulated run carried more than
the pool sustains (shared prefix blocks, or a run too short to fill it), and μ is the
safer figure. The plan reports μ beside the knee and warns past :data:`DISAGREEMENT`.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import msgspec

from headway.core.engine.capacity import ThroughputEstimate, max_throughput
from headway.core.engine.stability import StabilityBoundary, stability_boundary
from headway.core.workload.compile import compile_workload
from headway.core.workload.spec import WorkloadSpec
from headway.data import load_efficiency_table
from headway.sim.cluster import ClusterSpec, num_kv_blocks, resolve_model_gpu, step_time_model

__all__ = [
    "DISAGREEMENT",
    "ReplicaCapacity",
    "StabilityCheck",
    "replica_capacity",
    "stability_check",
]

DISAGREEMENT = 0.15
"""The plan warns when the knee and μ differ by more than this fraction of μ."""


class StabilityCheck(msgspec.Struct, frozen=True, kw_only=True):
    """μ beside the knee, for the planned cluster at the peak's mix."""

    mu_tasks_per_s: float
    """μ of every replica together, in tasks per second."""
    mu_calls_per_s_per_replica: float
    analytic_capacity_tasks_per_s: float
    """The analytic saturation throughput (mean call, :func:`~headway.core.engine.
    capacity.max_throughput`) of every replica, in tasks per second."""
    bound: Literal["kv_cache", "max_num_seqs"]
    """What limits a replica's batch in the stability model."""
    kv_capacity_tokens: int
    mean_kv_demand_token_steps: float
    mean_step_s: float
    knee_over_mu: float
    """The knee over μ (1: they agree)."""
    warning: str = ""
    """Set when the knee and μ differ by more than :data:`DISAGREEMENT`: the likely cause."""


class ReplicaCapacity(NamedTuple):
    """One replica's capacity figures for a workload's calls."""

    boundary: StabilityBoundary
    """μ and what bounds it."""
    analytic: ThroughputEstimate
    """The analytic saturation throughput of the mean call."""
    calls_per_task: float


def replica_capacity(spec: WorkloadSpec, cluster: ClusterSpec) -> ReplicaCapacity | None:
    """μ and the analytic capacity of one replica of ``cluster`` under the workload's
    calls; None for a cluster of pools or a disaggregated one (no single pool to set μ
    for) or a workload without calls."""
    if cluster.pools or cluster.disaggregation is not None:
        return None
    workload = compile_workload(spec, seed=spec.seed)
    if workload.num_calls == 0 or workload.num_tasks == 0:
        return None
    step = step_time_model(cluster, load_efficiency_table())
    engine = cluster.engine
    boundary = stability_boundary(
        step,
        kv_capacity_tokens=num_kv_blocks(cluster) * engine.block_size,
        input_tokens=workload.call_input_tokens,
        output_tokens=workload.call_output_tokens,
        max_num_seqs=engine.max_num_seqs,
    )
    model, gpu = resolve_model_gpu(cluster)
    analytic = max_throughput(
        step,
        model=model,
        gpu=gpu,
        isl=max(1, round(float(workload.call_input_tokens.mean()))),
        osl=max(1, round(float(workload.call_output_tokens.mean()))),
        tensor_parallel=cluster.tensor_parallel,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        block_size=engine.block_size,
        gpu_memory_utilization=cluster.gpu_memory_utilization,
    )
    return ReplicaCapacity(boundary, analytic, workload.num_calls / workload.num_tasks)


def stability_check(
    spec: WorkloadSpec, cluster: ClusterSpec, replicas: int, knee_tasks_per_s: float
) -> StabilityCheck | None:
    """μ for ``replicas`` replicas of ``cluster`` beside the knee (None where
    :func:`replica_capacity` is)."""
    capacity = replica_capacity(spec, cluster)
    if capacity is None:
        return None
    boundary, analytic, calls_per_task = capacity
    mu_tasks = boundary.mu_requests_per_s * replicas / calls_per_task
    ratio = knee_tasks_per_s / mu_tasks if mu_tasks > 0 else 0.0
    return StabilityCheck(
        mu_tasks_per_s=mu_tasks,
        mu_calls_per_s_per_replica=boundary.mu_requests_per_s,
        analytic_capacity_tasks_per_s=analytic.requests_per_s * replicas / calls_per_task,
        bound=boundary.bound,
        kv_capacity_tokens=boundary.kv_capacity_tokens,
        mean_kv_demand_token_steps=boundary.mean_kv_demand_token_steps,
        mean_step_s=boundary.mean_step_s,
        knee_over_mu=ratio,
        warning=_cause(ratio, boundary.bound),
    )


def _cause(knee_over_mu: float, bound: str) -> str:
    """The likely reason the knee and μ disagree, or "" when they agree."""
    if abs(knee_over_mu - 1.0) <= DISAGREEMENT:
        return ""
    if knee_over_mu < 1.0:
        if bound == "max_num_seqs":
            return (
                "compute-bound: max_num_seqs caps the batch before the KV pool fills, so "
                "the steps, not the KV cache, set the knee"
            )
        return (
            "compute-bound: the SLO is missed at a load the KV pool would still sustain "
            "(the steps' length, not the KV cache, sets the knee)"
        )
    return (
        "KV-bound: the simulated knee carries more than the KV pool sustains (shared "
        "prefix blocks, or points too short to fill the pool); plan with μ"
    )
