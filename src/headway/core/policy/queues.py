"""Bounded queues per priority band and per tenant, fair by token cost within a band.

:class:`PriorityQueues` is the waiting room between admission and dispatch. It is a pure
data structure: the driver pushes what admission enqueued, asks :meth:`~PriorityQueues.
try_pop` for the next request whenever a dispatch slot may be free, and calls
:meth:`~PriorityQueues.expire` to collect requests whose deadline passed while waiting.
Time comes in as ``now``; the running counts per band come in as a mapping, because the
driver owns the leases. The contract::

    shed = queues.push(now, item, band="interactive", tenant="acme", cost_tokens=2900,
                       deadline_s=deadline_s)        # None: queued; Shed: refused
    for gone in queues.expire(now): ...              # terminal: EXPIRED, never dispatched
    got = queues.try_pop(now, total_slots=64, running=running_by_band)
    if got is not None: running_by_band[got.band] += 1; dispatch(got.item)

Ordering rules, from the outside in (seed 002: "use bounded per-tenant and per-priority
queues; reserve capacity for critical classes"; seed 000: "background work uses ... a
strictly controlled share"):

1. **Slots.** A band may dispatch only while it has a free slot: ``critical`` may use any
   free slot; the other bands together never hold more than ``total_slots -
   critical_reserved_slots``; ``background`` never holds more than ``background_max_share``
   of ``total_slots`` (at least one when the share is > 0).
2. **Strict priority across bands**: ``critical``, then ``interactive``, then
   ``background``, among the bands that have a free slot.
3. **Ageing**: a band's oldest request that has waited ``k * max_wait_s`` competes ``k``
   bands higher (never above ``critical``) and goes before that band's own requests. It
   still counts against its own band's slots and cap: ageing changes order, not shares.
4. **Arrival order until someone waits**: while a band's oldest request has waited less
   than ``fair_after_s``, the band serves its oldest request first, whatever its tenant
   (what a lone engine's FIFO would do), so a tenant within its share is not reordered
   behind others while nobody is kept waiting; the fair-queuing tags below still advance
   with every request served, so the tenant that took most is the one served last once
   waits grow.
5. **Weighted fair queuing by token cost within a band**, between tenants, once a band's
   oldest request has waited ``fair_after_s`` (contention). The variant is
   start-time fair queuing (SFQ, Goyal, Vin and Cheng 1996): each tenant's head request
   gets a start tag ``S = max(V, F_tenant)``; the head with the smallest ``S`` is served
   (ties: the earlier push); serving it sets ``V = S`` and ``F_tenant = S + cost_tokens /
   weight``. Over a backlogged period each tenant receives token service proportional to
   its weight, within one request's cost. Tags are given when a request reaches the head
   of its tenant's FIFO, not at push, so a request removed by expiry never charges its
   tenant. SFQ needs no estimate of the server's rate, which suits an engine whose speed
   changes with batch shape.
6. Within a tenant and band: first in, first out.

Expiry: a request whose ``deadline_s <= now`` is never dispatched; :meth:`try_pop` sets
such requests aside and the next :meth:`expire` returns them, so none is lost.

Complexity: push O(log T), pop O(B log n) amortised, expiry O(log n) per request (T
tenants, B = 3 bands, n queued); removal is lazy (entries are marked and skipped), with
heaps compacted when stale entries outnumber live ones.

Drain rates (requests and tokens dispatched per second over ``drain_window_s``) are
measured here, per band and per tenant, and reported by :meth:`~PriorityQueues.statistics`
(named after AnyIO's ``MemoryObjectStream.statistics()``); admission turns them into
predicted waits and ``retry_after_s``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar

import msgspec

from headway.core.policy._checks import is_finite_above, require
from headway.core.policy.decisions import Shed, ShedReason
from headway.core.policy.rates import WindowCounter
from headway.core.workload.spec import PRIORITIES, Priority

__all__ = [
    "BANDS",
    "FAIR_AFTER_S",
    "Band",
    "BandConfig",
    "PriorityQueues",
    "QueueConfig",
    "QueueStatistics",
    "Queued",
    "QueuesStatistics",
    "WaitBasis",
]

T = TypeVar("T")

Band = Priority
"""A priority band; the bands are the workload's priorities."""

BANDS: Final[tuple[Band, ...]] = PRIORITIES
"""The bands, most important first (index = level)."""

SLOTS_PER_RESERVED: Final = 16
"""The default critical reserve: one slot per this many dispatch slots ..."""

MAX_AUTO_RESERVED_SLOTS: Final = 2
"""... and at most this many (enough for a probe and a control action)."""

FAIR_AFTER_S: Final = 0.5
"""How long a band's oldest request waits before fair queuing orders the band
(:attr:`QueueConfig.fair_after_s`); also when a work-conserving tenant budget binds
(``TenantLimits.contended_after_s``): one notion of contention for both."""

WaitBasis = Literal["tokens", "requests"]
"""Whether a predicted wait divides queued tokens by the token drain rate, or queued
requests by the request drain rate."""


def _check_band(band: str) -> Band:
    if band not in BANDS:
        raise ValueError(f"unknown queue band {band!r}; use one of {', '.join(BANDS)}")
    return band


# ----------------------------------------------------------------------------- config


class BandConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The bound and the ageing of one priority band."""

    max_queued_requests: int
    """Requests that may wait in this band; one more is shed with QUEUE_FULL (HTTP 429).
    0 means the band never waits: without a free slot its requests are shed."""

    max_wait_s: float | None = None
    """Ageing: a request that has waited this long competes one band higher, and one more
    for each further ``max_wait_s``, so that nothing starves. None: never promoted."""

    def __post_init__(self) -> None:
        require(
            self.max_queued_requests >= 0,
            "queues.<band>",
            "max_queued_requests",
            self.max_queued_requests,
            "use 0 to shed instead of queueing, or a positive bound",
        )
        require(
            is_finite_above(self.max_wait_s, 0.0),
            "queues.<band>",
            "max_wait_s",
            self.max_wait_s,
            "use a number of seconds > 0, or null to turn ageing off",
        )


class QueueConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Bounds, shares and fairness of the waiting room."""

    critical: BandConfig = BandConfig(max_queued_requests=32)
    """Reconciliation, control actions, probes: small, never aged (it is the top band)."""

    interactive: BandConfig = BandConfig(max_queued_requests=128, max_wait_s=10.0)
    """People waiting for an answer; promoted after 10 s so a flood of critical work
    cannot starve them."""

    background: BandConfig = BandConfig(max_queued_requests=512, max_wait_s=30.0)
    """Backfills and batch work: a deep queue (it tolerates waiting), promoted after 30 s
    so a constant interactive stream cannot starve it."""

    max_queued_per_tenant: int = 64
    """Requests one tenant may have waiting across bands; one more is shed with
    QUEUE_FULL. Half the interactive bound, so one tenant cannot fill it alone."""

    tenant_weights: dict[str, float] = msgspec.field(default_factory=dict)
    """Fair-queuing weight per tenant (the workload's ``tenants.<name>.weight``): weight 2
    is owed twice the token service of weight 1 within a band."""

    default_tenant_weight: float = 1.0
    """Weight of a tenant missing from ``tenant_weights``."""

    critical_reserved_slots: int | None = None
    """Dispatch slots that only ``critical`` may use: the other bands together never hold
    more than ``total_slots - critical_reserved_slots`` (seed 003: "preserve a reserve for
    health probes and high-priority traffic"). None (the default): one per
    :data:`SLOTS_PER_RESERVED` slots, at most :data:`MAX_AUTO_RESERVED_SLOTS`, so a small
    pool keeps its slots for interactive work (4 slots: none reserved; 16: one; 32 or
    more: two) and the reserve is never more than a sixteenth of them."""

    background_max_share: float = 0.25
    """Most of the dispatch slots ``background`` may hold at once, as a fraction (at least
    one slot when > 0); seed 000's "strictly controlled share"."""

    drain_window_s: float = 10.0
    """Window over which drain rates are measured: long enough to span several
    completions, short enough to follow a burst."""

    fair_after_s: float = FAIR_AFTER_S
    """Fair queuing orders a band once its oldest request has waited this long; until
    then the band serves in arrival order across tenants. Fairness is for contention: at
    a load the engines hold, reordering only moves one tenant's calls behind another's
    (a bursty tenant's burst behind a steady tenant's stream) and costs it attainment
    that FIFO would have kept (issue 17). 0: always fair (strict SFQ)."""

    def __post_init__(self) -> None:
        require(
            self.max_queued_per_tenant >= 1,
            "queues",
            "max_queued_per_tenant",
            self.max_queued_per_tenant,
            "use 1 or more",
        )
        for tenant, weight in self.tenant_weights.items():
            require(
                math.isfinite(weight) and weight > 0,
                "queues",
                f"tenant_weights.{tenant}",
                weight,
                "use a weight > 0 (1 is the default share)",
            )
        require(
            math.isfinite(self.default_tenant_weight) and self.default_tenant_weight > 0,
            "queues",
            "default_tenant_weight",
            self.default_tenant_weight,
            "use a weight > 0",
        )
        require(
            self.critical_reserved_slots is None or self.critical_reserved_slots >= 0,
            "queues",
            "critical_reserved_slots",
            self.critical_reserved_slots,
            "use 0 for no reserve, or null for the default (1 per 16 slots, at most 2)",
        )
        require(
            0.0 <= self.background_max_share <= 1.0,
            "queues",
            "background_max_share",
            self.background_max_share,
            "use a fraction in [0, 1], e.g. 0.25",
        )
        require(
            math.isfinite(self.drain_window_s) and self.drain_window_s > 0,
            "queues",
            "drain_window_s",
            self.drain_window_s,
            "use a number of seconds > 0, e.g. 10",
        )
        require(
            math.isfinite(self.fair_after_s) and self.fair_after_s >= 0,
            "queues",
            "fair_after_s",
            self.fair_after_s,
            "use seconds >= 0 (0: always fair-queue; default 0.5)",
        )

    def band(self, band: Band) -> BandConfig:
        """The config of ``band``."""
        if band == "critical":
            return self.critical
        if band == "interactive":
            return self.interactive
        return self.background

    def weight(self, tenant: str) -> float:
        """The fair-queuing weight of ``tenant``."""
        return self.tenant_weights.get(tenant, self.default_tenant_weight)

    def reserved_slots(self, total_slots: int) -> int:
        """The slots only ``critical`` may use when there are ``total_slots``."""
        if self.critical_reserved_slots is not None:
            return self.critical_reserved_slots
        return min(MAX_AUTO_RESERVED_SLOTS, max(total_slots, 0) // SLOTS_PER_RESERVED)

    def background_cap_slots(self, total_slots: int) -> int:
        """Most slots ``background`` may hold when there are ``total_slots``."""
        if self.background_max_share <= 0:
            return 0
        return max(1, math.floor(self.background_max_share * total_slots))


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True, kw_only=True)
class Queued(Generic[T]):
    """A request in (or leaving) the queues, with what the queues know about it."""

    item: T
    """The driver's request object."""

    band: Band
    """The band it waits in (and whose slots it uses when dispatched)."""

    tenant: str
    """Whose request it is."""

    cost_tokens: int
    """Its token cost for fair queuing: prompt plus projected output tokens."""

    enqueued_s: float
    """When it was pushed."""

    deadline_s: float | None
    """When it expires if still waiting (None: never)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStatistics:
    """One queue (a band, or one tenant's requests across bands) at one moment."""

    queued_requests: int
    """Requests waiting."""

    queued_tokens: int
    """Their token cost."""

    max_queued_requests: int
    """The bound; at it, one more is shed with QUEUE_FULL."""

    drain_requests_per_s: float
    """Requests dispatched from it per second, measured over the drain window."""

    drain_tokens_per_s: float
    """Tokens (cost) dispatched from it per second, measured over the drain window."""

    oldest_wait_s: float
    """How long its oldest request has waited (0 when empty)."""

    @property
    def full(self) -> bool:
        """True when one more request would exceed the bound."""
        return self.queued_requests >= self.max_queued_requests

    def time_to_drain_s(self, *, max_s: float) -> float:
        """Seconds until the requests waiting now have been dispatched, at the measured
        rate: ``queued_requests / drain_requests_per_s``, at most ``max_s`` (also when
        nothing has drained within the window, so the rate is unknown)."""
        if self.queued_requests == 0:
            return 0.0
        if self.drain_requests_per_s <= 0:
            return max_s
        return min(self.queued_requests / self.drain_requests_per_s, max_s)

    def predicted_wait_s(self, basis: WaitBasis) -> float | None:
        """The wait of a request joining now: what is queued divided by its drain rate,
        in tokens or in requests. None when something waits but nothing has drained
        within the window (the wait is unknown, not zero)."""
        queued = self.queued_tokens if basis == "tokens" else self.queued_requests
        rate = self.drain_tokens_per_s if basis == "tokens" else self.drain_requests_per_s
        if queued == 0 and self.queued_requests == 0:
            return 0.0
        if rate <= 0:
            return None
        return queued / rate


K = TypeVar("K")


class _OnRead(Mapping[K, "QueueStatistics"]):
    """Statistics per key, each computed when first read (admission reads one band and
    one tenant of an offer's snapshot; computing every band's and tenant's windowed
    rates for each offer was a third of its cost). Read it before the queues change."""

    __slots__ = ("_compute", "_done", "_keys")

    def __init__(self, keys: Iterable[K], compute: Callable[[K], QueueStatistics]) -> None:
        self._keys = dict.fromkeys(keys)
        self._compute = compute
        self._done: dict[K, QueueStatistics] = {}

    def __getitem__(self, key: K) -> QueueStatistics:
        got = self._done.get(key)
        if got is None:
            if key not in self._keys:
                raise KeyError(key)
            got = self._done[key] = self._compute(key)
        return got

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[K]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuesStatistics:
    """All queues at one moment, and the running totals that must balance:
    ``pushed == dispatched + expired + queued``."""

    bands: Mapping[Band, QueueStatistics]
    """Per band, every band present."""

    tenants: Mapping[str, QueueStatistics]
    """Per tenant seen so far, across bands."""

    pushed: int
    """Requests accepted by :meth:`PriorityQueues.push`."""

    rejected: int
    """Requests refused by :meth:`PriorityQueues.push` (a bound, or already expired)."""

    dispatched: int
    """Requests returned by :meth:`PriorityQueues.try_pop`."""

    expired: int
    """Requests removed at their deadline (returned or about to be returned by
    :meth:`PriorityQueues.expire`)."""

    band_counts: Mapping[Band, int] | None = None
    """Requests waiting per band, when known without :attr:`bands`' windowed rates
    (None: read from :attr:`bands`)."""

    @property
    def queued_requests(self) -> int:
        """Requests waiting in all bands."""
        return sum(self.queued_in(b) for b in self.bands)

    def queued_in(self, band: Band) -> int:
        """Requests waiting in ``band`` (0 for a band not present), without computing
        its drain rates where the counts are known."""
        if self.band_counts is not None:
            return self.band_counts.get(band, 0)
        return self.bands[band].queued_requests if band in self.bands else 0

    def queued_through(self, band: Band) -> int:
        """Requests waiting in ``band`` and every band ahead of it (admission asks on
        every offer whether anything is ahead of a new request)."""
        total = 0
        for b in BANDS:
            total += self.queued_in(b)
            if b == band:
                break
        return total


# ----------------------------------------------------------------------------- internals


class _Entry(Generic[T]):
    """One queued request and its bookkeeping (mutable; never leaves this module)."""

    __slots__ = ("alive", "front", "queued", "seq", "start_tag")

    def __init__(self, queued: Queued[T], seq: int) -> None:
        self.queued = queued
        self.seq = seq
        self.alive = True
        self.start_tag = 0.0
        self.front = False
        """Pushed to the front of its tenant's line (a redeemed retry ticket)."""


class _Meter:
    """Requests and tokens dispatched, over the drain window."""

    __slots__ = ("requests", "tokens")

    def __init__(self, window_s: float, start_s: float) -> None:
        self.requests = WindowCounter(window_s, start_s=start_s)
        self.tokens = WindowCounter(window_s, start_s=start_s)

    def add(self, now: float, cost_tokens: int) -> None:
        self.requests.add(now, 1.0)
        self.tokens.add(now, float(cost_tokens))


class _BandQueue(Generic[T]):
    """One band: a FIFO per tenant, SFQ between tenants, and the oldest head for ageing.

    Invariant: every tenant in ``fifos`` has a live head (dead entries are dropped from the
    front eagerly and skipped further back), and that head has one valid entry in each
    heap. Heap entries are ``(key, seq, tenant)``; an entry is stale when the tenant's head
    no longer has that ``seq``.
    """

    __slots__ = (
        "count",
        "fifos",
        "finish_tags",
        "oldest_heap",
        "tag_heap",
        "tokens",
        "virtual_time",
        "weight",
    )

    def __init__(self, config: QueueConfig) -> None:
        self.fifos: dict[str, deque[_Entry[T]]] = {}
        self.tag_heap: list[tuple[float, int, str]] = []
        self.oldest_heap: list[tuple[float, int, str]] = []
        self.finish_tags: dict[str, float] = {}
        self.virtual_time = 0.0
        self.count = 0
        self.tokens = 0
        self.weight = config.weight

    def append(self, entry: _Entry[T], *, front: bool = False) -> None:
        tenant = entry.queued.tenant
        fifo = self.fifos.get(tenant)
        self.count += 1
        self.tokens += entry.queued.cost_tokens
        if fifo is None:
            self.fifos[tenant] = deque((entry,))
            self._tag_head(tenant)
        elif front:
            # Behind the tickets redeemed before it (they were promised earlier places),
            # ahead of everything else.
            at = 0
            while at < len(fifo) and fifo[at].front and fifo[at].alive:
                at += 1
            fifo.insert(at, entry)
            if at == 0:
                self._tag_head(tenant)  # the old head's heap entries go stale by seq
        else:
            fifo.append(entry)

    def _tag_head(self, tenant: str) -> None:
        """Drop dead entries at the front; tag the live head and index it (or forget the
        tenant when nothing live is left)."""
        fifo = self.fifos[tenant]
        while fifo and not fifo[0].alive:
            fifo.popleft()
        if not fifo:
            del self.fifos[tenant]
            return
        head = fifo[0]
        head.start_tag = max(self.virtual_time, self.finish_tags.get(tenant, 0.0))
        heapq.heappush(self.tag_heap, (head.start_tag, head.seq, tenant))
        heapq.heappush(self.oldest_heap, (head.queued.enqueued_s, head.seq, tenant))
        if len(self.tag_heap) > 2 * len(self.fifos) + 32:
            self._compact()

    def _compact(self) -> None:
        heads = [fifo[0] for fifo in self.fifos.values()]
        self.tag_heap = [(e.start_tag, e.seq, e.queued.tenant) for e in heads]
        self.oldest_heap = [(e.queued.enqueued_s, e.seq, e.queued.tenant) for e in heads]
        heapq.heapify(self.tag_heap)
        heapq.heapify(self.oldest_heap)

    def _peek(self, heap: list[tuple[float, int, str]]) -> _Entry[T] | None:
        while heap:
            _, seq, tenant = heap[0]
            fifo = self.fifos.get(tenant)
            if fifo is not None and fifo[0].seq == seq:
                return fifo[0]
            heapq.heappop(heap)
        return None

    def next_fair(self) -> _Entry[T] | None:
        """The head with the smallest start tag (SFQ's next)."""
        return self._peek(self.tag_heap)

    def oldest(self) -> _Entry[T] | None:
        """The request that has waited longest (a tenant's head, since FIFOs are ordered
        by push time)."""
        return self._peek(self.oldest_heap)

    def _among(
        self, head: _Entry[T] | None, eligible: Callable[[str], bool], key: int
    ) -> _Entry[T] | None:
        """``head`` when its tenant is eligible, else the eligible tenants' head with the
        smallest key (0: start tag, 1: enqueue time; a scan of the tenants' heads)."""
        if head is None or eligible(head.queued.tenant):
            return head
        best: _Entry[T] | None = None
        best_key: tuple[float, int] | None = None
        for tenant, fifo in self.fifos.items():
            if not eligible(tenant):
                continue
            entry = fifo[0]
            k = (entry.start_tag if key == 0 else entry.queued.enqueued_s, entry.seq)
            if best_key is None or k < best_key:
                best, best_key = entry, k
        return best

    def next_fair_among(self, eligible: Callable[[str], bool]) -> _Entry[T] | None:
        """:meth:`next_fair` among the tenants ``eligible`` accepts."""
        return self._among(self.next_fair(), eligible, 0)

    def oldest_among(self, eligible: Callable[[str], bool]) -> _Entry[T] | None:
        """:meth:`oldest` among the tenants ``eligible`` accepts."""
        return self._among(self.oldest(), eligible, 1)

    def serve(self, entry: _Entry[T]) -> None:
        """Dispatch ``entry``, the head of its tenant's FIFO; charge the tenant."""
        tenant = entry.queued.tenant
        fifo = self.fifos[tenant]
        if fifo[0] is not entry:
            raise AssertionError("only a tenant's head can be served")  # a bug here
        fifo.popleft()
        entry.alive = False
        self.count -= 1
        self.tokens -= entry.queued.cost_tokens
        self.virtual_time = max(self.virtual_time, entry.start_tag)
        cost = max(entry.queued.cost_tokens, 1)
        self.finish_tags[tenant] = entry.start_tag + cost / self.weight(tenant)
        self._tag_head(tenant)

    def remove(self, entry: _Entry[T]) -> None:
        """Remove ``entry`` unserved (expiry): its tenant is not charged."""
        entry.alive = False
        self.count -= 1
        self.tokens -= entry.queued.cost_tokens
        tenant = entry.queued.tenant
        fifo = self.fifos.get(tenant)
        if fifo is not None and fifo[0] is entry:
            self._tag_head(tenant)


# ----------------------------------------------------------------------------- the queues


class PriorityQueues(Generic[T]):
    """Bounded per-band, per-tenant queues with strict priority, a critical reserve, a
    background cap, ageing, SFQ fairness and deadline expiry (see the module docstring).
    """

    def __init__(self, config: QueueConfig | None = None) -> None:
        self.config = config if config is not None else QueueConfig()
        self._bands: dict[Band, _BandQueue[T]] = {b: _BandQueue(self.config) for b in BANDS}
        self._deadlines: list[tuple[float, int, _Entry[T]]] = []
        self._pending_expired: list[Queued[T]] = []
        self._tenant_count: dict[str, int] = {}
        self._tenant_tokens: dict[str, int] = {}
        self._band_meters: dict[Band, _Meter] = {}
        self._tenant_meters: dict[str, _Meter] = {}
        self._seq = itertools.count()
        self._start_s: float | None = None
        self._last_s: float | None = None
        self._pushed = 0
        self._rejected = 0
        self._dispatched = 0
        self._expired = 0
        self._withdrawn = 0
        self._live = 0

    def reconfigure(self, config: QueueConfig) -> None:
        """Take ``config`` from now on (a live reload): new bounds, reserves, caps and
        ageing apply to the next push and pop; new tenant weights to the next finish tag.
        Queued entries keep their places (a line over a lowered bound drains, nothing is
        dropped). The drain-rate window keeps its length until the queues are rebuilt."""
        self.config = config
        for band in self._bands.values():
            band.weight = config.weight

    # -- time ---------------------------------------------------------------------------

    def _touch(self, now: float) -> None:
        """Check that time moves forward; start the meters at the first call."""
        if not math.isfinite(now):
            raise ValueError(f"PriorityQueues: now must be a finite time (got {now})")
        if self._last_s is not None and now < self._last_s:
            raise ValueError(
                f"PriorityQueues: time went backwards (now={now}, last seen {self._last_s})"
            )
        self._last_s = now
        if self._start_s is None:
            self._start_s = now
            window_s = self.config.drain_window_s
            self._band_meters = {b: _Meter(window_s, now) for b in BANDS}

    def _tenant_meter(self, tenant: str) -> _Meter:
        meter = self._tenant_meters.get(tenant)
        if meter is None:
            assert self._start_s is not None  # _touch ran first
            meter = _Meter(self.config.drain_window_s, self._start_s)
            self._tenant_meters[tenant] = meter
        return meter

    # -- push ---------------------------------------------------------------------------

    def push(
        self,
        now: float,
        item: T,
        *,
        band: str,
        tenant: str,
        cost_tokens: int,
        deadline_s: float | None = None,
        max_retry_after_s: float = 60.0,
        front: bool = False,
    ) -> Shed | None:
        """Queue ``item``; return None, or a :class:`Shed` when a bound refuses it.

        Bounds: the band's ``max_queued_requests`` and ``max_queued_per_tenant`` give
        QUEUE_FULL with ``retry_after_s`` = the time for that queue's backlog to drain at
        its measured rate (at most ``max_retry_after_s``). A deadline already past gives
        DEADLINE_UNMEETABLE with no retry. Admission checks the same bounds first; this
        check keeps the bound true whoever calls.

        ``front``: a retry admission let in on its retry ticket. It joins the front of its
        tenant's line in the band, behind the tickets redeemed before it (they were
        promised earlier places), and may exceed the bounds (by the tickets redeemed while
        a queue is full), but never twice a bound; its deadline still applies.
        """
        checked = _check_band(band)
        if cost_tokens < 0:
            raise ValueError(f"cost_tokens must be >= 0 (got {cost_tokens})")
        if deadline_s is not None and math.isnan(deadline_s):
            raise ValueError("deadline_s must be a time or None, not NaN")
        self._touch(now)
        self._tenant_meter(tenant)
        refusal = self._refusal(now, checked, tenant, deadline_s, max_retry_after_s, front)
        if refusal is not None:
            self._rejected += 1
            return refusal
        queued = Queued(
            item=item,
            band=checked,
            tenant=tenant,
            cost_tokens=cost_tokens,
            enqueued_s=now,
            deadline_s=deadline_s,
        )
        entry = _Entry(queued, next(self._seq))
        entry.front = front
        self._bands[checked].append(entry, front=front)
        if deadline_s is not None:
            heapq.heappush(self._deadlines, (deadline_s, entry.seq, entry))
        self._tenant_count[tenant] = self._tenant_count.get(tenant, 0) + 1
        self._tenant_tokens[tenant] = self._tenant_tokens.get(tenant, 0) + cost_tokens
        self._pushed += 1
        self._live += 1
        return None

    def _refusal(
        self,
        now: float,
        band: Band,
        tenant: str,
        deadline_s: float | None,
        max_retry_after_s: float,
        front: bool,
    ) -> Shed | None:
        if deadline_s is not None and deadline_s <= now:
            return Shed(
                ShedReason.DEADLINE_UNMEETABLE,
                None,
                f"deadline {deadline_s:.3f} s had passed when it was queued at {now:.3f} s",
            )
        bound = self.config.band(band).max_queued_requests
        tenant_bound = self.config.max_queued_per_tenant
        if front:
            # A ticketed retry may pass a full bound, but not twice the bound: tickets
            # promise at most a bound's worth of places (see AdmissionPolicy).
            if self._bands[band].count >= 2 * bound:
                stats = self._band_statistics(now, band)
                return Shed(
                    ShedReason.QUEUE_FULL,
                    stats.time_to_drain_s(max_s=max_retry_after_s),
                    f"band {band!r} holds {stats.queued_requests} requests, twice its bound "
                    f"of {bound}: no more ticketed retries fit",
                )
            if self._tenant_count.get(tenant, 0) >= 2 * tenant_bound:
                stats = self._tenant_statistics(now, tenant)
                return Shed(
                    ShedReason.QUEUE_FULL,
                    stats.time_to_drain_s(max_s=max_retry_after_s),
                    f"tenant {tenant!r} has {stats.queued_requests} requests queued, twice "
                    f"its bound of {tenant_bound}: no more ticketed retries fit",
                )
            return None
        if self._bands[band].count >= bound:
            stats = self._band_statistics(now, band)
            return Shed(
                ShedReason.QUEUE_FULL,
                stats.time_to_drain_s(max_s=max_retry_after_s),
                f"band {band!r} holds {stats.queued_requests} of {bound} requests, "
                f"draining {stats.drain_requests_per_s:.3g}/s",
            )
        if self._tenant_count.get(tenant, 0) >= tenant_bound:
            stats = self._tenant_statistics(now, tenant)
            return Shed(
                ShedReason.QUEUE_FULL,
                stats.time_to_drain_s(max_s=max_retry_after_s),
                f"tenant {tenant!r} has {stats.queued_requests} of {tenant_bound} requests "
                f"queued, draining {stats.drain_requests_per_s:.3g}/s",
            )
        return None

    # -- slots and pop ------------------------------------------------------------------

    def _check_slots(self, total_slots: int) -> None:
        reserved = self.config.reserved_slots(total_slots)
        if 0 < total_slots <= reserved:
            raise ValueError(
                f"total_slots ({total_slots}) must exceed queues.critical_reserved_slots "
                f"({reserved}), or only critical work could ever run; raise the slots or "
                "lower the reserve"
            )

    def free_slots(self, band: str, *, total_slots: int, running: Mapping[str, int]) -> int:
        """Dispatch slots ``band`` may take now, given ``total_slots`` and the requests
        running per band (the critical reserve and the background cap applied)."""
        checked = _check_band(band)
        return self.free_slots_by_band(total_slots=total_slots, running=running)[checked]

    def free_slots_by_band(
        self, *, total_slots: int, running: Mapping[str, int]
    ) -> dict[Band, int]:
        """:meth:`free_slots` for every band, in one pass (admission's snapshot reads it
        on every offer)."""
        cfg = self.config
        self._check_slots(total_slots)
        critical = running.get("critical", 0)
        background = running.get("background", 0)
        in_use = critical + running.get("interactive", 0) + background
        free = total_slots - in_use
        shared = min(free, total_slots - cfg.reserved_slots(total_slots) - (in_use - critical))
        capped = min(shared, cfg.background_cap_slots(total_slots) - background)
        return {
            "critical": max(free, 0),
            "interactive": max(shared, 0),
            "background": max(capped, 0),
        }

    def try_pop(
        self,
        now: float,
        *,
        total_slots: int,
        running: Mapping[str, int],
        fits: Callable[[Queued[T]], bool] | None = None,
        eligible: Callable[[str], bool] | None = None,
    ) -> Queued[T] | None:
        """The next request to dispatch now, or None when nothing may go.

        ``running`` counts the requests dispatched and not yet finished, per band; the
        caller adds the returned request to it. Requests past their deadline are set aside
        for :meth:`expire`, never returned. ``fits`` is token-aware dispatch: when the
        request the order picks does not fit the engine now (``fits`` returns False), it
        stays at its place and nothing is dispatched: no other request overtakes it, so a
        large request is delayed, never starved.

        ``eligible`` is a per-tenant dispatch cap (the gateway's slot shares): a tenant it
        rejects is passed over as if its requests were not queued (they keep their place
        and their fair-queuing tags), so a tenant at its cap never blocks the others.
        """
        self._touch(now)
        self._check_slots(total_slots)
        self._collect_expired(now)
        chosen = self._choose(now, total_slots, running, eligible)
        if chosen is None:
            return None
        band, entry = chosen
        if fits is not None and not fits(entry.queued):
            return None
        self._bands[band].serve(entry)
        queued = entry.queued
        self._band_meters[band].add(now, queued.cost_tokens)
        self._tenant_meter(queued.tenant).add(now, queued.cost_tokens)
        self._forget(queued)
        self._dispatched += 1
        return queued

    def _choose(
        self,
        now: float,
        total_slots: int,
        running: Mapping[str, int],
        eligible: Callable[[str], bool] | None,
    ) -> tuple[Band, _Entry[T]] | None:
        """The entry the order picks among ``eligible`` tenants' (None: every tenant's)."""
        best: tuple[int, int, float, int] | None = None
        chosen: tuple[Band, _Entry[T]] | None = None
        for level, band in enumerate(BANDS):
            queue = self._bands[band]
            if queue.count == 0:
                continue
            if self.free_slots(band, total_slots=total_slots, running=running) <= 0:
                continue
            max_wait_s = self.config.band(band).max_wait_s
            oldest = queue.oldest() if eligible is None else queue.oldest_among(eligible)
            if max_wait_s is not None and oldest is not None:
                steps = math.floor((now - oldest.queued.enqueued_s) / max_wait_s)
                effective = max(0, level - steps)
                if effective < level:
                    key = (effective, 0, oldest.queued.enqueued_s, oldest.seq)
                    if best is None or key < best:
                        best, chosen = key, (band, oldest)
            if oldest is not None and now - oldest.queued.enqueued_s < self.config.fair_after_s:
                head: _Entry[T] | None = oldest  # nobody kept waiting: arrival order
            else:
                head = queue.next_fair() if eligible is None else queue.next_fair_among(eligible)
            if head is not None:
                key = (level, 1, 0.0, 0)
                if best is None or key < best:
                    best, chosen = key, (band, head)
        return chosen

    # -- expiry -------------------------------------------------------------------------

    def _collect_expired(self, now: float) -> None:
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, entry = heapq.heappop(heap)
            if not entry.alive:
                continue
            self._bands[entry.queued.band].remove(entry)
            self._forget(entry.queued)
            self._expired += 1
            self._pending_expired.append(entry.queued)
        if len(heap) > 2 * self._live + 64:
            self._deadlines = [d for d in heap if d[2].alive]
            heapq.heapify(self._deadlines)

    def expire(self, now: float) -> list[Queued[T]]:
        """Remove and return every waiting request whose ``deadline_s <= now`` (also those
        :meth:`try_pop` set aside), earliest deadline first."""
        self._touch(now)
        self._collect_expired(now)
        gone, self._pending_expired = self._pending_expired, []
        return gone

    def next_deadline_s(self) -> float | None:
        """When :meth:`expire` next has a request to return: the earliest deadline among
        those waiting or already set aside as expired (None: no waiting request has one).
        A driver arms its one expiry timer from it."""
        pending = [q.deadline_s for q in self._pending_expired if q.deadline_s is not None]
        heap = self._deadlines
        while heap and not heap[0][2].alive:
            heapq.heappop(heap)
        waiting = [heap[0][0]] if heap else []
        return min([*pending, *waiting], default=None)

    def withdraw(self, item: T, band: Band, tenant: str) -> bool:
        """Remove ``item`` unserved because its client went away (its tenant is not charged
        and its place frees at once, so abandoned requests never hold a queue's bound).
        False when it is not waiting (already dispatched, expired or withdrawn). A scan of
        the tenant's line in its band: at most ``max_queued_per_tenant`` entries."""
        queue = self._bands[band]
        for entry in queue.fifos.get(tenant, ()):
            if entry.alive and entry.queued.item is item:
                queue.remove(entry)
                self._forget(entry.queued)
                self._withdrawn += 1
                return True
        return False

    def _forget(self, queued: Queued[T]) -> None:
        self._live -= 1
        self._tenant_count[queued.tenant] -= 1
        self._tenant_tokens[queued.tenant] -= queued.cost_tokens

    # -- statistics ---------------------------------------------------------------------

    def __len__(self) -> int:
        return self._live

    def _band_statistics(self, now: float, band: Band) -> QueueStatistics:
        queue = self._bands[band]
        meter = self._band_meters[band]
        oldest = queue.oldest()
        return QueueStatistics(
            queued_requests=queue.count,
            queued_tokens=queue.tokens,
            max_queued_requests=self.config.band(band).max_queued_requests,
            drain_requests_per_s=meter.requests.rate_per_s(now),
            drain_tokens_per_s=meter.tokens.rate_per_s(now),
            oldest_wait_s=0.0 if oldest is None else now - oldest.queued.enqueued_s,
        )

    def _tenant_statistics(self, now: float, tenant: str) -> QueueStatistics:
        meter = self._tenant_meter(tenant)
        heads = [
            fifo[0].queued.enqueued_s
            for queue in self._bands.values()
            if (fifo := queue.fifos.get(tenant)) is not None
        ]
        return QueueStatistics(
            queued_requests=self._tenant_count.get(tenant, 0),
            queued_tokens=self._tenant_tokens.get(tenant, 0),
            max_queued_requests=self.config.max_queued_per_tenant,
            drain_requests_per_s=meter.requests.rate_per_s(now),
            drain_tokens_per_s=meter.tokens.rate_per_s(now),
            oldest_wait_s=now - min(heads) if heads else 0.0,
        )

    def oldest_wait_s(self, now: float) -> float:
        """How long the oldest request waiting in any band has waited (0 when none)."""
        heads = [o.queued.enqueued_s for q in self._bands.values() if (o := q.oldest())]
        return now - min(heads) if heads else 0.0

    def statistics(self, now: float) -> QueuesStatistics:
        """Every band and every tenant seen so far, at ``now`` (each computed when first
        read: read them before the queues change)."""
        self._touch(now)
        self._collect_expired(now)
        return QueuesStatistics(
            bands=_OnRead(BANDS, lambda b: self._band_statistics(now, b)),
            tenants=_OnRead(self._tenant_meters, lambda t: self._tenant_statistics(now, t)),
            band_counts={b: q.count for b, q in self._bands.items()},
            pushed=self._pushed,
            rejected=self._rejected,
            dispatched=self._dispatched,
            expired=self._expired,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping disagrees with the queues' contents."""
        live_total = 0
        per_tenant: dict[str, int] = {}
        tenant_fronts: dict[str, int] = {}
        for band, queue in self._bands.items():
            live = [e for fifo in queue.fifos.values() for e in fifo if e.alive]
            assert len(live) == queue.count, f"band {band}: count {queue.count} != {len(live)}"
            assert sum(e.queued.cost_tokens for e in live) == queue.tokens, f"band {band} tokens"
            fronts = sum(1 for e in live if e.front)
            bound = self.config.band(band).max_queued_requests
            assert queue.count - fronts <= bound, f"{band} over bound"
            for tenant, fifo in queue.fifos.items():
                assert fifo, f"band {band}: tenant {tenant} has an empty FIFO"
                assert fifo[0].alive, f"band {band}: tenant {tenant} head not live"
                times = [e.queued.enqueued_s for e in fifo if e.alive and not e.front]
                assert times == sorted(times), f"band {band}: tenant {tenant} not FIFO"
            for e in live:
                per_tenant[e.queued.tenant] = per_tenant.get(e.queued.tenant, 0) + 1
                if e.front:
                    tenant_fronts[e.queued.tenant] = tenant_fronts.get(e.queued.tenant, 0) + 1
            live_total += len(live)
        assert live_total == self._live, f"live {self._live} != {live_total}"
        for tenant, count in self._tenant_count.items():
            assert count == per_tenant.get(tenant, 0), f"tenant {tenant} count"
            bound = self.config.max_queued_per_tenant
            assert count - tenant_fronts.get(tenant, 0) <= bound, f"tenant {tenant} over bound"
        balance = self._dispatched + self._expired + self._withdrawn + self._live
        assert self._pushed == balance, f"pushed {self._pushed} != {balance}"
