"""Admission: admit, enqueue or shed each offered request, truthfully and at arrival.

:meth:`AdmissionPolicy.decide` takes ``now``, the request (:class:`AdmissionRequest`) and a
:class:`LoadSnapshot` built by the driver (queue statistics from
:class:`~headway.core.policy.queues.PriorityQueues`, in-flight counts, the free KV blocks
of the replica the router picked, measured speeds, downstream health), and returns a
:data:`~headway.core.policy.decisions.Decision`. It never reads a clock; its only memory
is one token bucket per tenant with a token-rate budget (debited when a request is
admitted or enqueued, refilled from ``now``; :meth:`AdmissionPolicy.refund` returns
tokens a request did not use).

Token arithmetic (``planned`` output = ``max_tokens``, or the class's p95 output when the
request sends none; seed 003: "estimate memory before admission")::

    | prompt_tokens | planned output |      cost_tokens = prompt + planned
    |  blk  |  blk  |  blk  |  blk  |      projected_kv_blocks = ceil(cost / block_size)
    free_kv_blocks - ceil(kv_reserve_fraction * total_kv_blocks) = blocks it may use now

    service_s = prompt_tokens / prefill_tokens_per_s + expected_output_tokens * tpot_s
    wait_s    = queued tokens (or requests) in its band / the band's drain rate

Checks, in this order (the first that refuses decides; seed 000: "admission should
consider remaining deadline, estimated work, tenant quota, and downstream health"):

1. ``TOO_LARGE`` — projected KV blocks exceed the replica's blocks after the reserve: it
   can never fit, so no retry (``retry_after_s`` None).
2. ``DEADLINE_UNMEETABLE`` (no slack) — the deadline has passed, or (with
   ``check_deadlines``) the service alone needs more than the time left: no retry.
   Refusals no retry can fix come first, so a client never retries into a certain
   failure.
3. ``DRAINING`` — this instance takes no new work (seed 003: "if worker_draining: stop
   admission"); retry after the replacement is ready, or at once on a peer.
4. ``DOWNSTREAM_UNHEALTHY`` — health below ``min_downstream_health``; retry after the
   driver's next probe.
5. ``TENANT_CONCURRENCY`` — the tenant's in-flight requests (running or queued) are at
   its limit; retry after the measured time for enough of them to complete.
6. ``TENANT_TOKEN_RATE`` — the tenant's bucket lacks ``cost_tokens``; retry after the
   bucket's refill time. (Tenant checks come before the shared queue, so that a tenant
   over its own budget gets its own reason and takes no shared space.)
7. **Admit** when the band has a free dispatch slot, nothing waits in its band or above,
   and the projected blocks fit now.
8. Otherwise it must wait. ``DEADLINE_UNMEETABLE`` when the predicted wait plus service
   exceeds the time left (at arrival, rather than after waiting: seed 000, "a larger queue
   can make the service appear available while guaranteeing an unacceptable result").
   ``retry_after_s`` is None for a fixed deadline (a retry spends the same deadline) and
   the excess wait for a deadline that renews on retry. A wait that cannot be predicted
   (nothing drained within the window) does not shed; queue expiry bounds it instead.
9. Its band or its tenant's queue is at its bound: ``KV_PROJECTION`` when the blocks do
   not fit now (memory is the binding limit), else ``QUEUE_FULL``; ``retry_after_s`` is
   that queue's ``queued_requests / drain_requests_per_s``.
10. **Enqueue** in its band.

Every ``retry_after_s`` is computed from the state that caused the refusal and capped at
``max_retry_after_s`` (also the value when the rate it needs has not been measured).

**Retry tickets: a Retry-After is a promise, not a guess.** At saturation the queue that
drains by the Retry-After is refilled by newcomers before the retry comes back, so a
retry judged afresh is refused again and the client's obedience buys nothing. With
``retry_tickets`` (the default), a shed for a full queue, memory (``KV_PROJECTION``) or a
wait that a renewed deadline can absorb (``DEADLINE_UNMEETABLE`` with a
``retry_after_s``) carries a ticket. A retry that presents it between its Retry-After and
``ticket_grace_s`` later passes checks 7 to 9 and joins the front of its tenant's line in
its band (``Enqueue(front=True)``), past the bounds; checks 1 to 5 still apply. A shed for
the tenant's token budget (``TENANT_TOKEN_RATE``) carries a *budget ticket*: its
Retry-After is the time for the bucket to refill the request's tokens after those promised
to the tenant's earlier tickets, and the retry that presents it takes its tokens on credit
(the bucket may go below zero; the tenant's later requests repay it). A ticket is used
once; a client that never returns costs nothing, because a ticket reserves order and
budget, not capacity.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from headway.core.policy._checks import is_finite_above, require
from headway.core.policy.decisions import Admit, Decision, Enqueue, Shed, ShedReason
from headway.core.policy.queues import (
    BANDS,
    PriorityQueues,
    QueuesStatistics,
    QueueStatistics,
    WaitBasis,
)
from headway.core.policy.rates import TokenBucket
from headway.core.workload.spec import Priority

T = TypeVar("T")

__all__ = [
    "AdmissionConfig",
    "AdmissionPolicy",
    "AdmissionRequest",
    "LoadSnapshot",
    "TenantLimits",
    "TenantLoad",
]


# ----------------------------------------------------------------------------- config


class TenantLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One tenant's budgets (seed 000: "per-tenant active-run limits, call budgets")."""

    max_concurrency: int | None = None
    """Requests the tenant may have in flight (running or queued) at once; one more is
    shed with TENANT_CONCURRENCY. None: no limit."""

    token_rate_per_s: float | None = None
    """Tokens (prompt plus planned output) per second the tenant may be admitted, a token
    bucket; over it, TENANT_TOKEN_RATE. None: no budget."""

    burst_s: float = 10.0
    """The bucket holds this many seconds of ``token_rate_per_s``: a tenant idle that long
    may burst that much at once. A single request larger than the bucket never passes."""

    def __post_init__(self) -> None:
        require(
            self.max_concurrency is None or self.max_concurrency >= 1,
            "admission.tenants.<tenant>",
            "max_concurrency",
            self.max_concurrency,
            "use 1 or more, or null for no limit",
        )
        require(
            is_finite_above(self.token_rate_per_s, 0.0),
            "admission.tenants.<tenant>",
            "token_rate_per_s",
            self.token_rate_per_s,
            "use tokens per second > 0, or null for no budget",
        )
        require(
            math.isfinite(self.burst_s) and self.burst_s > 0,
            "admission.tenants.<tenant>",
            "burst_s",
            self.burst_s,
            "use seconds > 0, e.g. 10",
        )

    @property
    def burst_tokens(self) -> float | None:
        """The bucket's capacity, tokens (None without a token budget)."""
        if self.token_rate_per_s is None:
            return None
        return self.token_rate_per_s * self.burst_s


class AdmissionConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the gateway decides to admit, enqueue or shed."""

    block_size: int = 16
    """Tokens per KV block of the engines behind (vLLM ``--block-size``)."""

    kv_reserve_fraction: float = 0.05
    """Fraction of a replica's KV blocks admission never promises: headroom for decode
    growth beyond the projection and for fragmentation (seed 003: "reject before memory
    exhaustion", not at it)."""

    min_downstream_health: float = 0.5
    """Shed with DOWNSTREAM_UNHEALTHY while the snapshot's health score (1 healthy, 0 down)
    is below this. Below one half most new work would fail after consuming capacity."""

    tenants: dict[str, TenantLimits] = msgspec.field(default_factory=dict)
    """Budgets per tenant."""

    default_tenant: TenantLimits = TenantLimits()
    """Budgets of a tenant missing from ``tenants`` (default: none)."""

    wait_basis: WaitBasis = "tokens"
    """Predict waits from queued tokens over the token drain rate (``tokens``), or queued
    requests over the request drain rate (``requests``). Tokens by default: "one 100-token
    answer and one 10,000-token answer occupy the decode scheduler for very different
    durations" (seed 003)."""

    check_deadlines: bool = True
    """Shed at arrival the requests whose deadline the predicted service (and wait, if
    they must queue) cannot meet. Off: only a deadline already passed is shed; the rest
    wait, and queue expiry removes them at their deadline."""

    max_retry_after_s: float = 60.0
    """Upper bound of every ``retry_after_s``, and its value when the rate it is computed
    from has not been measured yet (nothing drained within the window)."""

    retry_tickets: bool = True
    """Give capacity sheds a retry ticket (see the module docstring), so that a client
    obeying ``Retry-After`` is let in when it returns."""

    ticket_grace_s: float = 10.0
    """How long after its ``retry_after_s`` a ticket stays valid (clients add jitter)."""

    def __post_init__(self) -> None:
        require(self.block_size >= 1, "admission", "block_size", self.block_size, "vLLM uses 16")
        require(
            0.0 <= self.kv_reserve_fraction < 1.0,
            "admission",
            "kv_reserve_fraction",
            self.kv_reserve_fraction,
            "use a fraction in [0, 1), e.g. 0.05",
        )
        require(
            0.0 <= self.min_downstream_health <= 1.0,
            "admission",
            "min_downstream_health",
            self.min_downstream_health,
            "use a score in [0, 1]; 0 never sheds for health",
        )
        require(
            self.wait_basis in ("tokens", "requests"),
            "admission",
            "wait_basis",
            self.wait_basis,
            "use 'tokens' or 'requests'",
        )
        require(
            math.isfinite(self.max_retry_after_s) and self.max_retry_after_s > 0,
            "admission",
            "max_retry_after_s",
            self.max_retry_after_s,
            "use seconds > 0, e.g. 60",
        )
        require(
            math.isfinite(self.ticket_grace_s) and self.ticket_grace_s >= 0,
            "admission",
            "ticket_grace_s",
            self.ticket_grace_s,
            "use seconds >= 0, e.g. 10",
        )

    def limits(self, tenant: str) -> TenantLimits:
        """The budgets of ``tenant``."""
        return self.tenants.get(tenant, self.default_tenant)


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionRequest:
    """What admission knows about one offered request."""

    tenant: str
    """Whose request it is."""

    prompt_tokens: int
    """Prompt length, tokens."""

    p95_output_tokens: int
    """The p95 output of the request's class: the planned output when ``max_tokens`` is
    absent, and the cap of the expected output for the service estimate."""

    max_tokens: int | None = None
    """The request's ``max_tokens`` (None: it sent none)."""

    expected_output_tokens: int | None = None
    """Output to expect for the service estimate (None: the planned output, capped at the
    class's p95)."""

    priority: Priority = "interactive"
    """Its band; an enqueued request waits in the queue of this name."""

    deadline_s: float | None = None
    """Its absolute deadline, set once at arrival (:mod:`~headway.core.policy.deadlines`);
    None: no deadline."""

    deadline_renews_on_retry: bool = False
    """True when a retry gets a fresh budget (a per-call SLO); False when the deadline is
    fixed (a task deadline), so that a retry only spends it."""

    ticket: int | None = None
    """The retry ticket of the shed this request retries (None: a first attempt, or a
    retry without one)."""

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "p95_output_tokens"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"AdmissionRequest.{name} must be >= 0 (got {value})")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ValueError(f"AdmissionRequest.max_tokens must be >= 0 (got {self.max_tokens})")
        if self.priority not in BANDS:
            raise ValueError(
                f"AdmissionRequest.priority {self.priority!r} is not a band; "
                f"use one of {', '.join(BANDS)}"
            )

    @property
    def planned_output_tokens(self) -> int:
        """``max_tokens``, or the class's p95 output when the request sent none."""
        return self.max_tokens if self.max_tokens is not None else self.p95_output_tokens

    @property
    def cost_tokens(self) -> int:
        """Prompt plus planned output: what it may occupy, and what budgets charge."""
        return self.prompt_tokens + self.planned_output_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantLoad:
    """What the driver counts for one tenant."""

    in_flight_requests: int = 0
    """Requests admitted or enqueued and not yet finished (running or queued)."""

    completions_per_s: float = 0.0
    """Its requests finishing per second, measured (0: not measured)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSnapshot:
    """The state admission reads, built by the driver at ``now``."""

    queues: QueuesStatistics
    """:meth:`PriorityQueues.statistics <headway.core.policy.queues.PriorityQueues.
    statistics>` at ``now``."""

    free_slots: Mapping[str, int]
    """Dispatch slots each band may take now (:meth:`PriorityQueues.free_slots_by_band
    <headway.core.policy.queues.PriorityQueues.free_slots_by_band>`); a missing band has
    none."""

    free_kv_blocks: int
    """Free KV blocks of the replica the router picked for this request. Blocks its
    running requests are projected to still need should be subtracted; raw free blocks
    are optimistic."""

    total_kv_blocks: int
    """All KV blocks of that replica."""

    tenants: Mapping[str, TenantLoad] = field(default_factory=dict)
    """Per tenant; a missing tenant has nothing in flight."""

    prefill_tokens_per_s: float | None = None
    """Measured prompt tokens per second for one request (None: unknown, no deadline
    prediction)."""

    tpot_s: float | None = None
    """Measured time per output token (None: unknown, no deadline prediction)."""

    downstream_health: float = 1.0
    """The driver's health score of what is behind the gateway: 1 healthy, 0 down."""

    downstream_next_probe_s: float | None = None
    """When the driver next probes the downstream (a circuit breaker's half-open time),
    absolute; None: unknown."""

    draining: bool = False
    """This instance is draining and takes no new work."""

    replacement_ready_s: float | None = None
    """While draining: when a replacement is expected ready, absolute; None: peers take
    traffic now."""


# ----------------------------------------------------------------------------- policy


@dataclass(frozen=True, slots=True)
class _Ticket:
    """A retry ticket: when it may be presented, by whom, and the budget tokens its
    retry will take on credit (0 for a queue ticket)."""

    valid_from_s: float
    until_s: float
    tenant: str
    credit_tokens: float


class AdmissionPolicy:
    """The admission policy (see the module docstring for the checks and their order)."""

    def __init__(self, config: AdmissionConfig | None = None) -> None:
        self.config = config if config is not None else AdmissionConfig()
        self._buckets: dict[str, TokenBucket] = {}
        self._tickets: dict[int, _Ticket] = {}
        self._ticket_expiry: list[tuple[float, int]] = []
        self._ticket_credit: dict[str, float] = {}
        """Per tenant: tokens its outstanding budget tickets will take on credit."""
        self._next_ticket = 1
        self.tickets_issued = 0
        """Retry tickets given with sheds."""
        self.tickets_honoured = 0
        """Retries let in by their ticket."""

    def reconfigure(self, now: float, config: AdmissionConfig) -> None:
        """Take ``config`` from now on (a live reload). Outstanding tickets stay valid; a
        tenant whose budget changed gets a bucket at the new rate holding what it held
        (at most the new burst), so a reload neither grants a fresh burst nor forgets
        debt; a tenant whose budget was removed loses its bucket."""
        old = self.config
        self.config = config
        for tenant, bucket in list(self._buckets.items()):
            if old.limits(tenant) == config.limits(tenant):
                continue
            del self._buckets[tenant]
            level = bucket.level(now)
            fresh = self._bucket(now, tenant)
            if fresh is not None:
                fresh.take_on_credit(now, fresh.level(now) - min(level, fresh.capacity_tokens))

    # -- estimates ----------------------------------------------------------------------

    def projected_kv_blocks(self, request: AdmissionRequest) -> int:
        """KV blocks the request holds at its end: ``ceil(cost_tokens / block_size)``."""
        return -(-request.cost_tokens // self.config.block_size)

    def reserve_blocks(self, total_kv_blocks: int) -> int:
        """Blocks of a replica admission never promises."""
        return math.ceil(self.config.kv_reserve_fraction * total_kv_blocks)

    @staticmethod
    def service_estimate_s(request: AdmissionRequest, load: LoadSnapshot) -> float | None:
        """Predicted service time once dispatched: prefill plus decode at the measured
        speeds; None when a speed is unknown."""
        if not load.prefill_tokens_per_s or load.tpot_s is None:
            return None
        expected = request.expected_output_tokens
        if expected is None:
            expected = min(request.planned_output_tokens, request.p95_output_tokens)
        return request.prompt_tokens / load.prefill_tokens_per_s + expected * load.tpot_s

    def _bucket(self, now: float, tenant: str) -> TokenBucket | None:
        bucket = self._buckets.get(tenant)
        if bucket is None:
            limits = self.config.limits(tenant)
            capacity = limits.burst_tokens
            if limits.token_rate_per_s is None or capacity is None:
                return None
            bucket = TokenBucket(
                rate_per_s=limits.token_rate_per_s, capacity_tokens=capacity, now=now
            )
            self._buckets[tenant] = bucket
        return bucket

    def tokens_available(self, now: float, tenant: str) -> float | None:
        """Tokens in ``tenant``'s bucket at ``now`` (None: the tenant has no budget)."""
        bucket = self._bucket(now, tenant)
        return None if bucket is None else bucket.level(now)

    def refund(self, now: float, tenant: str, tokens: float) -> None:
        """Return budget a request was charged but did not use: the unused part of its
        planned output at completion, or all of it when it expired unserved."""
        bucket = self._bucket(now, tenant)
        if bucket is not None:
            bucket.give_back(now, tokens)

    def enqueue(
        self,
        now: float,
        queues: PriorityQueues[T],
        item: T,
        request: AdmissionRequest,
        decision: Enqueue,
    ) -> Shed | None:
        """Carry out an ``Enqueue`` decision: push ``item`` into ``queues`` as the
        decision says (its band; at the front for a redeemed ticket). A queue bound that
        refuses it (admission checked the same bounds, but a driver's queues are the
        authority) returns that ``Shed``, and the tenant's budget taken for it is given
        back."""
        refused = queues.push(
            now,
            item,
            band=decision.queue,
            tenant=request.tenant,
            cost_tokens=request.cost_tokens,
            deadline_s=request.deadline_s,
            max_retry_after_s=self.config.max_retry_after_s,
            front=decision.front,
        )
        if refused is not None:
            self.refund(now, request.tenant, request.cost_tokens)
        return refused

    def _cap(self, seconds: float) -> float:
        return min(max(seconds, 0.0), self.config.max_retry_after_s)

    # -- the decision -------------------------------------------------------------------

    def decide(self, now: float, request: AdmissionRequest, load: LoadSnapshot) -> Decision:
        """Admit, enqueue or shed ``request`` at ``now`` given ``load``.

        Debits the tenant's token bucket when the result is Admit or Enqueue.
        """
        if request.priority not in load.queues.bands:
            raise ValueError(
                f"the load snapshot has no statistics for band {request.priority!r}; build "
                "it from PriorityQueues.statistics(now), which has every band"
            )
        service_s = self.service_estimate_s(request, load)
        ticket = self._valid_ticket(now, request)
        refused = self._refuse_impossible(now, request, load, service_s)
        if refused is None:
            refused = self._refuse_by_state(now, request, load, service_s, ticket)
        if refused is not None:
            return refused
        decision = self._decide_by_load(now, request, load, service_s, ticket)
        if isinstance(decision, Shed):
            return self._with_ticket(now, decision, request.tenant)
        if ticket is not None:
            self._spend(request.ticket)
        return decision

    # -- retry tickets --------------------------------------------------------------------

    def _with_ticket(self, now: float, shed: Shed, tenant: str, credit_tokens: float = 0.0) -> Shed:
        """``shed`` with a retry ticket, when it is a shed a retry can use."""
        if not self.config.retry_tickets or shed.retry_after_s is None:
            return shed
        number = self._next_ticket
        self._next_ticket += 1
        valid_from = now + shed.retry_after_s
        until = valid_from + self.config.ticket_grace_s
        self._tickets[number] = _Ticket(valid_from, until, tenant, credit_tokens)
        if credit_tokens:
            self._ticket_credit[tenant] = self._ticket_credit.get(tenant, 0.0) + credit_tokens
        heapq.heappush(self._ticket_expiry, (until, number))
        self.tickets_issued += 1
        return dataclasses.replace(shed, ticket=number)

    def _valid_ticket(self, now: float, request: AdmissionRequest) -> _Ticket | None:
        """The request's ticket when it is valid at ``now`` for its tenant (not spent
        yet); expired tickets are dropped first."""
        expiry = self._ticket_expiry
        while expiry and expiry[0][0] < now:
            number = heapq.heappop(expiry)[1]
            if number in self._tickets:
                self._drop(number)
        if request.ticket is None:
            return None
        ticket = self._tickets.get(request.ticket)
        if ticket is None or ticket.tenant != request.tenant:
            return None
        if not ticket.valid_from_s - 1e-9 <= now <= ticket.until_s:
            return None
        return ticket

    def _drop(self, number: int) -> _Ticket:
        ticket = self._tickets.pop(number)
        if ticket.credit_tokens:
            self._ticket_credit[ticket.tenant] -= ticket.credit_tokens
        return ticket

    def _spend(self, number: int | None) -> None:
        if number is not None and number in self._tickets:
            self._drop(number)
            self.tickets_honoured += 1

    @property
    def tickets_outstanding(self) -> int:
        """Tickets issued, not used and not expired (as of the last decision)."""
        return len(self._tickets)

    # -- the load checks ------------------------------------------------------------------

    def _decide_by_load(
        self,
        now: float,
        request: AdmissionRequest,
        load: LoadSnapshot,
        service_s: float | None,
        ticket: _Ticket | None,
    ) -> Decision:
        """Checks 7 to 10 (or a valid ticket): admit, enqueue, or shed for load. Debits
        the tenant's bucket on Admit and Enqueue (on credit for a budget ticket)."""
        cfg = self.config
        blocks = self.projected_kv_blocks(request)
        reserve = self.reserve_blocks(load.total_kv_blocks)
        remaining_s = None if request.deadline_s is None else request.deadline_s - now
        bucket = self._bucket(now, request.tenant)
        kv_fits = blocks <= load.free_kv_blocks - reserve
        band = request.priority
        level = BANDS.index(band)
        bands = load.queues.bands
        nothing_ahead = all(
            b not in bands or bands[b].queued_requests == 0 for b in BANDS[: level + 1]
        )
        on_credit = ticket is not None and ticket.credit_tokens > 0
        if load.free_slots.get(band, 0) > 0 and nothing_ahead and kv_fits:
            self._debit(now, bucket, request.cost_tokens, on_credit)
            return Admit()

        band_queue = bands[band]
        wait_s = band_queue.predicted_wait_s(cfg.wait_basis)
        if ticket is not None:
            self._debit(now, bucket, request.cost_tokens, on_credit)
            return Enqueue(band, wait_s, front=True)
        if (
            cfg.check_deadlines
            and remaining_s is not None
            and service_s is not None
            and wait_s is not None
            and wait_s + service_s > remaining_s
        ):
            excess_s = wait_s + service_s - remaining_s
            return Shed(
                ShedReason.DEADLINE_UNMEETABLE,
                self._cap(excess_s) if request.deadline_renews_on_retry else None,
                f"predicted wait {wait_s:.3f} s + service {service_s:.3f} s > "
                f"{remaining_s:.3f} s left",
            )

        full = self._full_queue(band, request.tenant, load.queues)
        if full is not None:
            name, stats = full
            reason = ShedReason.QUEUE_FULL if kv_fits else ShedReason.KV_PROJECTION
            why = (
                ""
                if kv_fits
                else (
                    f"{blocks} KV blocks do not fit {load.free_kv_blocks} free - {reserve} "
                    "reserved, and "
                )
            )
            return Shed(
                reason,
                stats.time_to_drain_s(max_s=cfg.max_retry_after_s),
                f"{why}{name} holds {stats.queued_requests} of {stats.max_queued_requests} "
                f"requests, draining {stats.drain_requests_per_s:.3g}/s",
            )

        self._debit(now, bucket, request.cost_tokens, on_credit)
        return Enqueue(band, wait_s)

    @staticmethod
    def _debit(now: float, bucket: TokenBucket | None, tokens: int, on_credit: bool) -> None:
        if bucket is None:
            return
        if on_credit:
            bucket.take_on_credit(now, tokens)
        else:
            bucket.try_take(now, tokens)

    def _refuse_impossible(
        self,
        now: float,
        request: AdmissionRequest,
        load: LoadSnapshot,
        service_s: float | None,
    ) -> Shed | None:
        """Checks 1 and 2: what no retry can fix (too large; no slack before the deadline)."""
        blocks = self.projected_kv_blocks(request)
        usable_blocks = load.total_kv_blocks - self.reserve_blocks(load.total_kv_blocks)
        if blocks > usable_blocks:
            return Shed(
                ShedReason.TOO_LARGE,
                None,
                f"{request.cost_tokens} tokens project {blocks} KV blocks; a replica has "
                f"{usable_blocks} after the reserve",
            )
        if request.deadline_s is None:
            return None
        remaining_s = request.deadline_s - now
        predicted_late = (
            self.config.check_deadlines and service_s is not None and service_s > remaining_s
        )
        if remaining_s <= 0 or predicted_late:
            needs = "unknown" if service_s is None else f"{service_s:.3f}"
            return Shed(
                ShedReason.DEADLINE_UNMEETABLE,
                None,
                f"{max(remaining_s, 0.0):.3f} s left; service alone needs {needs} s",
            )
        return None

    def _refuse_by_state(
        self,
        now: float,
        request: AdmissionRequest,
        load: LoadSnapshot,
        service_s: float | None,
        ticket: _Ticket | None,
    ) -> Shed | None:
        """Checks 3 to 6: draining, downstream health, tenant concurrency, token rate (a
        valid budget ticket passes the token-rate check: its tokens are taken on
        credit)."""
        cfg = self.config
        if load.draining:
            ready_s = load.replacement_ready_s
            return Shed(
                ShedReason.DRAINING,
                0.0 if ready_s is None else self._cap(ready_s - now),
                "this instance is draining"
                + ("; retry on a peer" if ready_s is None else f"; replacement at {ready_s}"),
            )
        if load.downstream_health < cfg.min_downstream_health:
            probe_s = load.downstream_next_probe_s
            return Shed(
                ShedReason.DOWNSTREAM_UNHEALTHY,
                cfg.max_retry_after_s if probe_s is None else self._cap(probe_s - now),
                f"downstream health {load.downstream_health:.2f} < {cfg.min_downstream_health:.2f}",
            )

        limits = cfg.limits(request.tenant)
        tenant = load.tenants.get(request.tenant, TenantLoad())
        limit = limits.max_concurrency
        if limit is not None and tenant.in_flight_requests >= limit:
            excess = tenant.in_flight_requests - limit + 1
            if tenant.completions_per_s > 0:
                retry_s = self._cap(excess / tenant.completions_per_s)
            elif service_s is not None:
                retry_s = self._cap(service_s)  # a request of its size frees within it
            else:
                retry_s = cfg.max_retry_after_s
            return Shed(
                ShedReason.TENANT_CONCURRENCY,
                retry_s,
                f"tenant {request.tenant!r} has {tenant.in_flight_requests} in flight, "
                f"limit {limit}",
            )

        bucket = self._bucket(now, request.tenant)
        if bucket is not None and (ticket is None or not ticket.credit_tokens):
            cost = request.cost_tokens
            credit = self._ticket_credit.get(request.tenant, 0.0)
            wait = bucket.wait_s(now, cost)
            if wait is not None and wait > 0 and cfg.retry_tickets:
                # A budget ticket: the retry takes its tokens on credit, after the tokens
                # of the tickets issued before it have refilled.
                wait = (cost + credit - bucket.level(now)) / bucket.rate_per_s
                shed = Shed(
                    ShedReason.TENANT_TOKEN_RATE,
                    self._cap(wait),
                    f"tenant {request.tenant!r} bucket holds {bucket.level(now):.0f} of "
                    f"{bucket.capacity_tokens:.0f} tokens at {bucket.rate_per_s:g}/s; the "
                    f"request costs {cost}; {credit:.0f} tokens promised to earlier tickets",
                )
                if wait <= cfg.max_retry_after_s:
                    return self._with_ticket(now, shed, request.tenant, credit_tokens=cost)
                return shed
            if wait is None or wait > 0:
                return Shed(
                    ShedReason.TENANT_TOKEN_RATE,
                    None if wait is None else self._cap(wait),
                    f"tenant {request.tenant!r} bucket holds {bucket.level(now):.0f} of "
                    f"{bucket.capacity_tokens:.0f} tokens at {bucket.rate_per_s:g}/s; the "
                    f"request costs {request.cost_tokens}"
                    + ("" if wait is not None else "; raise burst_s or token_rate_per_s"),
                )
        return None

    @staticmethod
    def _full_queue(
        band: Priority, tenant: str, queues: QueuesStatistics
    ) -> tuple[str, QueueStatistics] | None:
        """The first full queue the request would join: its band, then its tenant's."""
        stats = queues.bands[band]
        if stats.full:
            return f"band {band!r}", stats
        tenant_stats = queues.tenants.get(tenant)
        if tenant_stats is not None and tenant_stats.full:
            return f"tenant {tenant!r}'s queue", tenant_stats
        return None
