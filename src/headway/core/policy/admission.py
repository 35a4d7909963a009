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
    wait_s    = (queued + promised to its band's tickets) tokens (or requests)
                / the band's drain rate (before one is measured: dispatch_slots / service_s)

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
6. ``TENANT_TOKEN_RATE`` — the tenant's bucket lacks ``cost_tokens`` (after the tokens
   reserved by its budget tickets); retry after the bucket's refill time. A request
   larger than the whole bucket is refused with no retry among the checks no retry
   can fix (after check 1). (Tenant checks come before the shared queue, so that a tenant
   over its own budget gets its own reason and takes no shared space.)
7. **Admit** when the band has a free dispatch slot, nothing waits in its band or above,
   and the projected blocks fit now.
8. Otherwise it must wait. ``DEADLINE_UNMEETABLE`` when the predicted wait plus service
   exceeds the time left (at arrival, rather than after waiting: seed 000, "a larger queue
   can make the service appear available while guaranteeing an unacceptable result").
   ``retry_after_s`` is None for a fixed deadline (a retry spends the same deadline) and,
   for a deadline that renews on retry, the excess wait plus half the slack the deadline
   leaves beside the service (the retry returns when the wait ahead is half its slack).
   A wait that cannot be predicted (no drain measured and no service estimate) does not
   shed; queue expiry bounds it instead.
9. Its band or its tenant's queue is at its bound: ``KV_PROJECTION`` when the blocks do
   not fit now (memory is the binding limit), else ``QUEUE_FULL``; ``retry_after_s`` is
   that queue's ``queued_requests / drain_requests_per_s``.
10. **Enqueue** in its band.

Every ``retry_after_s`` is computed from the state that caused the refusal and capped at
``max_retry_after_s``, except a ticket's: that is the promised turn, up to
``promise_horizon_s``. Before a queue's drain rate is measured, it is the snapshot's
``dispatch_slots`` over the predicted service time (:mod:`~headway.core.policy.speeds`
gives the speeds a prior), so a Retry-After is computed from the first request.

**Retry tickets: a Retry-After is a promise, not a guess.** At saturation the queue that
drains by the Retry-After is refilled by newcomers before the retry comes back, so a
retry judged afresh is refused again and the client's obedience buys nothing. With
``retry_tickets`` (the default), a shed for a full queue, memory (``KV_PROJECTION``) or a
wait that a renewed deadline can absorb (``DEADLINE_UNMEETABLE`` with a
``retry_after_s``) carries a ticket. A retry that presents it between its Retry-After and
``ticket_grace_s`` later passes checks 7 to 9 and joins the front of its tenant's line in
its band (``Enqueue(front=True)``, behind the tickets redeemed before it); checks 1 to 6
still apply. Such retries may exceed a queue's bound, never twice it: a ticketed retry
that finds its band's or its tenant's queue at twice its bound is shed ``QUEUE_FULL``
(the queues refuse such a push too), so tickets collected in bulk cannot grow a queue
without bound. Queue tickets are never
oversold: until its Retry-After each counts as a place waiting ahead of newcomers (their
predicted wait and the next tickets' Retry-After), and a shed whose promise would be past
``promise_horizon_s`` gets the capped Retry-After without a ticket: a promise is only
made where it can be kept.

A shed for the tenant's token budget (``TENANT_TOKEN_RATE``) carries a *budget ticket*
that reserves the request's tokens: a fresh request may not take reserved tokens, and
the Retry-After is the time for the bucket to refill the request's tokens after those
reserved before it. A budget ticket is issued only while everything reserved fits the
bucket, so every promise is kept without the bucket going below zero: over any window
the tenant is admitted at most ``burst + rate × window``. Past that cap (a tenant offering
several times its budget: it is refused faster than its bucket refills, so turns exist
for only some of its refusals) the shed names no time (``client_backoff``: HTTP 429
without ``Retry-After``): a time named then would be a guess that the retry finds spent
by the tickets before it and the fresh requests after them, and a Retry-After is kept or
not sent. A retry without its ticket
header (a plain client that obeys Retry-After) redeems its tenant's oldest valid budget
ticket that covers it.

A ticket is bound to what it was issued for: its tenant, its band, and the tokens of the
request (a retry may cost at most that; a larger one is judged as a fresh request and
the ticket is dropped). A ticket is used once; a client that never returns costs
nothing but the reservation until the ticket expires, because a ticket reserves order
and budget, not capacity.

**Charges.** Admission debits a request's whole cost; when it ends, the driver returns
what it did not use (:mod:`~headway.core.policy.charges`): everything when it never
reached an engine, the unused output once it did.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar

import msgspec

from headway.core.policy._checks import is_finite_above, require
from headway.core.policy.decisions import Admit, Decision, Enqueue, Shed, ShedReason
from headway.core.policy.queues import (
    BANDS,
    FAIR_AFTER_S,
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
    may burst that much at once. A single request larger than the bucket never passes
    (with ``work_conserving``: larger than the budgets' pool, which holds the largest
    work-conserving tenant's burst)."""

    work_conserving: bool = False
    """``true``: the budget binds only under contention. A request over the bucket is
    admitted (and takes nothing from it) while the pool of the work-conserving budgets
    (their rates summed: the capacity they split, charged with every tenant's admitted
    work) holds its tokens, no other tenant has a request that has waited
    ``contended_after_s`` in the queues and no request was refused for load within it:
    capacity nobody else uses is not withheld. Once the pool is empty, another tenant is
    kept waiting or calls are refused as late, the bucket binds as usual, so a flood is
    refused when it takes others' share.
    ``false`` (the default): a hard budget, refused even while the rest is idle."""

    contended_after_s: float = FAIR_AFTER_S
    """For a ``work_conserving`` budget: how long another tenant's request must have
    waited for the budget to bind (a moment's queueing behind a burst is not yet
    contention; seconds of it are). The default is the queues' ``fair_after_s``: the wait
    at which fair queuing starts to order a band is the one at which budgets bind."""

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
            math.isfinite(self.contended_after_s) and self.contended_after_s >= 0,
            "admission.tenants.<tenant>",
            "contended_after_s",
            self.contended_after_s,
            "use seconds >= 0, e.g. 0.5",
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
    """Upper bound of every ``retry_after_s`` that is not a promise (a shed without a
    ticket), and its value when the rate it is computed from has not been measured yet
    (nothing drained within the window). Clients cap what they obey too: the ``openai``
    Python client ignores a Retry-After over 60 s."""

    promise_horizon_s: float = 300.0
    """How far ahead a retry ticket may promise a place. A capacity shed whose turn comes
    within it gets a ticket and that turn as its ``retry_after_s`` (past
    ``max_retry_after_s`` when need be: a promise is a time to be kept, not a guess to be
    capped); one whose turn is later gets no ticket and the capped ``retry_after_s``. At
    2.5x overload for 40 s the promised turns reach about 100 s: a 60 s horizon left a
    fifth of the refused calls without a promise, and their retries failed."""

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
            math.isfinite(self.promise_horizon_s) and self.promise_horizon_s >= 0,
            "admission",
            "promise_horizon_s",
            self.promise_horizon_s,
            "use seconds >= 0, e.g. 300 (0: no queue or budget tickets beyond an immediate retry)",
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

    dispatch_slots: int = 0
    """Dispatch slots of the replicas behind (all bands). With the service estimate it
    gives the drain rate before one is measured, ``dispatch_slots / service_s`` requests
    per second, so that waits and Retry-After are computed from the first request (0:
    unknown; an unmeasured drain then predicts no wait)."""

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
    """A retry ticket: when it may be presented, by whom, for what (its band and the
    tokens of the request it was issued for: a retry may cost at most that), and the
    budget tokens it reserves for its retry (0 for a queue ticket)."""

    valid_from_s: float
    until_s: float
    tenant: str
    band: str
    cost_tokens: int
    credit_tokens: float
    promised_band: Priority | None = None
    """A queue ticket: the band whose line its retry will join (None: a budget ticket)."""
    promised_tokens: int = 0
    """A queue ticket: the token cost its retry will add to that line."""


class AdmissionPolicy:
    """The admission policy (see the module docstring for the checks and their order)."""

    def __init__(self, config: AdmissionConfig | None = None) -> None:
        self.config = config if config is not None else AdmissionConfig()
        self._buckets: dict[str, TokenBucket] = {}
        self._pool: TokenBucket | None = None
        self._pool_built = False
        self._tickets: dict[int, _Ticket] = {}
        self._ticket_expiry: list[tuple[float, int]] = []
        self._ticket_credit: dict[str, float] = {}
        """Per tenant: tokens its outstanding budget tickets reserve (a fresh request may
        not take them)."""
        self._budget_tickets: dict[str, list[int]] = {}
        """Per tenant: its budget tickets' numbers, oldest first (spent ones pruned)."""
        self._promised: dict[str, list[int]] = {b: [0, 0] for b in BANDS}
        """Per band: requests and tokens its queue tickets not yet due will bring back;
        they count as waiting ahead of a newcomer, so promises are never oversold. A
        promise ends when its ticket is used, or at its Retry-After (a retry back by then
        waits in the queue; one that never comes back stops counting)."""
        self._promise_due: list[tuple[float, int]] = []
        """(Retry-After time, ticket) of the tickets whose promise still counts."""
        self._promising: set[int] = set()
        """The tickets whose promise still counts."""
        self._refused_s = -math.inf
        """When a request was last refused for load (its deadline unmeetable, or a full
        queue): no capacity is idle, so a work-conserving budget binds."""
        self._next_ticket = 1
        self.tickets_issued = 0
        """Retry tickets given with sheds."""
        self.tickets_honoured = 0
        """Retries let in by their ticket."""

    def reconfigure(self, now: float, config: AdmissionConfig) -> None:
        """Take ``config`` from now on (a live reload). Outstanding tickets stay valid; a
        tenant whose budget changed gets a bucket at the new rate holding what it held
        (at most the new burst), so a reload neither grants a fresh burst nor forgets
        debt; a tenant whose budget was removed loses its bucket. The budgets' pool
        likewise keeps what it held."""
        old = self.config
        self.config = config
        old_pool = self._pool
        self._pool, self._pool_built = None, False
        _carry_over(now, old_pool, self._pool_bucket(now))
        for tenant, bucket in list(self._buckets.items()):
            if old.limits(tenant) == config.limits(tenant):
                continue
            del self._buckets[tenant]
            _carry_over(now, bucket, self._bucket(now, tenant))

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
        pool = self._pool_bucket(now)
        if pool is not None:
            pool.give_back(now, tokens)

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

    @staticmethod
    def over_budget_detail(request: AdmissionRequest, burst_tokens: float) -> str:
        """Why a request larger than its tenant's whole bucket can never pass, and the
        fix (the client's: fewer tokens; the operator's: a larger burst)."""
        output = (
            f"max_tokens={request.max_tokens}"
            if request.max_tokens is not None
            else f"{request.planned_output_tokens} planned output tokens"
        )
        return (
            f"the request costs {request.cost_tokens} tokens ({request.prompt_tokens} "
            f"prompt + {output}), more than tenant {request.tenant!r}'s whole budget of "
            f"{burst_tokens:.0f} tokens, so no retry can pass; lower max_tokens or shorten "
            f"the prompt to {burst_tokens:.0f} tokens in all (or raise the tenant's burst_s "
            "or token_rate_per_s)"
        )

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
        number, ticket = request.ticket, self._valid_ticket(now, request)
        if ticket is None and request.ticket is None:
            # A retry that obeyed its Retry-After but did not present its budget ticket
            # (a plain client) redeems its tenant's oldest one that covers it.
            number, ticket = self._held_budget_ticket(now, request)
        refused = self._refuse_impossible(now, request, load, service_s)
        if refused is None:
            refused = self._refuse_by_state(now, request, load, service_s, ticket)
        if refused is not None:
            self._note_refusal(now, request, refused)
            return refused
        decision = self._decide_by_load(now, request, load, service_s, ticket)
        if isinstance(decision, Shed):
            self._note_refusal(now, request, decision)
            return decision
        if ticket is not None:
            self._spend(number)
        return decision

    # -- retry tickets --------------------------------------------------------------------

    def _with_ticket(
        self,
        now: float,
        shed: Shed,
        request: AdmissionRequest,
        credit_tokens: float = 0.0,
        promise: tuple[Priority, int] | None = None,
    ) -> Shed:
        """``shed`` with a retry ticket, when it is a shed a retry can use (a queue
        ticket, or with ``credit_tokens`` a budget ticket reserving them). ``promise``: the
        band and token cost a queue ticket's retry will bring back (counted ahead of
        newcomers until it is used or its Retry-After comes)."""
        if not self.config.retry_tickets or shed.retry_after_s is None:
            return shed
        tenant, band = request.tenant, request.priority
        number = self._next_ticket
        self._next_ticket += 1
        valid_from = now + shed.retry_after_s
        until = valid_from + self.config.ticket_grace_s
        promised_band, promised_tokens = promise if promise is not None else (None, 0)
        self._tickets[number] = _Ticket(
            valid_from, until, tenant, band, request.cost_tokens, credit_tokens,
            promised_band, promised_tokens,
        )  # fmt: skip
        if credit_tokens:
            self._ticket_credit[tenant] = self._ticket_credit.get(tenant, 0.0) + credit_tokens
            self._budget_tickets.setdefault(tenant, []).append(number)
        if promised_band is not None:
            promised = self._promised[promised_band]
            promised[0] += 1
            promised[1] += promised_tokens
            heapq.heappush(self._promise_due, (valid_from, number))
            self._promising.add(number)
        heapq.heappush(self._ticket_expiry, (until, number))
        self.tickets_issued += 1
        return dataclasses.replace(shed, ticket=number)

    def _valid_ticket(self, now: float, request: AdmissionRequest) -> _Ticket | None:
        """The request's ticket when it is valid at ``now`` for this request: its tenant,
        its band, at most the tokens it was issued for, not spent yet. Expired tickets
        are dropped first; a ticket presented by a larger request is dropped too (the
        request is judged afresh, and the tokens the ticket reserved are released)."""
        self._promises_due(now)
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
        if ticket.band != request.priority or request.cost_tokens > ticket.cost_tokens:
            self._drop(request.ticket)
            return None
        return ticket

    def _held_budget_ticket(
        self, now: float, request: AdmissionRequest
    ) -> tuple[int | None, _Ticket | None]:
        """The oldest budget ticket of the request's tenant valid at ``now`` for at least
        its tokens, when its bucket (less the reserved tokens) is short of them."""
        numbers = self._budget_tickets.get(request.tenant)
        bucket = self._buckets.get(request.tenant)
        if not numbers or bucket is None:
            return None, None
        while numbers and numbers[0] not in self._tickets:
            numbers.pop(0)  # spent or expired
        reserved = self._ticket_credit.get(request.tenant, 0.0)
        if bucket.level(now) - reserved >= request.cost_tokens:
            return None, None
        for number in numbers:
            ticket = self._tickets.get(number)
            if ticket is None or ticket.valid_from_s - 1e-9 > now:
                continue
            if now <= ticket.until_s and request.cost_tokens <= ticket.cost_tokens:
                return number, ticket
        return None, None

    def _drop(self, number: int) -> _Ticket:
        ticket = self._tickets.pop(number)
        if ticket.credit_tokens:
            self._ticket_credit[ticket.tenant] -= ticket.credit_tokens
        self._end_promise(number, ticket)
        return ticket

    def _end_promise(self, number: int, ticket: _Ticket) -> None:
        """Stop counting ``ticket``'s promised place (idempotent)."""
        if ticket.promised_band is not None and number in self._promising:
            self._promising.discard(number)
            promised = self._promised[ticket.promised_band]
            promised[0] -= 1
            promised[1] -= ticket.promised_tokens

    def _promises_due(self, now: float) -> None:
        """End the promises whose Retry-After has come."""
        due = self._promise_due
        while due and due[0][0] <= now:
            number = heapq.heappop(due)[1]
            ticket = self._tickets.get(number)
            if ticket is not None:
                self._end_promise(number, ticket)

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
        bands = load.queues.bands
        nothing_ahead = load.queues.queued_through(band) == 0
        on_credit = ticket is not None and ticket.credit_tokens > 0
        if load.free_slots.get(band, 0) > 0 and nothing_ahead and kv_fits:
            self._debit(now, bucket, request.cost_tokens, on_credit)
            return Admit()

        band_queue = bands[band]
        if ticket is not None and not on_credit:
            over = self._over_ticket_ceiling(band, request.tenant, load.queues)
            if over is not None:
                name, stats = over
                return Shed(
                    ShedReason.QUEUE_FULL,
                    stats.time_to_drain_s(max_s=cfg.max_retry_after_s),
                    f"{name} holds {stats.queued_requests} requests, twice its bound of "
                    f"{stats.max_queued_requests}: no more ticketed retries fit",
                )
            self._debit(now, bucket, request.cost_tokens, on_credit)
            return Enqueue(band, band_queue.predicted_wait_s(cfg.wait_basis), front=True)
        promise = (band, request.cost_tokens)
        wait_s = self._wait_s(band_queue, band, request, load, service_s)
        if (
            cfg.check_deadlines
            and remaining_s is not None
            and service_s is not None
            and wait_s is not None
            and wait_s + service_s > remaining_s
        ):
            # The retry comes back when the wait ahead of it (promises included) has
            # drained to half its slack, so a noisy drain still leaves it time; timed at
            # the slots' pace (a drain measured on a queue fed by retries is too slow).
            paced_s = self._wait_s(band_queue, band, request, load, service_s, paced=True)
            ahead_s = wait_s if paced_s is None else min(paced_s, wait_s)
            excess_s = max(ahead_s + service_s - remaining_s, 0.0)
            retry_s = excess_s + max(remaining_s - service_s, 0.0) / 2
            shed = Shed(
                ShedReason.DEADLINE_UNMEETABLE,
                self._cap(retry_s) if request.deadline_renews_on_retry else None,
                f"predicted wait {wait_s:.3f} s + service {service_s:.3f} s > "
                f"{remaining_s:.3f} s left",
            )
            return self._promise(now, shed, request, retry_s, promise)

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
            drain_s = self._drain_s(stats, band, load, service_s)
            shed = Shed(
                reason,
                self._cap(drain_s),
                f"{why}{name} holds {stats.queued_requests} of {stats.max_queued_requests} "
                f"requests, draining {stats.drain_requests_per_s:.3g}/s",
            )
            return self._promise(now, shed, request, drain_s, promise)

        self._debit(now, bucket, request.cost_tokens, on_credit)
        return Enqueue(band, wait_s)

    def _drain_rate(
        self,
        stats: QueueStatistics,
        load: LoadSnapshot,
        service_s: float | None,
        tokens: int,
        *,
        paced: bool = False,
    ) -> float:
        """How fast ``stats``' queue drains, requests per second (``tokens`` = 0) or tokens
        per second (``tokens``: this request's cost): its measured drain, or before one is
        measured the slots' pace (every dispatch slot frees once per service time of a
        request like this one). ``paced``: the faster of the two, to time a promise. The
        measure alone is the rate requests *reached* a queue that was often empty, not the
        rate the slots take them: at 2.5x overload, with most arrivals shed and the queue
        holding only returning retries, it was a tenth of the engines' throughput, and
        promised turns minutes away for a backlog of seconds. The pace alone errs fast
        while the speeds are a prior: a newcomer is let into the queue on the measure."""
        measured = stats.drain_tokens_per_s if tokens else stats.drain_requests_per_s
        if not load.dispatch_slots or not service_s or (measured > 0 and not paced):
            return measured
        return max(measured, load.dispatch_slots / service_s * (tokens or 1))

    def _wait_s(
        self,
        stats: QueueStatistics,
        band: Priority,
        request: AdmissionRequest,
        load: LoadSnapshot,
        service_s: float | None,
        *,
        paced: bool = False,
    ) -> float | None:
        """The wait of a request joining ``band`` now: what is queued there and what its
        outstanding tickets will bring back, over its drain rate (None: unknown;
        ``paced``: see :meth:`_drain_rate`)."""
        promised_requests, promised_tokens = self._promised[band]
        if self.config.wait_basis == "tokens":
            queued = stats.queued_tokens + promised_tokens
            cost = max(request.cost_tokens, 1)
            rate = self._drain_rate(stats, load, service_s, cost, paced=paced)
        else:
            queued = stats.queued_requests + promised_requests
            rate = self._drain_rate(stats, load, service_s, 0, paced=paced)
        if queued <= 0 and stats.queued_requests == 0:
            return 0.0
        return queued / rate if rate > 0 else None

    def _drain_s(
        self, stats: QueueStatistics, band: Priority, load: LoadSnapshot, service_s: float | None
    ) -> float:
        """Seconds until the requests waiting in ``stats`` and those promised to
        ``band``'s tickets have been dispatched (``max_retry_after_s`` when unknown)."""
        queued = stats.queued_requests + self._promised[band][0]
        if queued <= 0:
            return 0.0
        rate = self._drain_rate(stats, load, service_s, 0, paced=True)
        return queued / rate if rate > 0 else self.config.max_retry_after_s

    def _promise(
        self,
        now: float,
        shed: Shed,
        request: AdmissionRequest,
        retry_s: float,
        promise: tuple[Priority, int],
    ) -> Shed:
        """``shed`` with a queue ticket for a retry in ``retry_s``, its Retry-After (the
        promised turn, uncapped). When that is past ``promise_horizon_s`` (the line and
        the retries already promised would take longer), no place is promised: the shed
        keeps its capped Retry-After, with no ticket (its retry is judged afresh)."""
        if shed.retry_after_s is None or not self.config.retry_tickets:
            return shed
        horizon_s = self.config.promise_horizon_s
        if retry_s > horizon_s:
            return dataclasses.replace(
                shed,
                detail=f"{shed.detail}; its turn is {retry_s:.1f} s away with the retries "
                f"already promised, past promise_horizon_s ({horizon_s:g} s): no ticket",
            )
        promised = dataclasses.replace(shed, retry_after_s=max(retry_s, 0.0))
        return self._with_ticket(now, promised, request, promise=promise)

    def _debit(self, now: float, bucket: TokenBucket | None, tokens: int, on_credit: bool) -> None:
        """Charge an admitted request to its tenant's bucket (nothing when it borrowed:
        the bucket is short) and to the pool (every tenant's, see :meth:`_pool_bucket`)."""
        if bucket is not None:
            if on_credit:
                bucket.take_on_credit(now, tokens)
            else:
                bucket.try_take(now, tokens)
        pool = self._pool_bucket(now)
        if pool is not None:
            pool.take_on_credit(now, tokens)

    def _pool_bucket(self, now: float) -> TokenBucket | None:
        """The capacity work-conserving budgets share, and the idle part of it that a
        tenant over its own bucket may borrow (None: no such budget).

        A bucket at the sum of those tenants' rates (the capacity their shares split),
        holding the largest of their bursts, charged with every request admitted, whoever's
        (tenants without a budget use the same engines: a backfill's tokens are not idle
        capacity; charged with the budgeted tenants' work only, the pool lent a flood
        what a backfill used and the light tenants' TTFT p99 more than doubled, issue 17): a
        tenant borrows only while the pool holds its request, so together they never
        take more than the capacity (a hierarchical token bucket's parent, as Linux's HTB
        lends a class's unused rate to its siblings). A burst the cluster can absorb
        passes whole; a flood several times the capacity empties the pool within seconds
        and then meets its own budget, whoever is waiting.

        The pool holds the largest burst, not their sum: the least tc-htb(8) allows a
        parent class ("burst ... should be at least as high as the highest burst of all
        children"). Unused capacity does not keep: the sum let one tenant take every
        tenant's stored burst at once, ten seconds of the cluster's work put into the
        engines in a moment, and the light tenants' calls queued behind it in the
        engines, where no wait in the gateway's queues shows it (their TTFT p99 under a
        10x flood was set by its first seconds; issue 17)."""
        if self._pool_built:
            return self._pool
        self._pool_built = True
        lending = [
            (limits.token_rate_per_s, limits.burst_tokens)
            for limits in self.config.tenants.values()
            if limits.work_conserving
            and limits.token_rate_per_s is not None
            and limits.burst_tokens is not None
        ]
        if lending:
            self._pool = TokenBucket(
                rate_per_s=sum(r for r, _ in lending),
                capacity_tokens=max(b for _, b in lending),
                now=now,
            )
        return self._pool

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
        limits = self.config.limits(request.tenant)
        burst = limits.burst_tokens
        if burst is not None and request.cost_tokens > burst:
            # A work-conserving budget lends more only from the pool, whose level never
            # passes its capacity: past that, no wait helps either.
            pool = self._pool_bucket(now) if limits.work_conserving else None
            ceiling = burst if pool is None else max(burst, pool.capacity_tokens)
            if request.cost_tokens > ceiling:
                return Shed(
                    ShedReason.TENANT_TOKEN_RATE,
                    None,
                    self.over_budget_detail(request, ceiling),
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
            # Tokens reserved by the tenant's outstanding budget tickets are not for
            # fresh requests: the retries they were promised to come first.
            cost = request.cost_tokens
            reserved = self._ticket_credit.get(request.tenant, 0.0)
            level = bucket.level(now)
            pool = self._pool_bucket(now)
            borrow = (
                limits.work_conserving
                and pool is not None
                and pool.level(now) >= cost
                and not self._contended(now, request, load, limits.contended_after_s)
            )
            if level - reserved < cost and not borrow:
                wait = (min(cost, bucket.capacity_tokens) + reserved - level) / bucket.rate_per_s
                if cost > bucket.capacity_tokens:
                    # Larger than the whole bucket (a work-conserving budget lends it idle
                    # capacity only): come back after a bucket's worth of time.
                    wait = max(wait, bucket.capacity_tokens / bucket.rate_per_s)
                shed = Shed(
                    ShedReason.TENANT_TOKEN_RATE,
                    self._cap(wait),
                    f"tenant {request.tenant!r} bucket holds {level:.0f} of "
                    f"{bucket.capacity_tokens:.0f} tokens at {bucket.rate_per_s:g}/s; the "
                    f"request costs {cost}; {reserved:.0f} tokens promised to earlier tickets",
                )
                # A budget ticket reserves the request's tokens for its retry, once they
                # and those promised before have refilled: only while all of them fit
                # the bucket, so that every promise is kept without debt.
                if not cfg.retry_tickets or cost > bucket.capacity_tokens:
                    return shed  # no ticket system; or it passes only on idle capacity
                if cost + reserved <= bucket.capacity_tokens:
                    if wait > cfg.promise_horizon_s:
                        return shed  # past the horizon: the capped hint, as for queues
                    promised = dataclasses.replace(shed, retry_after_s=wait)
                    return self._with_ticket(now, promised, request, credit_tokens=cost)
                # Every turn the bucket can promise is taken: the refill up to the time
                # named goes to the tickets before it and to the fresh requests after
                # them, so a time named here would be a guess that a retry finds spent.
                # Name none; the client paces itself.
                return dataclasses.replace(
                    shed,
                    retry_after_s=None,
                    client_backoff=True,
                    detail=f"{shed.detail}; every turn its budget can promise is taken "
                    f"({reserved:.0f} of {bucket.capacity_tokens:.0f} tokens reserved): back "
                    "off and retry",
                )
        return None

    @staticmethod
    def _over_ticket_ceiling(
        band: Priority, tenant: str, queues: QueuesStatistics
    ) -> tuple[str, QueueStatistics] | None:
        """The first queue a ticketed retry would join that holds twice its bound (the
        ceiling :meth:`PriorityQueues.push <headway.core.policy.queues.PriorityQueues.
        push>` keeps for retries at the front)."""
        stats = queues.bands[band]
        if stats.queued_requests >= 2 * stats.max_queued_requests:
            return f"band {band!r}", stats
        tenant_stats = queues.tenants.get(tenant)
        if tenant_stats is not None and (
            tenant_stats.queued_requests >= 2 * tenant_stats.max_queued_requests
        ):
            return f"tenant {tenant!r}'s queue", tenant_stats
        return None

    def _note_refusal(self, now: float, request: AdmissionRequest, shed: Shed) -> None:
        """Remember when a request was last refused for load (see :meth:`_contended`): a
        full queue, or a deadline the wait or the service at the measured speeds misses.
        A deadline already past at arrival says nothing about the load."""
        deadline_ahead = request.deadline_s is not None and request.deadline_s > now
        if shed.reason in _QUEUE_REASONS or (
            shed.reason is ShedReason.DEADLINE_UNMEETABLE and deadline_ahead
        ):
            self._refused_s = now

    def _contended(
        self, now: float, request: AdmissionRequest, load: LoadSnapshot, after_s: float
    ) -> bool:
        """Whether ``request``'s tenant competes with others now (a work-conserving budget
        binds even with idle capacity in the pool): another tenant's request has waited
        ``after_s`` in the queues; or any request was refused for load within the last
        ``after_s`` (its deadline unmeetable behind the queue or at the speeds the
        cluster now runs at, or a full queue): no capacity is idle to lend; or the
        request finds no KV room while another tenant has requests in flight (it would
        take memory the others are using).

        A refusal is the wait that never shows in the queues: with dispatch slots free,
        a flood slows the engines and calls are refused at the door as late, the light
        tenants' as often as the flood's. With waits as the only signal the flood kept
        borrowing, and at the knee the light tenants lost half their calls (issue 17).

        Full dispatch slots are not contention: a burst fills them at a load the engines
        hold, and the calls it queues start within their SLO in arrival order (the queues
        keep arrival order until a request has waited ``fair_after_s``). With full slots
        as the signal a bursty tenant was refused 67 calls at a load FIFO served at 97.5%
        (issue 17); what a flood takes from the others shows in the pool instead
        (:meth:`_pool_bucket`)."""
        if _others_waiting(load, request.tenant, after_s):
            return True
        if now - self._refused_s <= after_s:
            return True
        others = any(
            t.in_flight_requests > 0 for name, t in load.tenants.items() if name != request.tenant
        )
        if not others:
            return False
        blocks = self.projected_kv_blocks(request)
        room = load.free_kv_blocks - self.reserve_blocks(load.total_kv_blocks)
        return blocks > room

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


_QUEUE_REASONS: Final = frozenset({ShedReason.QUEUE_FULL, ShedReason.KV_PROJECTION})
"""Refusals for a full queue: the cluster's load, not the tenant's budget or size."""


def _carry_over(now: float, old: TokenBucket | None, fresh: TokenBucket | None) -> None:
    """Leave ``fresh`` (a reload's new bucket, built full) holding what ``old`` held, at
    most its own burst: a reload neither grants a fresh burst nor forgets debt."""
    if old is not None and fresh is not None:
        fresh.take_on_credit(now, fresh.level(now) - min(old.level(now), fresh.capacity_tokens))


def _others_waiting(load: LoadSnapshot, tenant: str, after_s: float) -> bool:
    """Whether a tenant other than ``tenant`` has a request that has waited ``after_s``
    in the queues (contention: a work-conserving budget binds)."""
    return any(
        stats.queued_requests > 0 and stats.oldest_wait_s >= after_s
        for name, stats in load.queues.tenants.items()
        if name != tenant
    )
