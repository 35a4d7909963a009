"""Run one simulation from a workload and a cluster: the library entry point of ``simulate``."""

from __future__ import annotations

from collections.abc import Mapping

from headway.core.engine.efficiency import EfficiencyTable
from headway.core.engine.replica import ReplicaModel
from headway.core.policy.autoscaler import Autoscaler
from headway.core.policy.fallback import FallbackPolicy
from headway.core.policy.routing import Router
from headway.core.policy.speeds import prior_from_step_time
from headway.core.trace_data import TraceData
from headway.core.workload.compile import CompiledWorkload, compile_workload
from headway.core.workload.spec import WorkloadSpec
from headway.data import load_efficiency_table
from headway.sim.cluster import (
    ClusterSpec,
    build_replica,
    check_routes,
    kv_transfer_s_per_token,
    pool_cluster,
    replica_power_w,
    resolve_model_gpu,
    step_time_model,
)
from headway.sim.gateway import GatewayPool, SimGateway
from headway.sim.pools import RoutePools
from headway.sim.presets import resolve_gateway, slo_slots
from headway.sim.results import SimResult, build_result
from headway.sim.simulator import Disaggregation, SimOptions, SimOutcome, Simulator


def simulate_compiled(
    workload: CompiledWorkload, cluster: ClusterSpec, options: SimOptions | None = None
) -> tuple[SimResult, SimOutcome]:
    """Simulate an already compiled workload on ``cluster`` (behind its ``gateway``; its
    ``pools`` serve their routes only). Raises :class:`~headway.core.errors.ConfigError`
    when the workload's routes do not fit the cluster's pools."""
    check_routes(cluster, workload.route_names)
    efficiency = load_efficiency_table()
    step_time = step_time_model(cluster, efficiency)
    pools = None
    if cluster.pools:
        replicas, pools = _pooled_replicas(workload, cluster, efficiency)
    else:
        replicas = [build_replica(cluster, step_time) for _ in range(cluster.replicas)]
    gateway = None
    if cluster.gateway.preset == "headway-default":
        config = resolve_gateway(workload, cluster, step_time)
        slots = config.slots_per_replica or cluster.engine.max_num_seqs
        gateway = SimGateway(
            config,
            num_replicas=cluster.replicas,
            max_num_seqs=cluster.engine.max_num_seqs,
            block_size=cluster.engine.block_size,
            kv_blocks_per_replica=replicas[0].scheduler.pool.num_blocks,
            # The engine model's speeds at a full batch, as the live gateway's prior.
            speed_prior=prior_from_step_time(step_time, num_seqs=slots),
            # As the live gateway: a tenant's share when positive, else its weight.
            slot_shares={
                name: t.share if t.share > 0 else t.weight
                for name, t in workload.spec.tenants.items()
            },
            pools=_gateway_pools(workload, cluster, efficiency, replicas, pools),
            routes=workload.spec.routes,
            fallback=cluster.fallback,
        )
    router = Router(kind=cluster.router)
    autoscaler = None if cluster.autoscaler is None else Autoscaler(cluster.autoscaler)
    disaggregation = None
    if cluster.disaggregation is not None:
        disaggregation = Disaggregation(
            prefill_replicas=cluster.disaggregation.prefill_replicas,
            kv_transfer_s_per_token=kv_transfer_s_per_token(cluster),
            kv_transfer_latency_s=resolve_model_gpu(cluster)[1].interconnect_latency_s,
        )
    outcome = Simulator(
        workload,
        replicas,
        router,
        options,
        gateway,
        faults=cluster.faults,
        autoscaler=autoscaler,
        new_replica=lambda: build_replica(cluster, step_time),
        disaggregation=disaggregation,
        pools=pools,
    ).run()
    if cluster.pools:
        power = [replica_power_w(pool_cluster(cluster, n)) for n in cluster.pools]
        counts = [p.replicas for p in cluster.pools.values()]
        per_replica = [w for w, n in zip(power, counts, strict=True) for _ in range(n)]
    else:
        per_replica = [replica_power_w(cluster)] * cluster.replicas
    # Replicas the autoscaler added are the cluster's own.
    extra = len(outcome.replica_up_s) - len(per_replica)
    per_replica += [replica_power_w(cluster)] * extra
    known = None if None in per_replica else [w for w in per_replica if w is not None]
    result = build_result(workload, outcome, cluster.replicas, replica_power_w=known)
    return result, outcome


def _gateway_pools(
    workload: CompiledWorkload,
    cluster: ClusterSpec,
    efficiency: EfficiencyTable,
    replicas: list[ReplicaModel],
    pools: RoutePools | None,
) -> list[GatewayPool]:
    """The pools as the simulated gateway sees them (none without ``pools``): each its
    routes, its replicas' KV blocks, dispatch slots from the SLO on its own engine (or
    the gateway's ``slots_per_replica``) and its routes' strict shares."""
    if pools is None:
        return []
    out = []
    for name, (lo, _) in zip(cluster.pools, pools.bounds, strict=True):
        pool = cluster.pools[name]
        own = pool_cluster(cluster, name)
        slots = cluster.gateway.slots_per_replica or slo_slots(
            workload, own, step_time_model(own, efficiency)
        )
        out.append(
            GatewayPool(
                replicas=pool.replicas,
                routes=frozenset(pool.routes),
                kv_blocks_per_replica=replicas[lo].scheduler.pool.num_blocks,
                slots_per_replica=slots,
                shares=dict(pool.shares),
            )
        )
    return out


def _pooled_replicas(
    workload: CompiledWorkload, cluster: ClusterSpec, efficiency: EfficiencyTable
) -> tuple[list[ReplicaModel], RoutePools]:
    """Each pool's replicas, built from its own model, GPU and engine, one after another;
    and which routes go to which."""
    replicas: list[ReplicaModel] = []
    bounds = []
    route_pool = [-1] * len(workload.route_names)
    for p, name in enumerate(cluster.pools):
        own = pool_cluster(cluster, name)
        step_time = step_time_model(own, efficiency)
        lo = len(replicas)
        replicas += [build_replica(own, step_time) for _ in range(own.replicas)]
        bounds.append((lo, len(replicas)))
        for route in cluster.pools[name].routes:
            route_pool[workload.route_names.index(route)] = p
    routes = workload.spec.routes
    declared = any(routes[name].fallback is not None for name in workload.route_names)
    pools = RoutePools(
        names=tuple(cluster.pools),
        bounds=tuple(bounds),
        route_pool=tuple(route_pool),
        route_names=workload.route_names,
        routes=routes,
        fallback=FallbackPolicy(cluster.fallback)
        if declared and cluster.fallback.enabled
        else None,
    )
    return replicas, pools


def simulate(
    spec: WorkloadSpec,
    cluster: ClusterSpec,
    *,
    seed: int | None = None,
    duration_s: float | None = None,
    traces: Mapping[str, TraceData] | None = None,
    options: SimOptions | None = None,
) -> tuple[SimResult, SimOutcome, CompiledWorkload]:
    """Compile ``spec`` with ``seed`` and simulate it on ``cluster``."""
    workload = compile_workload(spec, seed=seed, duration_s=duration_s, traces=traces)
    result, outcome = simulate_compiled(workload, cluster, options)
    return result, outcome, workload
