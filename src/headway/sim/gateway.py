"""The simulated gateway: the live gateway's core between task calls and the replicas.

Every call a task sends is *offered* here first. What happens next depends on the preset:

* ``fifo-unbounded`` (the default): nothing: every call goes to the router at once and
  the engines queue internally. This is the simulator without a gateway, kept exactly
  (the simulator does not even build a :class:`SimGateway` for it).
* ``headway-default``: the :class:`~headway.core.gateway_core.GatewayCore` the live
  gateway runs, on virtual time, with one upstream per replica. It dispatches a call now
  (to the replica its router picks), queues it in
  :class:`~headway.core.policy.queues.PriorityQueues` until a dispatch slot frees (or its
  deadline passes: ``timed_out``, the lifecycle's word for the live ``expired``), or sheds
  it with the reason and ``retry_after_s``.

Nothing here decides: the core does, as it does live (``headway simulate`` predicts what
``headway gateway`` does because both run it). Dispatch slots bound what the gateway lets
through at once: ``slots_per_replica`` per ready replica, by default the engine's
``max_num_seqs`` (a request beyond that would only wait inside the engine, where no
deadline or priority can reach it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from headway.core.gateway_core import (
    CoreSettings,
    GatewayCore,
    Lease,
    StaticUpstreams,
    UpstreamState,
)
from headway.core.policy.admission import AdmissionConfig, AdmissionRequest
from headway.core.policy.charges import Phase
from headway.core.policy.decisions import Shed
from headway.core.policy.deferral import DeferralConfig
from headway.core.policy.degraded import DegradedConfig
from headway.core.policy.fallback import FallbackConfig, RouteView
from headway.core.policy.queues import QueueConfig
from headway.core.policy.speeds import SpeedPrior

__all__ = ["GatewayConfig", "GatewayPool", "GatewayPreset", "SimGateway"]

GatewayPreset = Literal["fifo-unbounded", "headway-default"]
"""``fifo-unbounded``: no gateway (engines queue everything); ``headway-default``: the
core admission policy and priority queues with their default settings."""


class GatewayConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``gateway:`` section of a cluster file."""

    preset: GatewayPreset = "fifo-unbounded"
    """Which gateway stands in front of the router."""

    admission: AdmissionConfig | None = None
    """Override the admission settings of ``headway-default`` (None: the defaults, with
    the engine's ``block_size``)."""

    queues: QueueConfig | None = None
    """Override the queue settings of ``headway-default`` (None: the defaults)."""

    slots_per_replica: int | None = None
    """Calls the gateway keeps dispatched per replica at once (None: from the SLO, the
    largest batch whose steady-state step keeps the tightest ``tpot_s`` objective, at
    most the engine's ``max_num_seqs``; see :mod:`headway.sim.presets`)."""

    tenant_budgets: Literal["shares", "hard-shares", "none"] = "shares"
    """``shares``: each tenant with a positive ``share`` in the workload gets a token
    budget of its share of the cluster's planned capacity
    (:func:`~headway.core.policy.budgets.share_budgets`), unless ``admission.tenants``
    names budgets itself; work-conserving: it binds only while another tenant waits, so
    a tenant may use capacity nobody else asks for. ``hard-shares``: the same budgets,
    binding even while the others are idle. ``none``: no tenant budgets beyond
    ``admission``'s."""

    tenant_slot_headroom: float | None = None
    """Per-tenant dispatch-slot shares, the live gateway's (its default is 1): while other
    tenants are active, a tenant holds at most ``ceil(its share / the active tenants'
    shares × slots × this)`` dispatched calls (its share: the workload tenant's ``share``
    when > 0, else its ``weight``), so a light tenant finds a slot beside a flood; alone,
    it may take every slot (:mod:`~headway.core.policy.slot_shares`, the same code).
    None (the simulator's default, for now): no per-tenant cap. Set 1 to predict a live
    gateway with its default; the shares reserve by share, not demand, so a bursty tenant
    of small share is queued beside idle slots at normal load
    (``tests/unit/sim/test_tenant_budgets.py`` sheds with it on)."""

    tenant_active_s: float = 2.0
    """A tenant counts as active while it has calls queued or in flight, and this long
    after its last call arrived."""

    cancel_at_deadline: bool = True
    """Cancel a dispatched call in its replica when its deadline (its task's, or its
    class's ``e2e_s``) passes, freeing its KV blocks and its slot, as the live gateway
    cancels the upstream call (False: it runs to its end, late)."""

    receipts: DeferralConfig | None = None
    """Asynchronous receipts, the live gateway's ``receipts`` decision (the core's
    :func:`~headway.core.policy.deferral.should_defer`): a shed call of a ``deferrable``
    band is deferred instead; it is offered again in ``background`` after the shed's
    Retry-After (and again after each further shed), its deadline the end of
    ``retention_s``, its client's patience off (it holds a receipt). None: none."""

    degraded: DegradedConfig | None = None
    """Degraded modes, the live gateway's ``degraded`` section (the core's
    :mod:`~headway.core.policy.degraded`): while a band's mode is on, its calls' output
    is capped at ``max_tokens`` (a call's output is the least of its own and the cap),
    their prompts trimmed to ``context_tokens``, and calls of ``optional`` workload
    classes shed. None: none."""

    capacity_tokens_per_s: float | None = None
    """The planned capacity the ``shares`` budgets divide, in charged tokens (prompt plus
    planned output) per second (None: the replicas' saturation throughput for the
    workload's mean call, from the engine model, times its ``planning.planning_factor``)."""

    def __post_init__(self) -> None:
        if self.slots_per_replica is not None and self.slots_per_replica < 1:
            raise ValueError(
                f"`slots_per_replica` must be >= 1 (got {self.slots_per_replica}); "
                "omit it to use the engine's max_num_seqs"
            )
        headroom = self.tenant_slot_headroom
        if headroom is not None and not (math.isfinite(headroom) and headroom > 0):
            raise ValueError(
                f"`tenant_slot_headroom` must be > 0 (got {headroom}); use 1, or null for no cap"
            )
        if not (math.isfinite(self.tenant_active_s) and self.tenant_active_s >= 0):
            raise ValueError(f"`tenant_active_s` must be >= 0 (got {self.tenant_active_s}); use 2")
        capacity = self.capacity_tokens_per_s
        if capacity is not None and not (math.isfinite(capacity) and capacity > 0):
            raise ValueError(
                f"`capacity_tokens_per_s` must be a positive number (got {capacity}); omit "
                "it to plan the capacity from the engine model"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayPool:
    """One pool of the cluster as the simulated gateway sees it."""

    replicas: int
    routes: frozenset[str]
    kv_blocks_per_replica: int
    slots_per_replica: int | None = None
    """None: the gateway's ``slots_per_replica``."""
    shares: Mapping[str, float] = field(default_factory=dict)
    """Route → its strict share of the pool's slots (``pools.<name>.shares``)."""


class SimGateway:
    """The ``headway-default`` gateway on virtual time: the live gateway's
    :class:`~headway.core.gateway_core.GatewayCore`, one upstream per replica.

    The simulator (:mod:`headway.sim.offers`) offers each call to :attr:`core`, ends it
    there with :meth:`GatewayCore.end <headway.core.gateway_core.GatewayCore.end>`, pumps
    it when slots may have freed, and delivers the core's outcomes (a queued call
    dispatched, or expired) as events. Every decision is the core's: admission, queues,
    slot shares, routing (the cluster's router over the core's load views), token-aware
    dispatch, the KV projection, the speed estimate, charges and refunds.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        num_replicas: int,
        max_num_seqs: int,
        block_size: int,
        kv_blocks_per_replica: int = 1_000_000,
        speed_prior: SpeedPrior | None = None,
        slot_shares: Mapping[str, float] | None = None,
        pools: Sequence[GatewayPool] = (),
        routes: Mapping[str, RouteView] | None = None,
        fallback: FallbackConfig | None = None,
    ) -> None:
        """``kv_blocks_per_replica``: each replica's KV pool, the blocks the core
        projects calls into. ``speed_prior``: the speeds admission predicts with before a
        call completes (the live gateway's engine-model prior; None: no prediction until
        then). ``slot_shares``: each tenant's share of the dispatch slots (unnamed: its
        queue weight). ``pools``: the cluster's pools, in replica order (their replicas
        add up to ``num_replicas``): each replica's upstream serves its pool's routes
        only, with its pool's slots and KV blocks, and a route's strict ``share`` of its
        pool's slots bounds its lane. ``routes`` and ``fallback``: the workload's routes
        and the cluster's fallback settings, for the core's fallback policy (a route
        whose pool has nothing routable). The simulator hands the core its cluster's
        router."""
        if config.preset != "headway-default":
            raise ValueError(
                f"SimGateway implements the 'headway-default' preset, not {config.preset!r}; "
                "'fifo-unbounded' needs no gateway object"
            )
        self.config = config
        per_replica = config.slots_per_replica or max_num_seqs
        self.slots_per_replica = per_replica
        self.kv_blocks_per_replica = kv_blocks_per_replica
        queues = config.queues or QueueConfig()
        total = num_replicas * per_replica
        reserved = queues.reserved_slots(total)
        if total <= reserved:
            raise ValueError(
                f"gateway: {num_replicas} replicas × {per_replica} slots = {total} "
                f"slots must exceed queues.critical_reserved_slots ({reserved}); raise "
                "slots_per_replica or lower the reserve"
            )
        self._shapes: list[tuple[int, int, frozenset[str] | None]] = [
            (pool.slots_per_replica or per_replica, pool.kv_blocks_per_replica, pool.routes)
            for pool in pools
            for _ in range(pool.replicas)
        ]
        """Per replica with a pool: its upstream's slots, KV blocks and routes."""
        route_shares = {route: f for pool in pools for route, f in pool.shares.items()}
        for pool in pools:
            slots = pool.replicas * (pool.slots_per_replica or per_replica)
            for route, share in pool.shares.items():
                if int(share * slots) <= queues.reserved_slots(int(share * slots)):
                    raise ValueError(
                        f"gateway: route {route!r} has a {share:g} share of its pool's "
                        f"{slots} slots, {int(share * slots)} slots, which must exceed "
                        "queues.critical_reserved_slots; raise its share or the pool's "
                        "replicas, or lower the reserve"
                    )
        self.upstreams = StaticUpstreams([])
        self._index: dict[int, int] = {}
        self.set_ready([True] * num_replicas)
        settings = CoreSettings(
            admission=config.admission or AdmissionConfig(block_size=block_size),
            queues=queues,
            slot_shares=dict(slot_shares or {}),
            tenant_slot_headroom=config.tenant_slot_headroom,
            tenant_active_s=config.tenant_active_s,
            kv_blocks_per_upstream=kv_blocks_per_replica,
            route_slot_shares=route_shares,
            routes=dict(routes or {}),
            fallback=fallback or FallbackConfig(),
            degraded=config.degraded or DegradedConfig(),
        )
        self.core = GatewayCore(settings, self.upstreams, speed_prior=speed_prior)

    def set_ready(self, ready: Sequence[bool]) -> None:
        """Which replicas take calls now (one flag per replica; a new replica gets a new
        upstream): a lost, starting or draining one is not routed to."""
        states = self.upstreams.states
        for i in range(len(states), len(ready)):
            slots, blocks, routes = (
                self._shapes[i]
                if i < len(self._shapes)
                else (self.slots_per_replica, self.kv_blocks_per_replica, None)
            )
            state = UpstreamState(
                url=f"sim://replica/{i}", slots=slots, total_kv_blocks=blocks, routes=routes
            )
            states.append(state)
            self._index[id(state)] = i
        for state, flag in zip(states, ready, strict=True):
            state.healthy = flag

    def replica_of(self, upstream: UpstreamState) -> int:
        """The replica index of one of the core's upstreams."""
        return self._index[id(upstream)]

    def offer(
        self, now: float, request: AdmissionRequest, item: int, route: str | None = None
    ) -> tuple[str | None, Shed | Lease]:
        """The core's decision on one attempt (``item``: the simulator's attempt code) of
        a call for ``route`` (None: no pools): the route it goes to (its own, or the
        fallback the core allows when its pool has nothing routable), and a shed, or a
        lease dispatched (its ``upstream`` set: :meth:`replica_of`) or queued (settled
        later: :meth:`settled`)."""
        chosen, lease = self.core.offer_on_route(now, request, route)
        if isinstance(lease, Lease):
            lease.item = item
        return chosen, lease

    def end(self, now: float, lease: Lease, phase: Phase, output_tokens: int | None) -> None:
        """An admitted or queued attempt ended in ``phase``: the core settles its charge,
        frees its slot and its projected blocks, and dispatches what may go next."""
        self.core.end(now, lease, phase, output_tokens)

    def pump(self, now: float) -> None:
        """Dispatch what the queues let go; expire what waited past its deadline."""
        self.core.pump(now)

    def next_timer_s(self, now: float) -> float | None:
        """When :meth:`on_timer` must next run (:meth:`GatewayCore.next_timer_s
        <headway.core.gateway_core.GatewayCore.next_timer_s>`; the live driver arms its
        one timer from the same value)."""
        return self.core.next_timer_s(now)

    def on_timer(self, now: float) -> None:
        """The timer: end what waited past its deadline, dispatch what a slot cap or an
        ejection no longer holds back."""
        self.core.on_timer(now)

    def settled(self) -> list[tuple[Lease, int | Shed]]:
        """The queued attempts the core settled since the last call, in order: each to
        the replica it was dispatched to, or to the shed that ended it (``expired``)."""
        return [
            (lease, outcome if isinstance(outcome, Shed) else self._index[id(outcome)])
            for lease, outcome in self.core.outcomes()
        ]
