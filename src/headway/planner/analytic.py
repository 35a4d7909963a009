"""The analytical plan: first-order capacity arithmetic that is exactly right.

From a workload spec alone (no simulation) it computes, for the busy and the peak period:
the task and call rates (calls per task include branches and the retry multiplier), token
rates, Little's-law in-flight counts, replica sizing from measured per-replica capacity ×
planning factor (decode and prefill both checked) plus failures tolerated, queueing
figures for routes with a known request capacity (M/M/1, M/M/c, M/G/1), the
utilization-knee table, the fluid backlog and drain time of every overload episode in the
arrival profile, the autoscaling check and cost per task. Every figure and its formula is
in ``docs/planning.md``. Periods assume every source is at its busy (or peak) rate at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec
import numpy as np

from headway.core import queueing
from headway.core.workload import distributions
from headway.core.workload.arrivals import RateProfile, apply_bursts, base_profile
from headway.core.workload.spec import (
    OnOff,
    Source,
    TaskClass,
    TraceReplay,
    WorkloadSpec,
)

SCHEMA = "headway.plan.analytic/1"
KNEE_UTILIZATIONS = (0.5, 0.8, 0.9, 0.95, 0.99)


class _Out(msgspec.Struct, frozen=True, kw_only=True):
    """Base of the plan's result values."""


class Sizing(_Out, frozen=True, kw_only=True):
    """Replicas a route needs in a period."""

    planned_output_tokens_per_s_per_replica: float | None
    planned_input_tokens_per_s_per_replica: float | None
    replicas_for_decode: int | None
    replicas_for_prefill: int | None
    replicas: int
    limiting_phase: str
    failures_tolerated: int
    replicas_with_failover: int
    price_per_hour: float | None


class RoutePeriod(_Out, frozen=True, kw_only=True):
    """One route in one period."""

    route: str
    calls_per_s: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    sizing: Sizing | None
    queueing: list[queueing.QueueFigures]


class ClassPeriod(_Out, frozen=True, kw_only=True):
    """One task class in one period."""

    task_class: str
    tasks_per_s: float
    calls_per_task: float
    calls_per_s: float
    mean_input_tokens: float
    mean_output_tokens: float
    tasks_in_flight: float | None


class Little(_Out, frozen=True, kw_only=True):
    """Little's law, L = λW, at the task and call boundaries."""

    task_residence_s: float | None
    tasks_in_flight: float | None
    call_residence_s: float | None
    calls_in_flight: float | None
    note: str


class Period(_Out, frozen=True, kw_only=True):
    """The whole workload in one period (busy or peak)."""

    name: str
    tasks_per_s: float
    calls_per_task: float
    calls_per_s: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    little: Little
    classes: list[ClassPeriod]
    routes: list[RoutePeriod]
    cost_per_task: float | None
    """Provisioned replicas (sized for the peak, with failover) × price / tasks completed."""


class Episode(_Out, frozen=True, kw_only=True):
    """One overload episode of the fluid model: arrivals above capacity, then the drain."""

    source: str
    unit: str
    start_s: float
    """When arrivals first exceed capacity."""
    overload_s: float
    """How long the backlog grows."""
    peak_rate_per_s: float
    capacity_per_s: float
    rate_after_per_s: float
    """The arrival rate while the backlog drains."""
    backlog: float
    """Work queued at the end of the overload (in ``unit``)."""
    drain_s: float | None
    """Time to clear the backlog afterwards (None: it never clears within the horizon)."""
    drained: bool


class KneeRow(_Out, frozen=True, kw_only=True):
    """Latency of a route at a utilization."""

    utilization: float
    arrival_per_s: float
    mm1_mean_s: float
    mm1_p95_s: float
    mm1_p99_s: float
    mmc_mean_s: float | None
    mmc_p95_s: float | None


class KneeTable(_Out, frozen=True, kw_only=True):
    """The utilization knee of one route (or of a normalised server, capacity 1/s)."""

    route: str
    capacity_per_s: float
    servers: int
    rows: list[KneeRow]


class AutoscalingCheck(_Out, frozen=True, kw_only=True):
    """Can adding replicas save a request of this class? Only if reaction < deadline."""

    task_class: str
    deadline_s: float | None
    reaction_s: float
    can_rescue: bool | None
    note: str


class AnalyticPlan(_Out, frozen=True, kw_only=True):
    """The analytic plan of a workload."""

    schema: str
    workload: str
    planning_factor: float
    failures_tolerated: int
    periods: list[Period]
    bursts: list[Episode]
    knee: list[KneeTable]
    autoscaling: list[AutoscalingCheck]
    notes: list[str]


@dataclass(frozen=True, slots=True)
class _ClassFacts:
    calls_per_task: float
    mean_input_tokens: float
    mean_output_tokens: float
    route: str


def _class_facts(spec: WorkloadSpec, cls: TaskClass) -> _ClassFacts:
    calls = distributions.whole_mean(cls.calls, minimum=1)
    steps = (calls + cls.verification_calls) * cls.expected_attempts
    cpt = steps * cls.parallel_branches * cls.retry_multiplier
    joint = cls.joint_tokens
    if joint is not None and joint.pairs is not None:
        pairs = np.asarray(joint.pairs, dtype=np.float64)
        weights = np.ones(len(pairs)) if joint.weights is None else np.asarray(joint.weights)
        caps = [joint.max_input_tokens or math.inf, joint.max_output_tokens or math.inf]
        # Compiled calls use at least one token of each kind, as here.
        clipped = np.maximum(np.minimum(pairs, caps), 1.0)
        mean_in, mean_out = (float(v) for v in weights @ clipped / weights.sum())
    else:
        mean_in = distributions.mean(cls.input_tokens)
        mean_out = distributions.mean(cls.output_tokens)
    if cls.max_unit_tokens is not None:  # the mean call in bounded units
        units = max(1, math.ceil((mean_in + mean_out) / cls.max_unit_tokens))
        cpt, mean_in, mean_out = cpt * units, mean_in / units, mean_out / units
    return _ClassFacts(cpt, mean_in, mean_out, cls.route or next(iter(spec.routes)))


def source_profile(source: Source, horizon_s: float) -> RateProfile | None:
    """The deterministic rate profile of a source (None for random or replayed ones)."""
    if isinstance(source.arrivals, TraceReplay | OnOff):
        return None
    return apply_bursts(base_profile(source.arrivals, horizon_s), source.arrivals.bursts)


def _on_off_mean(arrivals: OnOff) -> float:
    on = distributions.mean(arrivals.on_s)
    off = distributions.mean(arrivals.off_s)
    return (arrivals.on_rate_per_s * on + arrivals.off_rate_per_s * off) / (on + off)


def source_rates(source: Source, horizon_s: float) -> tuple[float | None, float | None]:
    """(busy, peak) task rates of a source: declared, or from its arrival process.

    Busy defaults to the time-average of the process without bursts; peak to the highest
    rate with bursts. Trace replays have no default (declare them).
    """
    busy, peak = source.busy_rate_per_s, source.peak_rate_per_s
    arrivals = source.arrivals
    if isinstance(arrivals, OnOff):
        busy = busy if busy is not None else _on_off_mean(arrivals)
        rate_max = max(arrivals.on_rate_per_s, arrivals.off_rate_per_s)
        peak = peak if peak is not None else rate_max
    elif not isinstance(arrivals, TraceReplay):
        if busy is None:
            busy = base_profile(arrivals, horizon_s).mean_rate_per_s()
        if peak is None:
            profile = source_profile(source, horizon_s)
            peak = profile.max_rate_per_s() if profile is not None else busy
    return busy, peak


def _sizing(spec: WorkloadSpec, route_name: str, out_tps: float, in_tps: float) -> Sizing | None:
    route = spec.routes[route_name]
    replica = route.replica
    if replica is None or (
        replica.output_tokens_per_s is None and replica.input_tokens_per_s is None
    ):
        return None
    pf = spec.planning.planning_factor
    planned_out = replica.output_tokens_per_s * pf if replica.output_tokens_per_s else None
    planned_in = replica.input_tokens_per_s * pf if replica.input_tokens_per_s else None
    # A tiny tolerance keeps 4800 / 840 = 5.714... at 6 and 4200 / 840 at exactly 5.
    decode = math.ceil(out_tps / planned_out - 1e-9) if planned_out else None
    prefill = math.ceil(in_tps / planned_in - 1e-9) if planned_in else None
    replicas = max(decode or 0, prefill or 0, 1 if (out_tps > 0 or in_tps > 0) else 0)
    limiting = "prefill" if (prefill or 0) > (decode or 0) else "decode"
    if decode is None:
        limiting = "prefill"
    failures = spec.planning.failures_tolerated
    return Sizing(
        planned_output_tokens_per_s_per_replica=planned_out,
        planned_input_tokens_per_s_per_replica=planned_in,
        replicas_for_decode=decode,
        replicas_for_prefill=prefill,
        replicas=replicas,
        limiting_phase=limiting,
        failures_tolerated=failures,
        replicas_with_failover=replicas + failures,
        price_per_hour=replica.price_per_hour,
    )


def _queueing(
    spec: WorkloadSpec, route_name: str, calls_per_s: float
) -> list[queueing.QueueFigures]:
    route = spec.routes[route_name]
    if route.requests_per_s is None:
        return []
    figures = [queueing.mm1(calls_per_s, route.requests_per_s)]
    if route.servers > 1:
        figures.append(
            queueing.mmc(calls_per_s, route.requests_per_s / route.servers, route.servers)
        )
    figures.append(queueing.mg1(calls_per_s, route.requests_per_s, route.service_time_cv))
    return figures


def _period(
    spec: WorkloadSpec,
    name: str,
    rates: Mapping[str, float],
    facts: Mapping[str, _ClassFacts],
    peak_sizing: Mapping[str, Sizing | None] | None,
) -> Period:
    class_rates: dict[str, float] = dict.fromkeys(spec.classes, 0.0)
    for source in spec.sources:
        mix = source.mix or {next(iter(spec.classes)): 1.0}
        total = sum(mix.values())
        for cls, share in mix.items():
            class_rates[cls] += rates[source.name] * share / total
    classes = []
    route_calls = dict.fromkeys(spec.routes, 0.0)
    route_in = dict.fromkeys(spec.routes, 0.0)
    route_out = dict.fromkeys(spec.routes, 0.0)
    for cls_name, tasks in class_rates.items():
        f = facts[cls_name]
        calls = tasks * f.calls_per_task
        route_calls[f.route] += calls
        route_in[f.route] += calls * f.mean_input_tokens
        route_out[f.route] += calls * f.mean_output_tokens
        residence = spec.classes[cls_name].mean_residence_s
        classes.append(
            ClassPeriod(
                task_class=cls_name,
                tasks_per_s=tasks,
                calls_per_task=f.calls_per_task,
                calls_per_s=calls,
                mean_input_tokens=f.mean_input_tokens,
                mean_output_tokens=f.mean_output_tokens,
                tasks_in_flight=tasks * residence if residence is not None else None,
            )
        )
    routes = [
        RoutePeriod(
            route=r,
            calls_per_s=route_calls[r],
            input_tokens_per_s=route_in[r],
            output_tokens_per_s=route_out[r],
            sizing=_sizing(spec, r, route_out[r], route_in[r]),
            queueing=_queueing(spec, r, route_calls[r]),
        )
        for r in spec.routes
        if route_calls[r] > 0
    ]
    tasks_per_s = sum(c.tasks_per_s for c in classes)
    calls_per_s = sum(c.calls_per_s for c in classes)
    sizing_for_cost = (
        peak_sizing if peak_sizing is not None else {r.route: r.sizing for r in routes}
    )
    return Period(
        name=name,
        tasks_per_s=tasks_per_s,
        calls_per_task=calls_per_s / tasks_per_s if tasks_per_s else 0.0,
        calls_per_s=calls_per_s,
        input_tokens_per_s=sum(r.input_tokens_per_s for r in routes),
        output_tokens_per_s=sum(r.output_tokens_per_s for r in routes),
        little=_little(spec, classes, routes),
        classes=classes,
        routes=routes,
        cost_per_task=_cost_per_task(sizing_for_cost, tasks_per_s),
    )


def _little(spec: WorkloadSpec, classes: list[ClassPeriod], routes: list[RoutePeriod]) -> Little:
    active = [c for c in classes if c.tasks_per_s > 0]
    tasks_per_s = sum(c.tasks_per_s for c in active)
    notes = []
    tasks_in_flight: float | None = None
    task_residence: float | None = None
    if active and all(c.tasks_in_flight is not None for c in active):
        tasks_in_flight = sum(c.tasks_in_flight or 0.0 for c in active)
        task_residence = tasks_in_flight / tasks_per_s
    else:
        notes.append("give classes.<name>.mean_residence_s for tasks in flight")
    calls_in_flight: float | None = 0.0
    mean_from_queue = {r.route: r.queueing[0].mean_s for r in routes if r.queueing}
    for c in active:
        cls = spec.classes[c.task_class]
        route = cls.route or next(iter(spec.routes))
        call_s = cls.mean_call_s if cls.mean_call_s is not None else mean_from_queue.get(route)
        if call_s is None or calls_in_flight is None:
            calls_in_flight = None
            continue
        calls_in_flight += c.calls_per_s * call_s
    calls_per_s = sum(c.calls_per_s for c in active)
    if calls_in_flight is None:
        notes.append(
            "give classes.<name>.mean_call_s (or the route's requests_per_s) for calls in flight"
        )
    return Little(
        task_residence_s=task_residence,
        tasks_in_flight=tasks_in_flight,
        call_residence_s=calls_in_flight / calls_per_s if calls_in_flight and calls_per_s else None,
        calls_in_flight=calls_in_flight,
        note="; ".join(notes) or "L = λW at each boundary; a stable system only",
    )


def _cost_per_task(sizing: Mapping[str, Sizing | None], tasks_per_s: float) -> float | None:
    priced = [s for s in sizing.values() if s is not None and s.price_per_hour is not None]
    if not priced or tasks_per_s <= 0:
        return None
    per_s = sum(s.replicas_with_failover * (s.price_per_hour or 0.0) for s in priced) / 3600
    return per_s / tasks_per_s


def _source_capacity(
    spec: WorkloadSpec,
    source: Source,
    facts: Mapping[str, _ClassFacts],
    peak: Mapping[str, Sizing | None],
) -> float | None:
    """Tasks/s the system completes for a source: declared, from the route, or sized."""
    if source.capacity_per_s is not None:
        return source.capacity_per_s
    mix = source.mix or {next(iter(spec.classes)): 1.0}
    total = sum(mix.values())
    cpt = sum(facts[c].calls_per_task * s for c, s in mix.items()) / total
    out_per_task = (
        sum(facts[c].calls_per_task * facts[c].mean_output_tokens * s for c, s in mix.items())
        / total
    )
    routes = {facts[c].route for c in mix}
    if len(routes) != 1:
        return None
    route_name = routes.pop()
    route = spec.routes[route_name]
    if route.requests_per_s is not None:
        return route.requests_per_s / cpt
    sizing = peak.get(route_name)
    if sizing is not None and route.replica and route.replica.output_tokens_per_s and out_per_task:
        return sizing.replicas * route.replica.output_tokens_per_s / out_per_task
    return None


def fluid_episodes(
    profile: RateProfile, capacity_per_s: float, source: str, unit: str
) -> list[Episode]:
    """Overload episodes of a fluid queue fed by ``profile`` and drained at ``capacity``.

    The backlog grows at ``rate - capacity`` while the rate exceeds capacity and shrinks
    at ``capacity - rate`` otherwise; an episode runs from the first growth to empty.
    """
    episodes: list[Episode] = []
    backlog = 0.0
    start = peak_rate = peak_backlog = peak_time = rate_after = 0.0
    in_episode = False

    def close(drain_s: float | None) -> None:
        episodes.append(
            Episode(
                source=source,
                unit=unit,
                start_s=start,
                overload_s=peak_time - start,
                peak_rate_per_s=peak_rate,
                capacity_per_s=capacity_per_s,
                rate_after_per_s=rate_after,
                backlog=peak_backlog,
                drain_s=drain_s,
                drained=drain_s is not None,
            )
        )

    edges, rates = profile.edges_s.tolist(), profile.rates_per_s.tolist()
    for i, rate in enumerate(rates):
        t0, t1 = edges[i], edges[i + 1]
        net = rate - capacity_per_s
        if net > 0:
            if not in_episode:
                in_episode, start, peak_rate = True, t0, rate
            peak_rate = max(peak_rate, rate)
            backlog += net * (t1 - t0)
            if backlog >= peak_backlog:
                peak_backlog, peak_time = backlog, t1
                rate_after = rates[i + 1] if i + 1 < len(rates) else rate
            continue
        if not in_episode:
            continue
        if net < 0 and backlog <= -net * (t1 - t0):
            close(t0 + backlog / -net - peak_time)
            backlog, in_episode, peak_backlog = 0.0, False, 0.0
        else:
            backlog += net * (t1 - t0)
    if in_episode:
        close(None)
    return episodes


def _knee(spec: WorkloadSpec) -> list[KneeTable]:
    tables = []
    targets = [(n, r.requests_per_s, r.servers) for n, r in spec.routes.items() if r.requests_per_s]
    if not targets:
        targets = [("normalised server", 1.0, 1)]
    for name, capacity, servers in targets:
        assert capacity is not None  # filtered above
        rows = []
        for u in KNEE_UTILIZATIONS:
            lam = u * capacity
            m1 = queueing.mm1(lam, capacity)
            mc = queueing.mmc(lam, capacity / servers, servers) if servers > 1 else None
            rows.append(
                KneeRow(
                    utilization=u,
                    arrival_per_s=lam,
                    mm1_mean_s=m1.mean_s or math.inf,
                    mm1_p95_s=m1.p95_s or math.inf,
                    mm1_p99_s=m1.p99_s or math.inf,
                    mmc_mean_s=mc.mean_s if mc else None,
                    mmc_p95_s=mc.p95_s if mc else None,
                )
            )
        tables.append(KneeTable(route=name, capacity_per_s=capacity, servers=servers, rows=rows))
    return tables


def _autoscaling(spec: WorkloadSpec) -> list[AutoscalingCheck]:
    auto = spec.planning.autoscaling
    if auto is None:
        return []
    reaction = auto.detection_s + auto.startup_s
    checks = []
    for name, cls in spec.classes.items():
        deadline = cls.slo.task_deadline_s or cls.slo.e2e_s
        if deadline is None:
            checks.append(
                AutoscalingCheck(
                    task_class=name,
                    deadline_s=None,
                    reaction_s=reaction,
                    can_rescue=None,
                    note="no deadline to compare",
                )
            )
            continue
        can = reaction <= deadline
        note = (
            f"a new replica is ready {reaction:g} s after overload starts, within the "
            f"{deadline:g} s deadline"
            if can
            else f"overload is detected in {auto.detection_s:g} s and a replica is ready "
            f"{auto.startup_s:g} s later: autoscaling cannot save a request with a "
            f"{deadline:g} s deadline; admission control and headroom must"
        )
        checks.append(
            AutoscalingCheck(
                task_class=name, deadline_s=deadline, reaction_s=reaction, can_rescue=can, note=note
            )
        )
    return checks


def plan_analytic(spec: WorkloadSpec) -> AnalyticPlan:
    """Compute the analytic plan of ``spec`` (pure; no simulation)."""
    horizon = spec.duration_s
    facts = {name: _class_facts(spec, cls) for name, cls in spec.classes.items()}
    notes: list[str] = []
    busy: dict[str, float] = {}
    peak: dict[str, float] = {}
    for source in spec.sources:
        b, p = source_rates(source, horizon)
        if b is None or p is None:
            notes.append(
                f"source `{source.name}` replays a trace: declare busy_rate_per_s and "
                "peak_rate_per_s for the analytic plan (or run `headway trace stats`)"
            )
        busy[source.name] = b or 0.0
        peak[source.name] = p or 0.0
    peak_period = _period(spec, "peak", peak, facts, None)
    peak_sizing = {r.route: r.sizing for r in peak_period.routes}
    busy_period = _period(spec, "busy", busy, facts, peak_sizing)
    bursts: list[Episode] = []
    for source in spec.sources:
        profile = source_profile(source, horizon)
        capacity = _source_capacity(spec, source, facts, peak_sizing)
        if profile is None or capacity is None:
            if profile is not None and profile.max_rate_per_s() > profile.mean_rate_per_s():
                notes.append(
                    f"source `{source.name}`: no capacity known for the burst model; set "
                    "capacity_per_s on the source or requests_per_s on its route"
                )
            continue
        bursts.extend(fluid_episodes(profile, capacity, source.name, "tasks"))
    notes.extend(
        f"{period.name}: route `{route.route}` runs at utilization "
        f"{route.queueing[0].utilization:.2f} >= 1: its queue grows without bound"
        for period in (busy_period, peak_period)
        for route in period.routes
        if route.queueing and not route.queueing[0].stable
    )
    return AnalyticPlan(
        schema=SCHEMA,
        workload=spec.name,
        planning_factor=spec.planning.planning_factor,
        failures_tolerated=spec.planning.failures_tolerated,
        periods=[busy_period, peak_period],
        bursts=bursts,
        knee=_knee(spec),
        autoscaling=_autoscaling(spec),
        notes=notes,
    )
