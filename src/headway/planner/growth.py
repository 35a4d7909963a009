"""The growth what-if (seed 000, "Change the traffic requirement"): which resource
saturates first when traffic grows, at what factor, and what the plan needs then.

Every source's peak task rate is multiplied by a growth factor ``g``; token sizes, mixes
and calls per task stay as they are. Resource by resource, at the planned cluster (the
replicas that hold today's peak with ``planning.failures_tolerated`` lost):

* **decode** and **prefill compute** of each route: output (input) tokens/s against the
  replicas' capacity, measured (``routes.<name>.replica``) or else the cluster's
  step-time model. Demand is linear in ``g``, so utilisation ``u`` saturates at ``1/u``.
* **KV memory** of each route (needs the cluster's model): Little's law on tokens held.
  A replica decoding ``r`` output tokens/s runs ``B`` sequences with ``B = r × step(B)``
  (one token per sequence per step of the step-time model); each holds ``isl + osl/2 +
  block/2`` tokens (half-way through its output, half a block wasted), as
  :mod:`headway.core.engine.capacity` counts. It saturates when ``B`` reaches the KV
  cache, at ``g = throughput(B_kv) / r``; never when ``max_num_seqs`` caps ``B`` first.
* **fixed external limits**: each downstream service's connection pool (``servers /
  mean service_time_s`` calls/s) and rate limit, and each route's quota (a hosted API's
  requests or tokens per second). Adding replicas raises none of them.

"Saturates" is utilisation 1, demand equal to capacity: past it a queue grows without
bound, the same meaning for a GPU, a pool and a quota. The planning factor is headroom
the plan chooses for latency, not a limit, and external limits have none; it is applied
where replicas are sized: the replicas each route needs at ``g`` are, resource by
resource, ``ceil(g × demand / (per-replica capacity × planning factor))``, the most of
them, plus the failures tolerated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from headway.core.engine.capacity import steady_step_time_s
from headway.core.engine.steptime import BatchShape, StepTimeModel, prefill_pairs
from headway.core.errors import ConfigError
from headway.core.workload import distributions
from headway.core.workload.spec import WorkloadSpec
from headway.planner.analytic import AnalyticPlan, RoutePeriod
from headway.sim.cluster import ClusterSpec, num_kv_blocks, pool_cluster, step_time_model

_TOLERANCE = 1e-9
"""Keeps 4800 / 840 = 5.714... at 6 replicas and 4200 / 840 at exactly 5 (as the sizing)."""


class GrowthResource(msgspec.Struct, frozen=True, kw_only=True):
    """One resource at the planned cluster, and the growth at which it saturates."""

    resource: str
    """``decode``, ``prefill compute``, ``KV memory``, ``connection pool``,
    ``rate limit``, ``request quota`` or ``token quota``."""
    owner: str
    """``route NAME`` or ``service NAME``."""
    unit: str
    """The unit of ``demand`` and ``capacity``."""
    demand: float
    """At today's peak (growth 1)."""
    capacity: float
    """At the planned cluster (fixed limits: the limit)."""
    utilization: float
    """``demand / capacity`` (KV memory: tokens held / KV cache tokens)."""
    saturates_at_growth: float | None
    """The growth factor at which utilisation reaches 1 (None: never; KV memory when the
    engine's sequence limit caps the batch first)."""
    headroom_ends_at_growth: float | None = None
    """Replicas only: the growth at which utilisation reaches the planning factor, the
    headroom the plan chose (``planning_factor × saturates_at_growth``)."""
    fixed: bool
    """A fixed external limit: adding replicas does not raise it."""
    basis: str
    """Where the capacity comes from, in words."""


class RouteNeed(msgspec.Struct, frozen=True, kw_only=True):
    """The replicas a route needs today and at the asked growth."""

    route: str
    replicas_now: int
    """Replicas holding today's peak (the planned cluster, before failover)."""
    replicas: int
    """Replicas holding the peak at the asked growth."""
    replicas_with_failover: int
    """``replicas`` + ``planning.failures_tolerated``."""
    limited_by: str
    """The resource that sets ``replicas``."""


class Growth(msgspec.Struct, frozen=True, kw_only=True):
    """``plan.json``'s ``growth``: the growth what-if (``headway plan --growth G``)."""

    factor: float
    """The asked growth: every source's peak task rate × this."""
    tasks_per_s: float
    """Today's peak task rate."""
    tasks_per_s_at_growth: float
    resources: list[GrowthResource]
    """Every resource, the first to saturate first (never-saturating ones last)."""
    binding: str | None
    """The first resource to saturate (``resource (owner)``), or None."""
    binding_growth: float | None
    """The growth at which it saturates."""
    routes: list[RouteNeed]
    """Replicas per route at ``factor``."""
    fixed_limits_exceeded: list[str]
    """Fixed external limits past capacity at ``factor``: replicas cannot fix them."""
    notes: list[str]


@dataclass(frozen=True, slots=True)
class _Scaled:
    """A resource replicas can raise: the per-replica capacity in the unit demand grows in."""

    resource: GrowthResource
    growing_demand: float
    per_replica: float
    held_tokens: Callable[[float], float] | None = None
    """KV memory only: tokens a replica holds when it decodes this many output tokens/s."""


def growth_factor_error(factor: float) -> str | None:
    """Why ``factor`` is not a growth factor (None: it is one)."""
    if not (math.isfinite(factor) and factor > 0):
        return f"{factor} is not a growth factor; use a number > 0 (10 for tenfold traffic)"
    return None


def plan_growth(
    spec: WorkloadSpec, analytic: AnalyticPlan, cluster: ClusterSpec | None, factor: float
) -> Growth:
    """The growth what-if of ``spec`` at ``factor`` × today's peak (pure, analytic)."""
    problem = growth_factor_error(factor)
    if problem is not None:
        raise ValueError(problem)
    peak = analytic.periods[-1]
    pf = spec.planning.planning_factor
    notes: list[str] = []
    resources: list[GrowthResource] = []
    needs: list[RouteNeed] = []
    efficiency = None
    for route in peak.routes:
        own = _route_cluster(spec, cluster, route.route, notes)
        step: StepTimeModel | None = None
        if own is not None:
            if efficiency is None:
                from headway.data import load_efficiency_table

                efficiency = load_efficiency_table()
            step = step_time_model(own, efficiency)
        scaled = _route_resources(spec, route, own, step, notes)
        resources += _route_quotas(spec, route)
        if not scaled:
            continue
        now = _replicas_now(route, scaled, pf)
        placed = [_at_replicas(s, now) for s in scaled]
        placed = [
            msgspec.structs.replace(r, headroom_ends_at_growth=pf * r.saturates_at_growth)
            if r.saturates_at_growth is not None
            else r
            for r in placed
        ]
        resources += placed
        counts = [math.ceil(factor * s.growing_demand / (s.per_replica * pf) - _TOLERANCE)
                  for s in scaled]  # fmt: skip
        at = max(range(len(scaled)), key=lambda i: counts[i])
        replicas = max(1, counts[at])
        needs.append(
            RouteNeed(
                route=route.route,
                replicas_now=now,
                replicas=replicas,
                replicas_with_failover=replicas + spec.planning.failures_tolerated,
                limited_by=scaled[at].resource.resource,
            )
        )
    resources += _service_resources(spec, analytic)
    if not any(r.fixed for r in resources):
        notes.append(
            "the workload declares no fixed external limit (a `services` pool or rate "
            "limit, a route's `quota_requests_per_s` or `quota_tokens_per_s`): model "
            "quotas, database writes and a customer's order API stay fixed while replicas "
            "scale; add them to see which binds"
        )
    order = sorted(
        resources,
        key=lambda r: (r.saturates_at_growth is None, r.saturates_at_growth or 0.0, not r.fixed),
    )
    first = order[0] if order and order[0].saturates_at_growth is not None else None
    exceeded = [
        _label(r)
        for r in order
        if r.fixed and r.saturates_at_growth is not None and r.saturates_at_growth <= factor
    ]
    return Growth(
        factor=factor,
        tasks_per_s=peak.tasks_per_s,
        tasks_per_s_at_growth=peak.tasks_per_s * factor,
        resources=order,
        binding=_label(first) if first is not None else None,
        binding_growth=first.saturates_at_growth if first is not None else None,
        routes=needs,
        fixed_limits_exceeded=exceeded,
        notes=notes,
    )


def _label(resource: GrowthResource) -> str:
    return f"{resource.resource} ({resource.owner})"


def _route_cluster(
    spec: WorkloadSpec, cluster: ClusterSpec | None, route: str, notes: list[str]
) -> ClusterSpec | None:
    """The replicas of ``route`` in ``cluster``: its pool, or the one pool of a
    one-route workload (None: no cluster, or none that serves the route)."""
    if cluster is None:
        return None
    for name, pool in cluster.pools.items():
        if route in pool.routes:
            return pool_cluster(cluster, name)
    if not cluster.pools and len(spec.routes) == 1:
        return cluster
    notes.append(
        f"route `{route}`: no pool of the cluster serves it, so its KV memory (and any "
        "capacity it does not declare) is not modelled; give the cluster `pools:`"
    )
    return None


def _route_resources(
    spec: WorkloadSpec,
    route: RoutePeriod,
    cluster: ClusterSpec | None,
    step: StepTimeModel | None,
    notes: list[str],
) -> list[_Scaled]:
    """Decode, prefill compute and KV memory of one route, per replica."""
    replica = spec.routes[route.route].replica
    isl = max(1, round(route.input_tokens_per_s / route.calls_per_s))
    osl = max(1, round(route.output_tokens_per_s / route.calls_per_s))
    owner = f"route {route.route}"
    scaled: list[_Scaled] = []
    engine = cluster.engine if cluster is not None else None
    where = (
        f"{cluster.profile_of or 'the calibrated profile'}"
        if cluster is not None and cluster.step_time == "profile"
        else f"the roofline of {cluster.model} on {cluster.gpu}"
        if cluster is not None
        else ""
    )

    def throughput(batch: float) -> float:
        assert step is not None
        return _throughput(step, batch, isl, osl)

    decode = replica.output_tokens_per_s if replica is not None else None
    decode_basis = f"routes.{route.route}.replica.output_tokens_per_s (measured)"
    if decode is None and step is not None and engine is not None:
        budget_seqs = engine.max_num_batched_tokens / (1.0 + isl / osl)
        decode = throughput(min(engine.max_num_seqs, budget_seqs))
        decode_basis = f"{where}, at the engine's largest batch"
    if decode is not None and route.output_tokens_per_s > 0:
        scaled.append(_scaled("decode", owner, "output tokens/s", route.output_tokens_per_s,
                              decode, decode_basis))  # fmt: skip
    prefill = replica.input_tokens_per_s if replica is not None else None
    prefill_basis = f"routes.{route.route}.replica.input_tokens_per_s (measured)"
    if prefill is None and step is not None and engine is not None:
        prefill = _prefill_tokens_per_s(step, engine.max_num_batched_tokens, isl)
        prefill_basis = f"{where}, prefill-only steps of the token budget (an upper bound)"
    if prefill is not None and route.input_tokens_per_s > 0:
        scaled.append(_scaled("prefill compute", owner, "input tokens/s",
                              route.input_tokens_per_s, prefill, prefill_basis))  # fmt: skip
    if cluster is not None and step is not None and engine is not None:
        kv = _kv_memory(cluster, route, isl, osl, throughput, notes, where)
        if kv is not None:
            scaled.append(kv)
    elif cluster is None:
        notes.append(
            f"route `{route.route}`: KV memory needs a model and a GPU (the cluster); "
            "none was given"
        )
    if not scaled:
        notes.append(
            f"route `{route.route}`: no capacity to grow against: declare "
            f"`routes.{route.route}.replica.output_tokens_per_s` or plan it on a cluster"
        )
    return scaled


def _scaled(
    resource: str, owner: str, unit: str, demand: float, per_replica: float, basis: str
) -> _Scaled:
    placeholder = GrowthResource(
        resource=resource, owner=owner, unit=unit, demand=demand, capacity=per_replica,
        utilization=0.0, saturates_at_growth=None, fixed=False, basis=basis,
    )  # fmt: skip
    return _Scaled(placeholder, demand, per_replica)


def _kv_memory(
    cluster: ClusterSpec,
    route: RoutePeriod,
    isl: int,
    osl: int,
    throughput: Callable[[float], float],
    notes: list[str],
    where: str,
) -> _Scaled | None:
    """KV memory as a per-replica output rate: the decode rate at which the KV cache is
    full (the report shows tokens held against the cache)."""
    try:
        cache_tokens = num_kv_blocks(cluster) * cluster.engine.block_size
    except ConfigError as error:
        notes.append(f"route `{route.route}`: no KV memory: {error}")
        return None
    per_seq = isl + osl / 2.0 + cluster.engine.block_size / 2.0
    full_batch = cache_tokens / per_seq
    fills = full_batch <= cluster.engine.max_num_seqs
    batch = min(full_batch, float(cluster.engine.max_num_seqs))
    per_replica = throughput(batch) if batch > 0 else 0.0
    if per_replica <= 0:
        notes.append(f"route `{route.route}`: not one {isl}-token call fits the KV cache")
        return None
    owner = f"route {route.route}"
    basis = (
        f"{cache_tokens:,} KV tokens a replica ({cluster.model} on "
        f"{cluster.tensor_parallel}× {cluster.gpu}), {per_seq:,.0f} held a sequence; "
        f"sequences from {where} (Little's law)"
    )
    if not fills:
        basis += f"; max_num_seqs {cluster.engine.max_num_seqs} caps the batch first"
    resource = GrowthResource(
        resource="KV memory", owner=owner, unit="tokens held", demand=0.0,
        capacity=float(cache_tokens), utilization=0.0, saturates_at_growth=None,
        fixed=False, basis=basis,
    )  # fmt: skip
    limit = float(cluster.engine.max_num_seqs)

    def held(rate: float) -> float:
        return _batch_at(throughput, rate, limit) * per_seq

    # A cache the sequence limit never fills sizes no replicas (decode does).
    return _Scaled(resource, route.output_tokens_per_s, per_replica if fills else math.inf, held)


def _replicas_now(route: RoutePeriod, scaled: list[_Scaled], pf: float) -> int:
    """The planned replicas: the analytic sizing, else the most any resource needs."""
    if route.sizing is not None:
        return route.sizing.replicas
    counts = [math.ceil(s.growing_demand / (s.per_replica * pf) - _TOLERANCE) for s in scaled]
    return max(1, *counts)


def _at_replicas(scaled: _Scaled, replicas: int) -> GrowthResource:
    """The resource's utilisation and saturating growth on ``replicas`` replicas."""
    r = scaled.resource
    if scaled.held_tokens is not None:
        rate = scaled.growing_demand / replicas
        held = scaled.held_tokens(rate)
        return msgspec.structs.replace(
            r,
            demand=held,
            utilization=held / r.capacity,
            saturates_at_growth=scaled.per_replica / rate
            if math.isfinite(scaled.per_replica)
            else None,
            basis=f"{r.basis}; each of {replicas} replicas decoding {rate:,.0f} tokens/s",
        )
    capacity = scaled.per_replica * replicas
    utilization = r.demand / capacity
    return msgspec.structs.replace(
        r,
        capacity=capacity,
        utilization=utilization,
        saturates_at_growth=1.0 / utilization if utilization > 0 else None,
        basis=f"{r.basis} × {replicas} replicas",
    )


def _throughput(step: StepTimeModel, batch: float, isl: int, osl: int) -> float:
    """Output tokens/s of a replica running ``batch`` sequences in the steady state of
    :func:`~headway.core.engine.capacity.steady_step_time_s` (linear between whole
    batches; 0 at 0)."""
    if batch <= 0:
        return 0.0
    lo = math.floor(batch)
    hi_rate = math.ceil(batch) / steady_step_time_s(step, max(1, math.ceil(batch)), isl, osl)
    if lo == batch:
        return hi_rate
    lo_rate = lo / steady_step_time_s(step, lo, isl, osl) if lo >= 1 else 0.0
    return lo_rate + (batch - lo) * (hi_rate - lo_rate)


def _batch_at(throughput: Callable[[float], float], rate: float, limit: float) -> float:
    """The batch ``B`` (sequences running) at which a replica decodes ``rate`` tokens/s:
    ``B = rate × step(B)``, throughput rising with the batch; ``limit`` when even the
    largest batch is slower (the replica is saturated)."""
    if rate <= 0:
        return 0.0
    if throughput(limit) <= rate:
        return limit
    lo, hi = 0.0, limit
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if throughput(mid) < rate else (lo, mid)
        if hi - lo < 1e-6:
            break
    return (lo + hi) / 2


def _prefill_tokens_per_s(step: StepTimeModel, budget_tokens: int, isl: int) -> float:
    """Prompt tokens/s of steps that only prefill, each filled to the token budget: whole
    prompts when they fit, else chunks half-way into a long prompt."""
    if isl <= budget_tokens:
        prompts = budget_tokens // isl
        tokens = prompts * isl
        batch = BatchShape(tokens, prompts * prefill_pairs(isl, 0), prompts, 0, 0)
    else:
        tokens = budget_tokens
        prior = (isl - budget_tokens) // 2
        batch = BatchShape(tokens, prefill_pairs(tokens, prior), 1, 0, 0)
    return tokens / step.step_time_s(batch)


def _route_quotas(spec: WorkloadSpec, route: RoutePeriod) -> list[GrowthResource]:
    """A route's quotas (a hosted API's rate limits), fixed external limits."""
    declared = spec.routes[route.route]
    owner = f"route {route.route}"
    found = []
    for resource, unit, demand, limit, key in (
        ("request quota", "calls/s", route.calls_per_s, declared.quota_requests_per_s,
         "quota_requests_per_s"),
        ("token quota", "tokens/s", route.input_tokens_per_s + route.output_tokens_per_s,
         declared.quota_tokens_per_s, "quota_tokens_per_s"),
    ):  # fmt: skip
        if limit is None:
            continue
        found.append(_fixed(resource, owner, unit, demand, limit, f"routes.{route.route}.{key}"))
    return found


def _fixed(
    resource: str, owner: str, unit: str, demand: float, limit: float, basis: str
) -> GrowthResource:
    utilization = demand / limit
    return GrowthResource(
        resource=resource, owner=owner, unit=unit, demand=demand, capacity=limit,
        utilization=utilization,
        saturates_at_growth=1.0 / utilization if utilization > 0 else None,
        fixed=True, basis=basis,
    )  # fmt: skip


def tool_calls_per_task(spec: WorkloadSpec, class_name: str) -> float:
    """Mean tool calls a task of the class makes: ``tools_per_call`` after every step of
    the task but its last (a step's branches share its tool calls), over its attempts."""
    cls = spec.classes[class_name]
    calls = distributions.whole_mean(cls.calls, minimum=1)
    steps = (calls + cls.verification_calls) * cls.expected_attempts
    return max(0.0, steps - 1.0) * distributions.whole_mean(cls.tools_per_call, minimum=0)


def _service_resources(spec: WorkloadSpec, analytic: AnalyticPlan) -> list[GrowthResource]:
    """Each downstream service's connection pool and rate limit, at today's peak."""
    calls = dict.fromkeys(spec.services, 0.0)
    for period_class in analytic.periods[-1].classes:
        used = spec.classes[period_class.task_class].tool_service
        if used is not None:
            calls[used] += period_class.tasks_per_s * tool_calls_per_task(
                spec, period_class.task_class
            )
    found = []
    for name, service in spec.services.items():
        owner = f"service {name}"
        hold_s = distributions.mean(service.service_time_s)
        if hold_s > 0:
            found.append(
                _fixed(
                    "connection pool",
                    owner,
                    "calls/s",
                    calls[name],
                    service.servers / hold_s,
                    f"services.{name}.servers {service.servers} / mean service_time_s {hold_s:g} s",
                )
            )
        if service.rate_limit_per_s is not None:
            found.append(
                _fixed(
                    "rate limit",
                    owner,
                    "calls/s",
                    calls[name],
                    service.rate_limit_per_s,
                    f"services.{name}.rate_limit_per_s",
                )
            )
    return found
