"""The gateway's decisions, sans-I/O: admission, queues, dispatch slots, tenant slot
shares, routing, fallback, the speed estimate, charges and refunds, and queue expiry.

:class:`GatewayCore` owns the state the policies read (requests dispatched per band and
per tenant, in flight per tenant, each upstream's outstanding load) and carries out what
they decide. Every method takes ``now``; nothing here reads a clock, arms a timer or
awaits (the model is h11: the driver feeds in what happened and reads out what to do).

A request is offered with :meth:`GatewayCore.offer`: a
:class:`~headway.core.policy.decisions.Shed`, or a :class:`Lease`, dispatched (its
``upstream`` set) or queued. A queued lease is settled later by another call
(:meth:`~GatewayCore.release`, :meth:`~GatewayCore.pump`, :meth:`~GatewayCore.expire`,
...): each settlement is an *outcome* (the lease and the upstream it was dispatched to,
or the shed that ended it) that the driver collects with :meth:`~GatewayCore.outcomes`
and delivers to the waiting caller. :meth:`~GatewayCore.next_timer_s` says when the
driver's one timer must call :meth:`~GatewayCore.on_timer` (a queued lease's deadline, or
a time at which a slot cap or an ejection ends).

Slot shares (``tenant_slot_headroom``): while two or more tenants are active, a tenant
holds at most its share of the ready slots (:meth:`GatewayCore.slot_caps`); at its cap
its requests are queued and passed over by the queues' ``eligible`` hook without losing
their place, so a light tenant finds a slot beside a flood. Alone, a tenant takes every
slot.

The live gateway (:mod:`headway.gateway.control`) drives it on the wall clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from headway.core.policy.admission import (
    AdmissionConfig,
    AdmissionPolicy,
    AdmissionRequest,
    LoadSnapshot,
    TenantLoad,
)
from headway.core.policy.charges import Phase, unused_tokens
from headway.core.policy.decisions import Admit, Enqueue, Shed, ShedReason
from headway.core.policy.degraded import (
    Degradation,
    DegradedConfig,
    DegradedModes,
    PressureReading,
)
from headway.core.policy.fallback import (
    FallbackConfig,
    FallbackPolicy,
    NoFallback,
    RouteView,
    UseFallback,
)
from headway.core.policy.queues import BANDS, Band, PriorityQueues, QueueConfig, Queued
from headway.core.policy.rates import CompletionRates
from headway.core.policy.releases import ReleaseChange, ReleaseGuard, ReleaseGuardConfig
from headway.core.policy.routing import ReplicaLoad, Router, RouteRequest
from headway.core.policy.slot_shares import TenantSlots
from headway.core.policy.speeds import ServiceSpeeds, SpeedPrior

__all__ = [
    "BudgetSeam",
    "CoreSettings",
    "GatewayCore",
    "Lease",
    "Outcome",
    "StaticUpstreams",
    "UpstreamSource",
    "UpstreamState",
]


@dataclass(slots=True, kw_only=True)
class UpstreamState:
    """One upstream as the core sees it (a :class:`~headway.core.policy.routing.
    LoadView`)."""

    url: str
    revision: str | None = None
    route: str | None = None
    """The route it serves (None: every route, unless ``routes``)."""
    routes: frozenset[str] | None = None
    """The routes it serves when they are several (a pool shared by routes; the
    simulator's ``pools``); None: ``route`` says."""
    slots: int = 64
    total_kv_blocks: int = 1_000_000
    api_key: str | None = None
    draining: bool = False
    """Admin drain: takes no new request; in-flight ones finish."""
    healthy: bool = True
    """What the pool says (always True without a pool)."""
    down_until_s: float = 0.0
    """Passive ejection: after a connection failure it is not routed to until then."""
    failures_in_a_row: int = 0
    """Connection failures since its last answer: each ejection lasts twice the one
    before (:meth:`eject`)."""
    outstanding_requests: int = 0
    outstanding_tokens: int = 0
    projected_blocks: int = 0
    waiting_requests: int = 0

    def ready_at(self, now: float) -> bool:
        """Routable at ``now``: healthy, not draining, not ejected."""
        return (
            self.healthy
            and not self.draining
            and (self.down_until_s == 0.0 or now >= self.down_until_s)
        )

    def eject(self, now: float, eject_s: float) -> None:
        """A connection to it failed: out of rotation for ``eject_s`` × 2^(failures in a
        row − 1), at most 16 × ``eject_s`` (a dead engine with no calls is the least
        loaded one: every ejection that ends while it is still down costs a call an
        attempt). An answer (:meth:`answered`) or a passing probe ends the run."""
        self.failures_in_a_row += 1
        self.down_until_s = now + eject_s * 2.0 ** min(self.failures_in_a_row - 1, 4)

    def answered(self) -> None:
        """It answered a call: the next failure starts a fresh run of ejections."""
        self.failures_in_a_row = 0

    def reachable_again(self) -> None:
        """Its readiness probe passed: the passive ejection ends now."""
        self.failures_in_a_row = 0
        self.down_until_s = 0.0

    @property
    def free_kv_blocks(self) -> int:
        """Blocks not projected for its dispatched requests."""
        return self.total_kv_blocks - self.projected_blocks


class UpstreamSource(Protocol):
    """Where the upstreams come from (the pool, or the config's static list)."""

    def upstreams(self) -> Sequence[UpstreamState]: ...


class StaticUpstreams:
    """A fixed list of upstreams, every one ready unless drained or ejected."""

    def __init__(self, states: Sequence[UpstreamState]) -> None:
        self.states = list(states)

    def upstreams(self) -> Sequence[UpstreamState]:
        """All of them."""
        return self.states


class BudgetSeam(Protocol):
    """A shared budget consulted before local admission (the gateway's Redis budgets)."""

    def check(self, now: float, tenant: str, tokens: int) -> Shed | None: ...
    def give_back(self, tenant: str, tokens: float, now: float) -> None: ...
    def add_in_flight(self, tenant: str, delta: int) -> None: ...


@dataclass(slots=True, eq=False, weakref_slot=True)
class Lease:
    """One admitted or enqueued request, until :meth:`GatewayCore.release`."""

    tenant: str
    band: Band
    cost_tokens: int
    blocks: int
    revision: str | None
    deadline_s: float | None
    route: str | None = None
    prompt_tokens: int = 0
    expected_output_tokens: int = 0
    """What the router plans for (the request's estimate; 0: none)."""
    item: int = -1
    """The driver's handle for it (the simulator's attempt code)."""
    upstream: UpstreamState | None = None
    queued: bool = False
    """Waiting in its band's line (not dispatched, not ended)."""
    dead: bool = False
    """The client went away while it was queued: skip it when popped."""
    released: bool = False
    tried: list[UpstreamState] = field(default_factory=list)
    phase: Phase = Phase.UNSENT
    """How far it got (:mod:`~headway.core.policy.charges`): what its tenant pays."""
    output_events: int = 0
    """Streamed events relayed so far: the output seen when it ends early."""
    settled: bool = False
    """Its charge was settled (an expiry refunded it all): :meth:`GatewayCore.release`
    refunds nothing more."""


Outcome = tuple[Lease, UpstreamState | Shed]
"""A queued lease's settlement: dispatched to an upstream, or ended by a shed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreSettings:
    """What the core reads of the gateway's configuration."""

    admission: AdmissionConfig
    queues: QueueConfig
    fallback: FallbackConfig = field(default_factory=FallbackConfig)
    routes: Mapping[str, RouteView] = field(default_factory=dict)
    slot_shares: Mapping[str, float] = field(default_factory=dict)
    """Tenant name → its share of the slots (tenants not named: their queue weight)."""
    route_slot_shares: Mapping[str, float] = field(default_factory=dict)
    """Route name → the share of its upstreams' slots its lane may hold: a strict share of
    a pool shared by routes (seed 000: background work "in a separate or strictly
    controlled share"), a cap that is also a guarantee when the shares of the routes on
    the pool add up to at most 1. Routes not named: every slot of their upstreams."""
    tenant_slot_headroom: float | None = 1.0
    """Slot shares on (a tenant's cap is its share × this), or None: off."""
    tenant_active_s: float = 2.0
    """A tenant seen this recently counts as active for the slot shares."""
    measure_speeds: bool = True
    """Refine the speed estimate from answers (else the prior alone)."""
    kv_blocks_per_upstream: int = 1_000_000
    release_guard: ReleaseGuardConfig = field(default_factory=ReleaseGuardConfig)
    """When a release whose errors or latency spike is routed back
    (:mod:`~headway.core.policy.releases`)."""
    degraded: DegradedConfig = field(default_factory=DegradedConfig)
    """Degraded modes per band (:mod:`~headway.core.policy.degraded`)."""


class GatewayCore:
    """Admission, queues, slots, shares and routing, on the ``now`` it is given."""

    def __init__(
        self,
        settings: CoreSettings,
        source: UpstreamSource,
        *,
        speed_prior: SpeedPrior | None = None,
        budgets: BudgetSeam | None = None,
        router: Router | None = None,
    ) -> None:
        """``router``: the routing policy over the upstreams' load views (None: least
        outstanding requests, the live gateway's; the simulator passes its cluster's)."""
        self.settings = settings
        self.source = source
        self.budgets = budgets
        self.admission = AdmissionPolicy(self._local(settings.admission))
        self.queues: PriorityQueues[Lease] = PriorityQueues(settings.queues)
        """The line of requests bound for no route (every upstream serves them)."""
        self._lanes: dict[str | None, PriorityQueues[Lease]] = {None: self.queues}
        """Per route, its own line (seed 000: separate queues for unlike work): a route
        whose upstreams are full holds back its own requests, never another route's."""
        self._lane_running: dict[str | None, dict[str, int]] = {None: dict.fromkeys(BANDS, 0)}
        """Per lane, its dispatched requests per band (the lane's band reserves count them
        against the slots of the upstreams serving its route)."""
        self.fallback = FallbackPolicy(settings.fallback)
        self.releases = ReleaseGuard(settings.release_guard)
        """Which release unpinned calls avoid (seed 003: route to the previous release
        when the current one's errors spike)."""
        self.modes = DegradedModes(settings.degraded)
        """Which degraded modes are on (seed 002: shorten output or context, shed optional
        work, only under an explicit mode)."""
        self.router = router or Router("least_outstanding_requests")
        self.speed_prior = speed_prior
        self.speeds = ServiceSpeeds(speed_prior)
        """The prefill speed and TPOT admission predicts with: the prior, refined by the
        answers (:meth:`observe_whole`, :meth:`observe_stream`)."""
        self.running: dict[str, int] = dict.fromkeys(BANDS, 0)
        self.in_flight: dict[str, int] = {}
        self.slots = TenantSlots(
            settings.slot_shares, self.queues.config.weight,
            headroom=settings.tenant_slot_headroom, active_s=settings.tenant_active_s,
        )  # fmt: skip
        """The tenants' slot shares (dispatched requests per tenant, who is active)."""
        self.completions = CompletionRates()
        self._outcomes: list[Outcome] = []
        self.expired = 0
        self.skipped_dead = 0
        self.capped = 0
        """Requests admission would have dispatched at once, queued instead because their
        tenant held its slot share (those already queued are passed over in :meth:`pump`)."""
        self.draining = False
        """Shutting down: new requests are refused (``draining``); queued and dispatched
        ones finish."""

    def reconfigure(
        self, now: float, settings: CoreSettings, speed_prior: SpeedPrior | None
    ) -> None:
        """Swap in ``settings``: admission (tenant budgets), queue settings and fallback take
        effect for the next decision; queued and dispatched requests keep their places
        and slots (see the policies' ``reconfigure``). A changed prior restarts the speed
        estimate."""
        if speed_prior != self.speed_prior:
            self.speed_prior = speed_prior
            self.speeds = ServiceSpeeds(speed_prior)
        self.admission.reconfigure(now, self._local(settings.admission))
        for lane in self._lanes.values():
            lane.reconfigure(settings.queues)
        self.slots.shares = dict(settings.slot_shares)
        self.slots.headroom = settings.tenant_slot_headroom
        self.slots.active_s = settings.tenant_active_s
        self.fallback = FallbackPolicy(settings.fallback)
        self.releases.config = settings.release_guard
        self.modes.reconfigure(settings.degraded)
        self.settings = settings
        self.pump(now)

    def _local(self, admission: AdmissionConfig) -> AdmissionConfig:
        """What local admission applies: with a shared budget, which holds the tenants'
        token buckets, the rest of ``admission``."""
        if self.budgets is None:
            return admission
        tenants = {
            t: msgspec.structs.replace(lim, token_rate_per_s=None)
            for t, lim in admission.tenants.items()
        }
        return msgspec.structs.replace(admission, tenants=tenants)

    def outcomes(self) -> list[Outcome]:
        """The queued leases settled since the last call (dispatched or shed), in order
        (not one :meth:`offer` returned dispatched: its caller reads that off the lease)."""
        out, self._outcomes = self._outcomes, []
        return out

    def next_timer_s(self, now: float) -> float | None:
        """When :meth:`on_timer` must next run, after ``now`` (None: no time-driven change
        is pending): the earliest deadline of a queued lease and, while any lease waits,
        the first time the slot caps change by a tenant's last arrival ageing out or an
        ejected upstream comes back into rotation (either may let a queued lease go with
        no other event)."""
        deadlines = [d for q in self._lanes.values() if (d := q.next_deadline_s()) is not None]
        deadline_s = min(deadlines, default=None)
        if not self.queued_requests():
            return deadline_s
        times = [] if deadline_s is None else [deadline_s]
        change_s = self.slots.next_change_s(now, self.in_flight)
        if change_s is not None:
            times.append(change_s)
        times.extend(u.down_until_s for u in self.source.upstreams() if u.down_until_s > now)
        return min(times, default=None)

    def on_timer(self, now: float) -> None:
        """The driver's timer (armed from :meth:`next_timer_s`): expire what waited past
        its deadline, then dispatch what a cap or an ejection no longer holds back."""
        self.expire(now)
        self.pump(now)

    # -- lanes -------------------------------------------------------------------------------

    def lane(self, route: str | None) -> PriorityQueues[Lease]:
        """The line of requests bound for ``route`` (made on first use)."""
        lane = self._lanes.get(route)
        if lane is None:
            lane = self._lanes[route] = PriorityQueues(self.settings.queues)
            self._lane_running[route] = dict.fromkeys(BANDS, 0)
        return lane

    def oldest_wait_by_route(self, now: float) -> dict[str | None, float]:
        """Per lane (its route), how long its oldest waiting request has waited."""
        return {route: lane.oldest_wait_s(now) for route, lane in self._lanes.items()}

    def queued_requests(self) -> int:
        """Requests waiting in every lane."""
        return sum(len(q) for q in self._lanes.values())

    def lane_slots(self, now: float, route: str | None) -> int:
        """Dispatch slots of the ready upstreams that serve ``route``, times its strict
        share where it has one (rounded down)."""
        return self._shared(route, sum(u.slots for u in self.ready_for(now, route)))

    def ready_for(self, now: float, route: str | None) -> list[UpstreamState]:
        """The upstreams routable at ``now`` that serve ``route``."""
        return [u for u in self.source.upstreams() if u.ready_at(now) and _serves(u, route)]

    def _shared(self, route: str | None, slots: int) -> int:
        """``slots`` times ``route``'s strict share, if it has one."""
        share = None if route is None else self.settings.route_slot_shares.get(route)
        return slots if share is None else int(share * slots)

    # -- state -----------------------------------------------------------------------------

    def total_slots(self, now: float) -> int:
        """Dispatch slots of the ready upstreams."""
        return sum(u.slots for u in self.source.upstreams() if u.ready_at(now))

    def _route(
        self,
        now: float,
        lease: Lease,
        exclude: Sequence[UpstreamState] = (),
        *,
        fit: bool = False,
    ) -> int | None:
        """The upstream the router picks for ``lease`` among those ready, with a free
        slot, serving its route and not in ``exclude``. ``fit`` is token-aware dispatch
        (a queued lease): only where its projected KV blocks are unpromised, or nothing
        is dispatched (so a request larger than a whole pool still runs)."""
        ups = self.source.upstreams()
        avoid = self._avoided_releases(now, lease)
        loads = [
            ReplicaLoad(
                outstanding_requests=u.outstanding_requests,
                outstanding_tokens=u.outstanding_tokens,
                free_kv_blocks=u.free_kv_blocks,
                waiting_requests=u.waiting_requests,
                revision=u.revision,
                ready=u.ready_at(now)
                and u.outstanding_requests < u.slots
                and u not in exclude
                and _serves(u, lease.route)
                and (not avoid or u.revision not in avoid)
                and (not fit or u.outstanding_requests == 0 or lease.blocks <= u.free_kv_blocks),
            )
            for u in ups
        ]
        request = RouteRequest(
            prompt_tokens=lease.prompt_tokens,
            expected_output_tokens=lease.expected_output_tokens,
            projected_kv_blocks=lease.blocks,
            revision=lease.revision,
        )
        return self.router.route(now, request, loads)

    def _avoided_releases(self, now: float, lease: Lease) -> frozenset[str]:
        """The releases ``lease`` avoids: the routed-back ones, unless it is pinned to a
        revision or no ready upstream of its route serves another release."""
        avoid = self.releases.avoided(now)
        if not avoid or lease.revision is not None:
            return frozenset()
        if any(u.revision not in avoid for u in self.ready_for(now, lease.route)):
            return avoid
        return frozenset()

    def observe_attempt(
        self, now: float, upstream: UpstreamState, *, error: bool, first_byte_s: float | None
    ) -> list[ReleaseChange]:
        """An attempt on ``upstream`` ended: an ``error`` (its engine's 5xx or a broken
        connection; not a client's mistake nor an overload refusal), or answered after
        ``first_byte_s``. Returns the releases routed back or returned by it (the driver
        logs and counts them); a release routed back takes no unpinned call from now."""
        self.releases.observe(now, upstream.revision, error=error, first_byte_s=first_byte_s)
        changes = self.releases.changes()
        if any(not c.routed_back for c in changes):
            self.pump(now)  # a release back in traffic may take what waits
        return changes

    def route_health(self, now: float, route: str | None) -> float:
        """Ready upstreams of ``route`` / its upstreams (0 when none serves it)."""
        ups = [u for u in self.source.upstreams() if _serves(u, route)]
        return sum(1 for u in ups if u.ready_at(now)) / len(ups) if ups else 0.0

    def choose_route(self, now: float, route: str) -> tuple[str, NoFallback | None]:
        """The route a call for ``route`` goes to: its own while any of its upstreams is
        routable, else the fallback the core policy allows (the reason when none)."""
        if self.route_health(now, route) > 0:
            return route, None
        routes = self.settings.routes
        health = {name: self.route_health(now, name) for name in routes}
        decision = self.fallback.choose(now, route, routes, health)
        if isinstance(decision, UseFallback):
            return decision.route, None
        return route, decision

    def snapshot(
        self, now: float, request: AdmissionRequest, route: str | None = None
    ) -> LoadSnapshot:
        """The load admission reads for ``request`` (bound for ``route``) at ``now``."""
        ups = self.source.upstreams()
        ready = self.ready_for(now, route)
        total = self._shared(route, sum(u.slots for u in ready))
        lane = self.lane(route)
        if total > lane.config.reserved_slots(total):
            running = self._lane_running[route]
            by_band = lane.free_slots_by_band(total_slots=total, running=running)
            free_slots: dict[str, int] = dict(by_band.items())
        else:
            free_slots = {}
        best = max(ready, key=lambda u: u.free_kv_blocks, default=None)
        tenants = {
            t: TenantLoad(
                in_flight_requests=n, completions_per_s=self.completions.rate_per_s(now, t)
            )
            for t, n in self.in_flight.items()
            if n
        }
        return LoadSnapshot(
            queues=lane.statistics(now),
            free_slots=free_slots,
            free_kv_blocks=best.free_kv_blocks if best else 0,
            total_kv_blocks=(
                best.total_kv_blocks if best else self.settings.kv_blocks_per_upstream
            ),
            tenants=tenants,
            prefill_tokens_per_s=self.speeds.prefill_tokens_per_s,
            tpot_s=self.speeds.tpot_s,
            dispatch_slots=total,
            draining=self.draining,
            downstream_health=1.0 if ready else 0.0,
            downstream_next_probe_s=None
            if ready
            else min((u.down_until_s for u in ups if u.down_until_s > now), default=None),
        )

    def observe_whole(self, prompt_tokens: int, output_tokens: int, duration_s: float) -> None:
        """A whole answer took ``duration_s`` from its dispatch (with ``measure_speeds``)."""
        if self.settings.measure_speeds:
            self.speeds.observe_whole(prompt_tokens, output_tokens, duration_s)

    def observe_stream(
        self, prompt_tokens: int, output_tokens: int, first_token_s: float, duration_s: float
    ) -> None:
        """A streamed answer: its first and last token, seconds after its dispatch."""
        if self.settings.measure_speeds:
            self.speeds.observe_stream(prompt_tokens, output_tokens, first_token_s, duration_s)

    # -- degraded modes ---------------------------------------------------------------------

    def pressure(self, now: float) -> PressureReading:
        """The gateway's pressure now: the oldest wait over every lane, and dispatched
        requests over the ready upstreams' slots (1 when none is ready and work waits)."""
        delay_s = max((q.oldest_wait_s(now) for q in self._lanes.values()), default=0.0)
        busy = sum(self.running.values())
        total = self.total_slots(now)
        if total:
            utilization = min(1.0, busy / total)
        else:
            utilization = 1.0 if busy or self.queued_requests() else 0.0
        return PressureReading(queue_delay_s=delay_s, slot_utilization=utilization)

    def degrade(
        self, now: float, request: AdmissionRequest, *, optional: bool = False
    ) -> tuple[AdmissionRequest | Shed, Degradation | None]:
        """Apply the degraded mode of ``request``'s band, if on (entering or leaving the
        modes on the pressure now; :meth:`DegradedModes.changes` has what changed): the
        request as it will be offered (its output capped, its prompt trimmed), or the
        shed of an ``optional`` request; and what changed (None: nothing). Both drivers
        call it before :meth:`offer_on_route`."""
        modes = self.modes
        if not modes.config.modes:
            return request, None
        modes.update(now, self.pressure(now))
        got = modes.degrade(
            now,
            request.priority,
            max_tokens=request.max_tokens,
            prompt_tokens=request.prompt_tokens,
            optional=optional,
        )
        if got is None:
            return request, None
        if got.shed:
            detail = f"degraded mode {got.mode!r} is on and sheds optional requests"
            return Shed(ShedReason.DEGRADED_OPTIONAL, got.retry_after_s, detail), got
        cap, limit = got.max_tokens, got.context_tokens
        expected = request.expected_output_tokens
        changed = dataclasses.replace(
            request,
            max_tokens=request.max_tokens if cap is None else cap,
            p95_output_tokens=request.p95_output_tokens
            if cap is None
            else min(cap, request.p95_output_tokens),
            expected_output_tokens=expected
            if cap is None or expected is None
            else min(cap, expected),
            prompt_tokens=request.prompt_tokens
            if limit is None
            else min(limit, request.prompt_tokens),
        )
        return changed, got

    # -- per-tenant slot shares -------------------------------------------------------------

    @property
    def dispatched_by(self) -> dict[str, int]:
        """Dispatched (slot-holding) requests per tenant."""
        return self.slots.held

    def slot_caps(self, now: float, total: int) -> dict[str, int] | None:
        """Most slots each active tenant may hold now (:meth:`TenantSlots.caps`)."""
        return self.slots.caps(now, self.in_flight, total)

    # -- offer / dispatch / release --------------------------------------------------------

    def offer(
        self,
        now: float,
        request: AdmissionRequest,
        revision: str | None = None,
        route: str | None = None,
    ) -> Shed | Lease:
        """Decide on one request now: a shed, or a lease (dispatched, or queued) to an
        upstream of ``revision`` and ``route`` (None: any)."""
        self.slots.seen(now, request.tenant)
        if self.budgets is not None:
            refused = self.budgets.check(now, request.tenant, request.cost_tokens)
            if refused is not None:
                burst = self.settings.admission.limits(request.tenant).burst_tokens
                if (
                    refused.retry_after_s is None
                    and not refused.client_backoff
                    and burst is not None
                ):
                    # It can never fit the tenant's bucket: the core's reason and fix.
                    detail = self.admission.over_budget_detail(request, burst)
                    refused = dataclasses.replace(refused, detail=detail)
                return refused
        decision = self.admission.decide(now, request, self.snapshot(now, request, route))
        if isinstance(decision, Shed):
            self._give_back(now, request.tenant, request.cost_tokens)
            return decision
        lease = Lease(
            tenant=request.tenant,
            band=request.priority,
            cost_tokens=request.cost_tokens,
            blocks=self.admission.projected_kv_blocks(request),
            revision=revision,
            deadline_s=request.deadline_s,
            route=route,
            prompt_tokens=request.prompt_tokens,
            expected_output_tokens=request.expected_output_tokens or 0,
        )
        if isinstance(decision, Admit):
            capped = self.slots.at_cap(self.slot_caps(now, self.total_slots(now)), request.tenant)
            index = None if capped else self._route(now, lease)
            self.capped += capped
            if index is not None:
                self._dispatch(lease, self.source.upstreams()[index])
                self._count_in(request.tenant)
                return lease
            decision = Enqueue(request.priority)  # no upstream free for its revision: wait
        assert isinstance(decision, Enqueue)
        refused = self.admission.enqueue(now, self.lane(route), lease, request, decision)
        if refused is not None:
            self._give_back(now, request.tenant, request.cost_tokens)
            return refused
        self._count_in(request.tenant)
        lease.queued = True
        if self.settings.tenant_slot_headroom is not None:
            # Slots may be free while a capped tenant's requests wait ahead of this one.
            self.pump(now)
            if lease.upstream is not None:  # that pump dispatched it: the caller reads it
                self._outcomes = [o for o in self._outcomes if o[0] is not lease]
        return lease

    def offer_on_route(
        self,
        now: float,
        request: AdmissionRequest,
        route: str | None,
        revision: str | None = None,
    ) -> tuple[str | None, Shed | Lease]:
        """:meth:`offer` on the route a call for ``route`` goes to (:meth:`choose_route`:
        its own, or the fallback the core policy allows): that route, and the decision
        there. A shed for want of upstreams names why no fallback was allowed. Both
        drivers offer through here (the live one rewrites the body's ``model`` when the
        route changed)."""
        no_fallback = None
        if route is not None:
            route, no_fallback = self.choose_route(now, route)
        got = self.offer(now, request, revision, route)
        if (
            no_fallback is not None
            and isinstance(got, Shed)
            and got.reason is ShedReason.DOWNSTREAM_UNHEALTHY
        ):
            got = dataclasses.replace(
                got, detail=f"{got.detail}; no fallback: {no_fallback.detail}"
            )
        return route, got

    def _count_in(self, tenant: str) -> None:
        self.in_flight[tenant] = self.in_flight.get(tenant, 0) + 1
        if self.budgets is not None:
            self.budgets.add_in_flight(tenant, 1)

    def _give_back(self, now: float, tenant: str, tokens: float) -> None:
        if self.budgets is not None and tokens > 0:
            self.budgets.give_back(tenant, tokens, now)

    def _dispatch(self, lease: Lease, upstream: UpstreamState) -> None:
        self.running[lease.band] += 1
        self._lane_running[lease.route][lease.band] += 1
        self.slots.took(lease.tenant)
        lease.upstream = upstream
        upstream.outstanding_requests += 1
        upstream.outstanding_tokens += lease.cost_tokens
        upstream.projected_blocks += lease.blocks
        if lease.queued:
            lease.queued = False
            self._outcomes.append((lease, upstream))

    def reroute(self, now: float, lease: Lease) -> UpstreamState | None:
        """Move a dispatched lease to another ready upstream (a retry before the first
        byte); None when none is free."""
        assert lease.upstream is not None
        lease.tried.append(lease.upstream)
        index = self._route(now, lease, exclude=lease.tried)
        if index is None:
            return None
        self._unload(lease)
        new = self.source.upstreams()[index]
        lease.upstream = new
        new.outstanding_requests += 1
        new.outstanding_tokens += lease.cost_tokens
        new.projected_blocks += lease.blocks
        return new

    def requeue(self, now: float, lease: Lease) -> None:
        """Give a dispatched lease's slot back and put it at the front of its line (a
        retry before the first byte when no other upstream is free: it waits for the
        next slot, as if it had never been dispatched, until its deadline); it is settled
        like any queued lease (:meth:`outcomes`)."""
        assert lease.upstream is not None
        self._unload(lease)
        lease.upstream = None
        self.running[lease.band] -= 1
        self._lane_running[lease.route][lease.band] -= 1
        self.slots.gave_back(lease.tenant)
        self.lane(lease.route).push(
            now, lease, band=lease.band, tenant=lease.tenant, cost_tokens=lease.cost_tokens,
            deadline_s=lease.deadline_s, front=True,
        )  # fmt: skip
        lease.queued = True
        self.pump(now)

    def _unload(self, lease: Lease) -> None:
        up = lease.upstream
        if up is not None:
            up.outstanding_requests -= 1
            up.outstanding_tokens -= lease.cost_tokens
            up.projected_blocks -= lease.blocks

    def release(
        self, now: float, lease: Lease, *, completed: bool = False, unused_tokens: int = 0
    ) -> None:
        """The request ended (served, failed, cancelled): free its slot, refund unused
        budget, and dispatch what the queues let go next. Idempotent."""
        if lease.released:
            return
        lease.released = True
        if lease.upstream is not None:
            self._unload(lease)
            self.running[lease.band] -= 1
            self._lane_running[lease.route][lease.band] -= 1
            self.slots.gave_back(lease.tenant)
        elif not self.lane(lease.route).withdraw(lease, lease.band, lease.tenant):
            lease.dead = True  # not found waiting (a race with a pop): skipped when popped
        lease.queued = False
        self.in_flight[lease.tenant] -= 1
        if self.budgets is not None:
            self.budgets.add_in_flight(lease.tenant, -1)
        if completed:
            self.completions.add(now, lease.tenant)
        if unused_tokens > 0 and not lease.settled:
            lease.settled = True
            self.admission.refund(now, lease.tenant, unused_tokens)
            self._give_back(now, lease.tenant, unused_tokens)
        self.pump(now)

    def end(self, now: float, lease: Lease, phase: Phase, output_tokens: int | None) -> None:
        """The request ended in ``phase`` (:mod:`~headway.core.policy.charges`), having
        produced ``output_tokens`` (None: unknown): its tenant is refunded what the
        charging rule says it did not use, and :meth:`release` frees the rest."""
        unused = unused_tokens(
            phase,
            cost_tokens=lease.cost_tokens,
            prompt_tokens=lease.prompt_tokens,
            output_tokens=output_tokens,
        )
        self.release(now, lease, completed=phase is Phase.COMPLETED, unused_tokens=unused)

    def pump(self, now: float) -> None:
        """Dispatch queued requests while slots and upstreams are free, lane by lane (a
        route's line is held back only by its own upstreams). Token-aware: the request
        a line's order picks goes only to an upstream with unpromised KV blocks for its
        projection; else it keeps its place and nothing in its line overtakes it."""
        waiting = [(route, lane) for route, lane in self._lanes.items() if len(lane)]
        all_slots = self.total_slots(now) if waiting else 0
        if all_slots > 0:
            eligible = self.slots.eligible(self.slot_caps(now, all_slots))
            for route, lane in waiting:  # a lane's pump takes from that lane only
                self._pump_lane(now, route, lane, eligible)
        self.expire(now)

    def _pump_lane(
        self,
        now: float,
        route: str | None,
        lane: PriorityQueues[Lease],
        eligible: Callable[[str], bool] | None,
    ) -> None:
        total = self.lane_slots(now, route)
        if total <= lane.config.reserved_slots(total):
            return
        running = self._lane_running[route]
        picked: list[int] = []

        def fits(queued: Queued[Lease]) -> bool:
            lease = queued.item
            if lease.dead:
                return True  # popped to be dropped
            index = self._route_queued(now, lease)
            if index is None:
                return False
            picked.append(index)
            return True

        while True:
            got = lane.try_pop(
                now, total_slots=total, running=running, fits=fits, eligible=eligible
            )
            if got is None:
                break
            lease = got.item
            if lease.dead:
                self.skipped_dead += 1
                continue
            self._dispatch(lease, self.source.upstreams()[picked[-1]])

    def _route_queued(self, now: float, lease: Lease) -> int | None:
        """Where a queued lease goes now (None: it waits). A retry waits for an upstream
        it has not failed on, unless none other is routable at all (full ones count: it
        waits for their slot)."""
        index = self._route(now, lease, exclude=lease.tried, fit=True)
        if index is None and lease.tried:
            others = [
                u for u in self.source.upstreams()
                if u.ready_at(now) and u not in lease.tried and _serves(u, lease.route)
            ]  # fmt: skip
            if not others:
                index = self._route(now, lease, fit=True)
        return index

    def expire(self, now: float) -> None:
        """End the queued requests whose deadline passed (EXPIRED, never sent)."""
        for lane in self._lanes.values():
            # Every lane, however short: entries past their deadline that a pop set
            # aside no longer count in its length, and still wait to be ended here.
            self._expire_lane(now, lane)

    def _expire_lane(self, now: float, lane: PriorityQueues[Lease]) -> None:
        gone_now = lane.expire(now)
        if not gone_now:
            return
        # When to come back: the time its band's line needs to drain, as admission says
        # for a full queue (capped like every Retry-After).
        bands = lane.statistics(now).bands
        cap_s = self.admission.config.max_retry_after_s
        for gone in gone_now:
            lease = gone.item
            if lease.dead:
                continue
            self.expired += 1
            lease.settled = True  # release() must not refund it a second time
            self.admission.refund(now, lease.tenant, lease.cost_tokens)
            self._give_back(now, lease.tenant, lease.cost_tokens)
            if lease.queued:
                lease.queued = False
                retry_s = bands[gone.band].time_to_drain_s(max_s=cap_s)
                self._outcomes.append(
                    (
                        lease,
                        Shed(ShedReason.EXPIRED, retry_s, "its deadline passed while it waited"),
                    )
                )

    def queued_by(self, now: float) -> tuple[dict[str, int], dict[str, int]]:
        """Queue depth per band and per tenant (the live ones, for metrics)."""
        bands: dict[str, int] = {}
        tenants: dict[str, int] = {}
        for lane in self._lanes.values():
            stats = lane.statistics(now)
            for b, st in stats.bands.items():
                bands[b] = bands.get(b, 0) + st.queued_requests
            for t, st in stats.tenants.items():
                tenants[t] = tenants.get(t, 0) + st.queued_requests
        return bands, tenants


def _serves(upstream: UpstreamState, route: str | None) -> bool:
    """Whether ``upstream`` takes calls for ``route`` (None: any call)."""
    if route is None:
        return True
    if upstream.routes is not None:
        return route in upstream.routes
    return upstream.route is None or upstream.route == route
