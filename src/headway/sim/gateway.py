"""The simulated gateway: the core overload policies between task calls and the router.

Every call a task sends is *offered* here first. What happens next depends on the preset:

* ``fifo-unbounded`` (the default): nothing: every call goes to the router at once and
  the engines queue internally. This is the simulator without a gateway, kept exactly
  (the simulator does not even build a :class:`SimGateway` for it).
* ``headway-default``: :meth:`AdmissionPolicy.decide
  <headway.core.policy.admission.AdmissionPolicy.decide>` on arrival, with a
  :class:`~headway.core.policy.admission.LoadSnapshot` the simulator builds from its
  replicas. ``Admit`` dispatches now; ``Enqueue`` waits in
  :class:`~headway.core.policy.queues.PriorityQueues` until a dispatch slot frees (or its
  deadline passes: ``timed_out``); ``Shed`` ends the call as ``shed`` with the reason and
  ``retry_after_s``.

The policy objects are the same ones the live gateway calls; this module only feeds them
virtual time and the simulator's state, and never decides anything itself. Dispatch slots
bound what the gateway lets through at once: ``replicas × slots_per_replica``, by default
the engine's ``max_num_seqs`` per replica (a request beyond that would only wait inside
the engine, where no deadline or priority can reach it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Literal

import msgspec

from headway.core.policy.admission import (
    AdmissionConfig,
    AdmissionPolicy,
    AdmissionRequest,
    LoadSnapshot,
    TenantLoad,
)
from headway.core.policy.charges import Phase, unused_tokens
from headway.core.policy.decisions import Admit, Decision, Enqueue, Shed
from headway.core.policy.queues import BANDS, Band, PriorityQueues, QueueConfig, Queued
from headway.core.policy.rates import CompletionRates
from headway.core.policy.slot_shares import TenantSlots
from headway.core.policy.speeds import ServiceSpeeds, SpeedPrior

__all__ = ["GatewayConfig", "GatewayPreset", "SimGateway"]

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


class SimGateway:
    """The ``headway-default`` gateway on virtual time: admission, queues, slots.

    The simulator offers each call with :meth:`offer`, tells it when a dispatched call
    leaves the replicas with :meth:`release`, and asks :meth:`pop` for queued calls
    whenever a slot may have freed and :meth:`expire` at queued deadlines. Items are the
    simulator's call indices.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        num_replicas: int,
        max_num_seqs: int,
        block_size: int,
        speed_prior: SpeedPrior | None = None,
        slot_shares: Mapping[str, float] | None = None,
    ) -> None:
        """``speed_prior``: the speeds admission predicts with before a call completes
        (the live gateway's engine-model prior; None: no prediction until then).
        ``slot_shares``: each tenant's share of the dispatch slots (unnamed: its queue
        weight)."""
        if config.preset != "headway-default":
            raise ValueError(
                f"SimGateway implements the 'headway-default' preset, not {config.preset!r}; "
                "'fifo-unbounded' needs no gateway object"
            )
        admission = config.admission or AdmissionConfig(block_size=block_size)
        self.config = config
        self.admission = AdmissionPolicy(admission)
        self.queues: PriorityQueues[int] = PriorityQueues(config.queues)
        per_replica = config.slots_per_replica or max_num_seqs
        self.slots_per_replica = per_replica
        self.total_slots = num_replicas * per_replica
        """Calls the gateway lets be dispatched (and unfinished) at once."""
        reserved = self.queues.config.reserved_slots(self.total_slots)
        if self.total_slots <= reserved:
            raise ValueError(
                f"gateway: {num_replicas} replicas × {per_replica} slots = {self.total_slots} "
                f"slots must exceed queues.critical_reserved_slots ({reserved}); raise "
                "slots_per_replica or lower the reserve"
            )
        self.running: dict[str, int] = dict.fromkeys(BANDS, 0)
        """Dispatched, unfinished calls per band (the leases the queues ask about)."""
        self.in_flight: dict[str, int] = {}
        """Per tenant: calls admitted or enqueued and not yet ended."""
        self.slots = TenantSlots(
            slot_shares or {}, self.queues.config.weight,
            headroom=config.tenant_slot_headroom, active_s=config.tenant_active_s,
        )  # fmt: skip
        """The tenants' slot shares, as the live gateway's core keeps them."""
        self.completions = CompletionRates()
        """Completed calls per second of each tenant, as the live gateway measures them."""
        self.speeds = ServiceSpeeds(speed_prior)
        """The prefill speed and TPOT admission predicts with, refined by completed calls
        (the live gateway's own measurement)."""

    def set_replicas(self, num_replicas: int) -> None:
        """The ready replicas changed (a loss, a scale-up or -down): so do the slots."""
        self.total_slots = num_replicas * self.slots_per_replica

    def snapshot(self, now: float, *, free_kv_blocks: int, total_kv_blocks: int) -> LoadSnapshot:
        """The load admission reads at ``now``: queue statistics and free slots from the
        queues, the KV state of the replica the router picked, and the speeds."""
        by_band = self.queues.free_slots_by_band(total_slots=self.total_slots, running=self.running)
        free_slots: dict[str, int] = dict(by_band.items())
        return LoadSnapshot(
            queues=self.queues.statistics(now),
            free_slots=free_slots,
            free_kv_blocks=free_kv_blocks,
            total_kv_blocks=total_kv_blocks,
            tenants={
                t: TenantLoad(
                    in_flight_requests=n, completions_per_s=self.completions.rate_per_s(now, t)
                )
                for t, n in self.in_flight.items()
                if n
            },
            prefill_tokens_per_s=self.speeds.prefill_tokens_per_s,
            tpot_s=self.speeds.tpot_s,
            dispatch_slots=self.total_slots,
        )

    def offer(
        self, now: float, call: int, request: AdmissionRequest, load: LoadSnapshot
    ) -> Decision:
        """Decide on one offered call. ``Admit``: the caller dispatches it now (and calls
        :meth:`dispatched`); ``Enqueue``: it is queued here; ``Shed``: it ends now (a
        queue bound refusing the push is a ``Shed`` too)."""
        self.slots.seen(now, request.tenant)
        decision = self.admission.decide(now, request, load)
        if isinstance(decision, Admit) and self.slots.at_cap(self._caps(now), request.tenant):
            decision = Enqueue(request.priority)  # at its slot share: it waits its turn
        if isinstance(decision, Enqueue):
            refused = self.admission.enqueue(now, self.queues, call, request, decision)
            if refused is not None:
                return refused
        if not isinstance(decision, Shed):
            self.in_flight[request.tenant] = self.in_flight.get(request.tenant, 0) + 1
        return decision

    def settle(
        self,
        now: float,
        tenant: str,
        phase: Phase,
        *,
        cost_tokens: int,
        prompt_tokens: int,
        output_tokens: int,
    ) -> None:
        """An admitted or queued call ended in ``phase``: give its tenant back what the
        core's charging rule says it did not use (as the live gateway does)."""
        unused = unused_tokens(
            phase, cost_tokens=cost_tokens, prompt_tokens=prompt_tokens, output_tokens=output_tokens
        )
        if unused > 0:
            self.admission.refund(now, tenant, unused)

    def _caps(self, now: float) -> dict[str, int] | None:
        return self.slots.caps(now, self.in_flight, self.total_slots)

    def dispatched(self, band: Band, tenant: str) -> None:
        """A call of ``band`` and ``tenant`` took a dispatch slot."""
        self.running[band] += 1
        self.slots.took(tenant)

    def release(self, band: Band, tenant: str) -> None:
        """A dispatched call left the replicas (finished or cancelled): free its slot."""
        self.running[band] -= 1
        self.slots.gave_back(tenant)

    def ended(self, now: float, tenant: str, *, completed: bool = False) -> None:
        """A call that was admitted or enqueued ended (served or not): no longer in
        flight for its tenant."""
        self.in_flight[tenant] -= 1
        if completed:
            self.completions.add(now, tenant)

    def pop(
        self, now: float, fits: Callable[[Queued[int]], bool] | None = None
    ) -> Queued[int] | None:
        """The next queued call to dispatch now (its slot taken), or None; ``fits`` is the
        queues' token-aware dispatch check."""
        got = self.queues.try_pop(
            now, total_slots=self.total_slots, running=self.running, fits=fits,
            eligible=self.slots.eligible(self._caps(now)),
        )  # fmt: skip
        if got is not None:
            self.dispatched(got.band, got.tenant)
        return got

    def expire(self, now: float) -> list[Queued[int]]:
        """Queued calls whose deadline has passed: they end ``timed_out``, never sent."""
        return self.queues.expire(now)
