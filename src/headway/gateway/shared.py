"""Tenant budgets shared by several gateway instances through one Redis (``--redis URL``).

Each tenant's token budget is a token bucket (``token_rate_per_s``, ``burst_tokens``, as
:class:`~headway.core.policy.admission.TenantLimits` and
:class:`~headway.core.policy.rates.TokenBucket`). With several instances the bucket lives
in Redis, and no request talks to Redis: one Redis round trip costs 170–260 µs of Python
CPU, 40–60 % of a minimal proxy's whole per-request budget.

**Leases.** An instance takes a *lease* of ``L`` tokens for a tenant from the global bucket
(one Lua script, atomic: refill the bucket from Redis's clock, take up to ``L``, return
what was granted) and spends it locally: :meth:`SharedBudgets.try_take` is a few dict
and float operations, with no I/O. When the local balance falls below
``low_water_fraction × L`` the background task tops it up to ``L`` in one round trip, so a
renewal brings ``(1 − low_water_fraction) × L`` tokens. ``L`` is ``lease_tokens``, or
``lease_requests`` requests at the tenant's mean request cost (measured)::

    L = lease_requests × mean_request_tokens / (1 − low_water_fraction)
    L ≤ max_lease_fraction × burst_tokens          (no instance holds the whole burst)

so a renewal carries at least ``lease_requests`` requests (default 32: at most one round
trip per 20 requests, with room for the periodic sync). While the global bucket is
empty, renewals get what has refilled and back off for ``N × chunk / rate`` (``N``
instances), so a rate-limited tenant still costs about one round trip per chunk.

**Lease expiry.** Each instance registers in Redis with a heartbeat that expires after
``lease_ttl_s``; every round trip renews it (one is made at least every
``sync_interval_s``, and ``lease_ttl_s ≥ 3 × sync_interval_s``). Any instance's script
*reaps* expired instances: their unspent lease tokens (as last reported) return to the
bucket and their in-flight counts are removed.
The instance itself stops spending a lease ``0.9 × lease_ttl_s`` after the last round trip
that succeeded (its clock starts before the request is sent, so it stops before Redis
reaps it). On :meth:`SharedBudgets.stop` the unspent tokens are returned at once.

**The over-admission bound.** Every admitted token was granted by the global bucket,
except tokens a reaped instance spent after its last report (its record overstates what
it had left) and local-fallback spending (below). A lease record never exceeds
``max(L, largest single request)``, so at any moment::

    admitted tokens ≤ rate × elapsed + burst + instances × max(L, largest request)

With live, connected instances the extra term is zero; it is what instances that die
(or stay partitioned past their lease) can overspend before they are reaped. An instance
that was reaped and comes back learns it from the reply (``fresh``) and pays back what it
spent since its last report (the bucket may go into debt for it); a dead one cannot.

**Fairness and in-flight counters.** Per-tenant in-flight counts and served tokens (the
fairness counters: tokens admitted net of refunds) are counted locally and published in
the round trip made every ``sync_interval_s`` (a renewal in between carries them too and
resets that clock): about one round trip per second per instance with the defaults,
whatever the load. The instance sends absolute values; the script turns them into increments of the
global hashes (``HINCRBY``/``HINCRBYFLOAT`` of the difference from the last value it
stored for this instance), so a retried or lost reply never double-counts. Each round
trip reads the global view back. :meth:`SharedBudgets.in_flight` is that view plus this
instance's own changes since: other instances' changes show after up to two sync
intervals (theirs to publish, ours to read) plus a round trip.

**Redis unreachable.** A failed round trip switches the instance to ``local-fallback``
and it retries with exponential backoff (``0.05 s`` doubling to ``reconnect_max_s``,
jittered). Leases already held stay spendable until they lapse. Then, with
``fail_mode="open"``, each tenant gets a local bucket of its *share*: ``rate / N`` and
``burst / N``, ``N`` being the instance count Redis last reported (``expected_instances``
before it ever answered), started at ``burst / N`` minus the lease left. With
``fail_mode="closed"`` budgeted work is refused once the lease is spent. On reconnection
the tokens spent in fallback are charged to the global bucket (down to empty, not into
debt), so an outage over-admits at most about one burst beyond the shares. Tenants
without a token budget are never limited. :meth:`SharedBudgets.stats` says ``mode``
(``"shared"`` or ``"local-fallback"``), ``healthy``, the last error and the round trips
for ``/metrics``.

Redis layout (prefix ``key_prefix``; one standalone or Sentinel-managed Redis, not
Cluster, since the script touches keys it computes): ``P:bucket:T`` (hash: level, ts,
rate, cap), ``P:instances`` (sorted set: instance → heartbeat expiry, µs),
``P:lease:I`` (hash: tenant → leased tokens not yet reported spent), ``P:inflight`` and
``P:served`` (hashes: tenant → global figure), ``P:inflight:I`` and ``P:served:I``
(this instance's last published values).

Times: ``now`` passed to :meth:`SharedBudgets.try_take` and :meth:`SharedBudgets.give_back`
must come from the same clock as ``clock`` (``time.monotonic`` by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from headway.core.errors import ConfigError
from headway.core.policy.admission import TenantLimits
from headway.core.policy.decisions import Shed, ShedReason
from headway.core.policy.rates import TokenBucket

__all__ = ["SharedBudgets", "SharedBudgetsConfig", "SharedBudgetsConfigError"]

log = logging.getLogger(__name__)

Mode = Literal["new", "shared", "local-fallback", "stopped"]


class SharedBudgetsConfigError(ConfigError, ValueError):
    """A ``shared`` config field is invalid; the message names the field, value and fix."""


def _require(ok: bool, name: str, value: object, fix: str) -> None:
    if not ok:
        raise SharedBudgetsConfigError(
            f"shared.{name} is invalid (got {value!r}): {fix}", path=f"$.shared.{name}"
        )


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _whole_at_least(value: object, low: int) -> bool:
    return isinstance(value, int) and value >= low


def _fraction(value: object) -> bool:
    """In [0, 1)."""
    return isinstance(value, int | float) and 0 <= value < 1


class SharedBudgetsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How tenant budgets are shared across gateway instances through Redis."""

    redis_url: str
    """The Redis to share through, e.g. ``redis://127.0.0.1:6379/0`` (``rediss://`` for
    TLS, ``unix:///path`` for a socket)."""

    lease_tokens: float | None = None
    """Tokens per lease (``L``). None: ``lease_requests`` requests at the tenant's mean
    request cost."""

    lease_requests: int = 32
    """Requests one renewal should bring when ``lease_tokens`` is None (20 or more keeps
    Redis at most one round trip per 20 requests)."""

    request_tokens_hint: float = 1000.0
    """Mean tokens per request assumed before any request is seen (sizes the first
    lease)."""

    max_lease_fraction: float = 0.25
    """A lease is at most this fraction of the tenant's burst, so no instance holds the
    whole bucket."""

    low_water_fraction: float = 0.25
    """Renew when the local balance falls below this fraction of ``L``."""

    lease_ttl_s: float = 10.0
    """An instance silent this long is presumed dead: its leases return to the pool and
    its in-flight counts are dropped."""

    sync_interval_s: float = 1.0
    """Most seconds between publications of in-flight and served-token counters (the
    staleness of the global view)."""

    fail_mode: Literal["open", "closed"] = "open"
    """When Redis is unreachable: ``open`` serves each tenant its local share (rate / N);
    ``closed`` refuses budgeted work once the held lease is spent."""

    expected_instances: int = 1
    """Instances assumed for the local share before Redis has ever answered."""

    key_prefix: str = "headway"
    """Prefix of every Redis key (separate deployments sharing a Redis use different
    prefixes)."""

    timeout_s: float = 0.5
    """Most seconds one Redis round trip may take before it counts as a failure."""

    reconnect_max_s: float = 5.0
    """Longest wait between reconnection attempts (the backoff doubles up to it)."""

    def __post_init__(self) -> None:
        _require(
            self.redis_url.startswith(("redis://", "rediss://", "unix://")),
            "redis_url",
            self.redis_url,
            "use a Redis URL such as redis://127.0.0.1:6379/0 (rediss:// or unix:// also work)",
        )
        _require(
            self.lease_tokens is None or _positive(self.lease_tokens),
            "lease_tokens",
            self.lease_tokens,
            "use tokens > 0, or null to size leases from lease_requests",
        )
        _require(
            _whole_at_least(self.lease_requests, 1),
            "lease_requests",
            self.lease_requests,
            "use a whole number of requests >= 1 (20 or more keeps Redis off the hot path)",
        )
        _require(
            _positive(self.request_tokens_hint),
            "request_tokens_hint",
            self.request_tokens_hint,
            "use tokens > 0, e.g. 1000",
        )
        _require(
            _positive(self.max_lease_fraction) and self.max_lease_fraction <= 1,
            "max_lease_fraction",
            self.max_lease_fraction,
            "use a fraction in (0, 1], e.g. 0.25",
        )
        _require(
            _fraction(self.low_water_fraction),
            "low_water_fraction",
            self.low_water_fraction,
            "use a fraction in [0, 1), e.g. 0.25",
        )
        _require(
            _positive(self.sync_interval_s),
            "sync_interval_s",
            self.sync_interval_s,
            "use seconds > 0, e.g. 1.0",
        )
        _require(
            _positive(self.lease_ttl_s) and self.lease_ttl_s >= 3 * self.sync_interval_s,
            "lease_ttl_s",
            self.lease_ttl_s,
            f"use seconds >= 3 × sync_interval_s (= {3 * self.sync_interval_s:g}), e.g. 10",
        )
        _require(
            self.fail_mode in ("open", "closed"),
            "fail_mode",
            self.fail_mode,
            'use "open" (serve local shares) or "closed" (refuse budgeted work)',
        )
        _require(
            _whole_at_least(self.expected_instances, 1),
            "expected_instances",
            self.expected_instances,
            "use a whole number >= 1",
        )
        _require(
            bool(self.key_prefix) and not any(c.isspace() for c in self.key_prefix),
            "key_prefix",
            self.key_prefix,
            'use a non-empty prefix without spaces, e.g. "headway"',
        )
        _require(
            _positive(self.timeout_s), "timeout_s", self.timeout_s, "use seconds > 0, e.g. 0.5"
        )
        _require(
            _positive(self.reconnect_max_s),
            "reconnect_max_s",
            self.reconnect_max_s,
            "use seconds > 0, e.g. 5",
        )


# One script per round trip: reap dead instances, heartbeat, leases, counters, read back.
# ARGV[1]: key prefix; ARGV[2]: JSON payload (see SharedBudgets._payload).
_LUA = r"""
if redis.replicate_commands then pcall(redis.replicate_commands) end
local p = ARGV[1]
local a = cjson.decode(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local inst = a.inst
local ttl = a.ttl_us
local reg = p .. ':instances'
local function fmt(x) return string.format('%.17g', x) end

local function bucket(tenant, rate, cap)
  local k = p .. ':bucket:' .. tenant
  local v = redis.call('HMGET', k, 'level', 'ts', 'rate', 'cap')
  local level, ts = tonumber(v[1]), tonumber(v[2])
  rate = rate or tonumber(v[3])
  cap = cap or tonumber(v[4])
  if rate == nil or cap == nil then return nil end
  if level == nil or ts == nil then
    level = cap
  elseif now > ts then
    level = level + rate * (now - ts) / 1000000
  end
  if level > cap then level = cap end
  return k, level, rate, cap
end

local function save(k, level, rate, cap)
  redis.call('HSET', k, 'level', fmt(level), 'ts', fmt(now), 'rate', fmt(rate), 'cap', fmt(cap))
end

local function give(tenant, tokens)
  local k, level, rate, cap = bucket(tenant, nil, nil)
  if k then save(k, math.min(cap, level + tokens), rate, cap) end
end

local function retire(d)
  local lk = p .. ':lease:' .. d
  local ls = redis.call('HGETALL', lk)
  local back = 0
  for i = 1, #ls, 2 do
    local x = tonumber(ls[i + 1])
    if x > 0 then give(ls[i], x); back = back + x end
  end
  redis.call('DEL', lk)
  local fk = p .. ':inflight:' .. d
  local fs = redis.call('HGETALL', fk)
  for i = 1, #fs, 2 do
    redis.call('HINCRBY', p .. ':inflight', fs[i], -tonumber(fs[i + 1]))
  end
  redis.call('DEL', fk)
  redis.call('PEXPIRE', p .. ':served:' .. d, math.floor(ttl / 100))
  redis.call('ZREM', reg, d)
  return back
end

local reaped = 0
local returned = 0
local expired = redis.call('ZRANGEBYSCORE', reg, '-inf', fmt(now))
for _, d in ipairs(expired) do
  returned = returned + retire(d)
  if d ~= inst then reaped = reaped + 1 end
end

local fresh = redis.call('ZSCORE', reg, inst) == false
if not a.bye then redis.call('ZADD', reg, fmt(now + ttl), inst) end

local lk = p .. ':lease:' .. inst
local grants = {}
for _, op in ipairs(a.leases) do
  -- op: tenant, rate, cap, want, balance, debit (floored at 0), refund, owed (into debt)
  local tenant, want, bal, debit, refund = op[1], op[4], op[5], op[6], op[7]
  local k, level, rate, cap = bucket(tenant, op[2], op[3])
  if debit > 0 then level = math.max(level - debit, math.min(level, 0)) end
  if op[8] > 0 then level = level - op[8] end
  if refund > 0 then level = math.min(cap, level + refund) end
  if fresh then bal = 0 end
  local g = 0
  if want > 0 and level > 0 then g = math.min(want, level) end
  level = level - g
  save(k, level, rate, cap)
  if bal + g > 0 then
    redis.call('HSET', lk, tenant, fmt(bal + g))
  else
    redis.call('HDEL', lk, tenant)
  end
  grants[tenant] = {g, level}
end

local fk = p .. ':inflight:' .. inst
for tenant, n in pairs(a.f) do
  local old = tonumber(redis.call('HGET', fk, tenant) or '0')
  if n ~= old then
    redis.call('HINCRBY', p .. ':inflight', tenant, fmt(n - old))
    if n == 0 then redis.call('HDEL', fk, tenant) else redis.call('HSET', fk, tenant, fmt(n)) end
  end
end

local sk = p .. ':served:' .. inst
for tenant, v in pairs(a.s) do
  local old = tonumber(redis.call('HGET', sk, tenant) or '0')
  local d = v - old
  if d < 0 then d = v end
  if d ~= 0 then redis.call('HINCRBYFLOAT', p .. ':served', tenant, fmt(d)) end
  redis.call('HSET', sk, tenant, fmt(v))
end
redis.call('PERSIST', sk)

if a.bye then retire(inst) end

return cjson.encode({
  now_us = now,
  n = redis.call('ZCARD', reg),
  fresh = fresh,
  reaped = reaped,
  returned = returned,
  g = grants,
  f = redis.call('HGETALL', p .. ':inflight'),
  s = redis.call('HGETALL', p .. ':served'),
})
"""


@dataclass(slots=True)
class _Tenant:
    """One tenant's local state (see the module docstring)."""

    rate_per_s: float | None
    capacity_tokens: float | None
    typical_tokens: float
    balance_tokens: float = 0.0
    """Leased tokens not yet spent."""
    need_tokens: float = 0.0
    """The largest request refused for want of lease since the last renewal."""
    want_renewal: bool = False
    renew_after_s: float = 0.0
    """No round trip is started for this tenant's renewal before then (backoff)."""
    refund_tokens: float = 0.0
    """Refunds beyond the lease, to return to the global bucket."""
    debit_tokens: float = 0.0
    """Tokens spent from the local-fallback share, to charge to the global bucket."""
    spent_since_record: float = 0.0
    """Lease tokens spent since Redis last recorded this tenant's balance."""
    owed_tokens: float = 0.0
    """Lease tokens spent that Redis returned to the bucket when it reaped this instance
    (its record overstated what was left): charged back, into debt if need be."""
    fallback: TokenBucket | None = None
    in_flight_local: int = 0
    in_flight_sent: int = 0
    in_flight_global: int = 0
    served_local: float = 0.0
    served_sent: float = 0.0
    served_global: float = 0.0
    admitted_tokens: float = 0.0
    refused: int = 0

    @property
    def budgeted(self) -> bool:
        return self.rate_per_s is not None


class _Reply(msgspec.Struct):
    now_us: float
    n: int
    fresh: bool
    reaped: int
    returned: float
    g: dict[str, tuple[float, float]] | list[Any]
    f: list[str] | dict[str, Any]
    s: list[str] | dict[str, Any]


def _pairs(flat: list[str] | dict[str, Any]) -> dict[str, str]:
    """HGETALL's flat list as a dict (cjson encodes an empty table as ``{}``)."""
    if isinstance(flat, dict):
        return {}
    return dict(zip(flat[::2], flat[1::2], strict=True))


@dataclass(slots=True)
class _Sent:
    """What one round trip reported: per tenant (want, debit, refund, owed, spent since
    the record), in-flight, served."""

    leases: dict[str, tuple[float, float, float, float, float]] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)


_ERRORS = (RedisError, OSError, TimeoutError, msgspec.DecodeError)


class SharedBudgets:
    """Tenant token budgets shared across gateway instances through Redis (see module doc)."""

    def __init__(
        self,
        config: SharedBudgetsConfig,
        limits: Mapping[str, TenantLimits],
        instance_id: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Args:
        config: how to share.
        limits: each tenant's budget; a tenant without ``token_rate_per_s`` (or not listed)
            is never limited here, only counted.
        instance_id: unique among the live instances (e.g. host:pid); a restarted instance
            should take a new one.
        clock: the monotonic clock of ``now`` arguments.
        """
        if not instance_id or any(c.isspace() for c in instance_id):
            raise SharedBudgetsConfigError(
                f"instance_id is invalid (got {instance_id!r}): use a non-empty id without "
                "spaces, unique among live instances (e.g. host:pid)",
                path="$.instance_id",
            )
        self.config = config
        self.instance_id = instance_id
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}
        for name, lim in limits.items():
            self._tenants[name] = _Tenant(
                rate_per_s=lim.token_rate_per_s,
                capacity_tokens=lim.burst_tokens,
                typical_tokens=config.request_tokens_hint,
            )
        self._mode: Mode = "new"
        self._instances = config.expected_instances
        self._redis: aioredis.Redis | None = None
        self._sha: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._resend_all = True
        self._now_s = -math.inf
        self._lease_expiry_s = -math.inf
        self._last_ok_s: float | None = None
        self._last_trip_s = -math.inf
        self._reconnect_at_s = -math.inf
        self._backoff_s = 0.0
        self.round_trips = 0
        """Redis round trips made (script calls, plus script loads after a restart)."""
        self.errors = 0
        self.renewals = 0
        self.fallbacks = 0
        self.reaped_instances = 0
        self.last_error: str | None = None

    # ------------------------------------------------------------------ hot path (no I/O)

    def _tenant(self, tenant: str) -> _Tenant:
        st = self._tenants.get(tenant)
        if st is None:
            st = self._tenants[tenant] = _Tenant(None, None, self.config.request_tokens_hint)
        return st

    def _lease_size(self, st: _Tenant) -> float:
        cfg = self.config
        if cfg.lease_tokens is not None:
            size = cfg.lease_tokens
        else:
            size = cfg.lease_requests * st.typical_tokens / (1.0 - cfg.low_water_fraction)
        assert st.capacity_tokens is not None
        return min(size, cfg.max_lease_fraction * st.capacity_tokens)

    def _want(self, st: _Tenant, now: float) -> None:
        st.want_renewal = True
        wake = self._wake
        if wake is not None and now >= st.renew_after_s and not wake.is_set():
            wake.set()

    def try_take(self, tenant: str, tokens: float, now: float) -> bool:
        """Spend ``tokens`` of ``tenant``'s budget at ``now`` if this instance holds them.

        Synchronous and free of I/O; never raises for Redis trouble. False means "not
        now": the lease is spent (a renewal is on its way) or the global budget is.
        """
        st = self._tenants.get(tenant) or self._tenant(tenant)
        if st.rate_per_s is None or tokens <= 0:
            st.served_local += max(tokens, 0.0)
            return True
        if now > self._now_s:
            self._now_s = now
        assert st.capacity_tokens is not None
        if tokens > st.capacity_tokens:  # larger than the whole bucket: never passes
            st.refused += 1
            return False
        st.typical_tokens += 0.1 * (tokens - st.typical_tokens)
        if st.balance_tokens > 0 and now >= self._lease_expiry_s:
            st.balance_tokens = 0.0  # lapsed: Redis returns it to the pool when it reaps us
        if st.balance_tokens >= tokens:
            st.balance_tokens -= tokens
            st.spent_since_record += tokens
            self._served(st, tokens)
            if (
                self._mode == "shared"
                and st.balance_tokens < self.config.low_water_fraction * self._lease_size(st)
                and not st.want_renewal
            ):
                self._want(st, now)
            return True
        if self._mode == "local-fallback":
            fb = st.fallback
            if fb is not None and fb.try_take(self._now_s, tokens):
                st.debit_tokens += tokens
                self._served(st, tokens)
                return True
        else:
            st.need_tokens = max(st.need_tokens, tokens)
            self._want(st, now)
        st.refused += 1
        return False

    def _served(self, st: _Tenant, tokens: float) -> None:
        st.served_local += tokens
        st.admitted_tokens += tokens

    def give_back(self, tenant: str, tokens: float, now: float) -> None:
        """Return ``tokens`` taken by :meth:`try_take` but not used (a refund)."""
        st = self._tenants.get(tenant)
        if st is None or tokens <= 0:
            return
        st.served_local -= tokens
        if st.rate_per_s is None:
            return
        if now > self._now_s:
            self._now_s = now
        st.admitted_tokens -= tokens
        if st.debit_tokens > 0 and st.fallback is not None:
            x = min(tokens, st.debit_tokens)
            st.debit_tokens -= x
            st.fallback.give_back(self._now_s, x)
            tokens -= x
        room = 0.0
        if now < self._lease_expiry_s:
            room = max(0.0, self._lease_size(st) - st.balance_tokens)
        add = min(tokens, room)
        st.balance_tokens += add
        st.spent_since_record -= add
        st.refund_tokens += tokens - add

    def wait_s(self, tenant: str, tokens: float, now: float) -> float | None:
        """An estimate of the seconds until :meth:`try_take` of ``tokens`` may pass (for a
        Retry-After), or None when it never can (larger than the tenant's bucket)."""
        st = self._tenants.get(tenant)
        if st is None or st.rate_per_s is None or st.capacity_tokens is None:
            return 0.0
        if tokens > st.capacity_tokens:
            return None
        short = tokens - st.balance_tokens
        if short <= 0 and now < self._lease_expiry_s:
            return 0.0
        if self._mode == "local-fallback":
            if st.fallback is None:  # fail closed: until Redis may be back
                return max(self._reconnect_at_s - now, self.config.sync_interval_s)
            return st.fallback.wait_s(max(now, self._now_s), tokens)
        share_rate = st.rate_per_s / max(self._instances, 1)
        return max(st.renew_after_s - now, short / share_rate, 0.0)

    def check(self, now: float, tenant: str, tokens: int) -> Shed | None:
        """:meth:`try_take` as the controller's budget seam: None to admit, else a shed
        (``TENANT_TOKEN_RATE``) with a Retry-After."""
        if self.try_take(tenant, tokens, now):
            return None
        wait = self.wait_s(tenant, tokens, now)
        return Shed(
            ShedReason.TENANT_TOKEN_RATE,
            retry_after_s=wait,
            detail=f"shared budget of tenant {tenant!r} ({self._mode}): {tokens} tokens",
        )

    def in_flight(self, tenant: str) -> int:
        """The tenant's requests in flight on all instances: the last global view plus this
        instance's changes since it was published."""
        st = self._tenants.get(tenant)
        if st is None:
            return 0
        return max(0, st.in_flight_global - st.in_flight_sent + st.in_flight_local)

    def add_in_flight(self, tenant: str, delta: int) -> None:
        """Count ``delta`` requests of ``tenant`` in (+) or out of (−) flight here."""
        st = self._tenants.get(tenant) or self._tenant(tenant)
        st.in_flight_local = max(0, st.in_flight_local + delta)

    def served_tokens(self, tenant: str) -> float:
        """Tokens served to the tenant by all instances (the fairness counter), as of the
        last global view plus this instance's changes since."""
        st = self._tenants.get(tenant)
        if st is None:
            return 0.0
        return st.served_global - st.served_sent + st.served_local

    @property
    def mode(self) -> Mode:
        """``shared``, ``local-fallback``; ``new`` before :meth:`start`, ``stopped`` after."""
        return self._mode

    @property
    def healthy(self) -> bool:
        """Redis answered the last round trip."""
        return self._mode == "shared"

    def stats(self) -> dict[str, Any]:
        """Figures for ``/metrics``: mode, health, round trips, errors, per-tenant state."""
        now = self._clock()
        return {
            "mode": self._mode,
            "healthy": self.healthy,
            "fail_mode": self.config.fail_mode,
            "instance_id": self.instance_id,
            "instances": self._instances,
            "round_trips": self.round_trips,
            "round_trip_errors": self.errors,
            "lease_renewals": self.renewals,
            "fallback_entries": self.fallbacks,
            "reaped_instances": self.reaped_instances,
            "last_error": self.last_error,
            "seconds_since_sync": None if self._last_ok_s is None else now - self._last_ok_s,
            "tenants": {
                name: {
                    "lease_tokens_left": st.balance_tokens if now < self._lease_expiry_s else 0.0,
                    "lease_tokens": self._lease_size(st) if st.budgeted else None,
                    "admitted_tokens": st.admitted_tokens,
                    "refused": st.refused,
                    "in_flight": self.in_flight(name),
                    "served_tokens": self.served_tokens(name),
                }
                for name, st in self._tenants.items()
            },
        }

    # ------------------------------------------------------------------ background (I/O)

    async def start(self) -> None:
        """Connect, take the first leases and start the background task. Never fails for
        an unreachable Redis: the instance then starts in ``local-fallback``."""
        if self._task is not None or self._mode != "new":
            raise RuntimeError("SharedBudgets.start() may be called once")
        self._wake = asyncio.Event()
        self._redis = aioredis.Redis.from_url(
            self.config.redis_url,
            socket_timeout=self.config.timeout_s,
            socket_connect_timeout=self.config.timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        for st in self._tenants.values():
            if st.budgeted:
                st.want_renewal = True
        await self._round_trip(self._clock())
        self._task = asyncio.create_task(self._run(), name=f"shared-budgets:{self.instance_id}")

    async def stop(self) -> None:
        """Stop the task, return unspent leases and in-flight counts, close the client."""
        if self._mode == "stopped":
            return
        self._stopping = True
        if self._task is not None:
            if self._wake is not None:
                self._wake.set()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 2 * self.config.timeout_s)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None
        if self._redis is not None:
            await self._round_trip(self._clock(), bye=True)  # one try, even in fallback
            await self._redis.aclose()
            self._redis = None
        for st in self._tenants.values():
            st.balance_tokens = 0.0
        self._mode = "stopped"

    def _next_due_s(self, now: float) -> float:
        if self._mode == "local-fallback":
            return self._reconnect_at_s
        # Publish and read the counters every sync interval (a renewal resets the clock);
        # that also renews the heartbeat, since lease_ttl_s >= 3 × sync_interval_s.
        due = self._last_trip_s + self.config.sync_interval_s
        for st in self._tenants.values():
            if st.want_renewal and st.renew_after_s < due:
                due = st.renew_after_s
        return due

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            now = self._clock()
            due = self._next_due_s(now)
            if due > now:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), due - now)
                continue
            try:
                await self._round_trip(now)
            except Exception as exc:  # the task must outlive a bug: fall back, keep serving
                log.exception("shared budgets: round trip failed unexpectedly")
                self._failed(exc)

    def _payload(self, bye: bool) -> tuple[bytes, _Sent]:
        """The script's JSON argument, and what it reported (to settle on the reply)."""
        leases: list[tuple[str, float, float, float, float, float, float, float]] = []
        sent = _Sent()
        resend = self._resend_all
        for name, st in self._tenants.items():
            if st.budgeted and (
                bye
                or st.want_renewal
                or st.debit_tokens > 0
                or st.refund_tokens > 0
                or st.owed_tokens > 0
            ):
                assert st.rate_per_s is not None
                assert st.capacity_tokens is not None
                bal = st.balance_tokens
                want = 0.0
                if not bye:
                    want = max(max(self._lease_size(st), st.need_tokens) - bal, 0.0)
                leases.append(
                    (
                        name,
                        st.rate_per_s,
                        st.capacity_tokens,
                        want,
                        bal,
                        st.debit_tokens,
                        st.refund_tokens,
                        st.owed_tokens,
                    )
                )
                sent.leases[name] = (
                    want,
                    st.debit_tokens,
                    st.refund_tokens,
                    st.owed_tokens,
                    st.spent_since_record,
                )
            if bye:
                sent.in_flight[name] = 0
            elif resend or st.in_flight_local != st.in_flight_sent:
                sent.in_flight[name] = st.in_flight_local
            if resend or st.served_local != st.served_sent:
                sent.served[name] = st.served_local
        payload = {
            "inst": self.instance_id,
            "ttl_us": self.config.lease_ttl_s * 1e6,
            "bye": bye,
            "leases": leases,
            "f": sent.in_flight,
            "s": sent.served,
        }
        return msgspec.json.encode(payload), sent

    async def _call(self, payload: bytes) -> bytes:
        r = self._redis
        assert r is not None
        prefix = self.config.key_prefix
        if self._sha is None:
            self.round_trips += 1
            self._sha = str(await r.script_load(_LUA))
        self.round_trips += 1
        try:
            out = await r.evalsha(self._sha, 0, prefix, payload)
        except NoScriptError:  # Redis restarted and forgot the script
            self.round_trips += 1
            self._sha = str(await r.script_load(_LUA))
            self.round_trips += 1
            out = await r.evalsha(self._sha, 0, prefix, payload)
        assert isinstance(out, bytes)
        return out

    async def _round_trip(self, now: float, *, bye: bool = False) -> None:
        """One round trip; on failure switch to local-fallback (never raises for Redis)."""
        if now >= self._lease_expiry_s:
            for st in self._tenants.values():
                st.balance_tokens = 0.0  # lapsed: Redis returns it when it reaps us
        payload, sent = self._payload(bye)
        self._last_trip_s = now
        try:
            raw = await asyncio.wait_for(self._call(payload), self.config.timeout_s)
            reply = msgspec.json.decode(raw, type=_Reply)
        except _ERRORS as exc:
            self._failed(exc)
            return
        if any(op[0] > 0 for op in sent.leases.values()):
            self.renewals += 1
        self._settle(reply, now, sent, bye)

    def _failed(self, exc: BaseException) -> None:
        now = self._clock()
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self._resend_all = True  # Redis may come back empty: republish every counter
        self._backoff_s = min(self.config.reconnect_max_s, max(0.05, 2 * self._backoff_s))
        self._reconnect_at_s = now + self._backoff_s * (0.5 + 0.5 * random.random())
        if self._mode == "local-fallback" or self._stopping:
            return
        self._mode = "local-fallback"
        self.fallbacks += 1
        log.warning(
            "shared budgets: Redis unreachable (%s); serving on local shares "
            "(fail_mode=%s, %d instances assumed)",
            self.last_error,
            self.config.fail_mode,
            self._instances,
        )
        if self.config.fail_mode == "closed":
            return
        t = max(now, self._now_s)
        n = max(self._instances, 1)
        for st in self._tenants.values():
            if st.rate_per_s is None or st.capacity_tokens is None:
                continue
            cap = st.capacity_tokens / n
            st.fallback = TokenBucket(
                rate_per_s=st.rate_per_s / n,
                capacity_tokens=cap,
                now=t,
                level_tokens=max(0.0, cap - st.balance_tokens),
            )

    def _settle(self, reply: _Reply, sent_s: float, sent: _Sent, bye: bool) -> None:
        now = self._clock()
        if self._mode == "local-fallback" and not bye:
            log.warning("shared budgets: Redis reachable again; back to shared budgets")
        if self._mode in ("new", "local-fallback"):
            self._mode = "shared"
        self._backoff_s = 0.0
        self._last_ok_s = sent_s
        self._lease_expiry_s = sent_s + 0.9 * self.config.lease_ttl_s
        self._instances = max(int(reply.n), 1)
        self.reaped_instances += int(reply.reaped)
        grants = reply.g if isinstance(reply.g, dict) else {}
        if reply.fresh and not bye:
            # Redis had lost us (reaped, or a new Redis): the lease records it returned to
            # the buckets overstated what we had left by what we spent since; owe that.
            for name, st in self._tenants.items():
                spent = sent.leases[name][4] if name in sent.leases else st.spent_since_record
                st.owed_tokens += max(spent, 0.0)
                st.spent_since_record -= spent
        for name, (want, debit, refund, owed, spent) in sent.leases.items():
            st = self._tenants[name]
            st.debit_tokens = max(0.0, st.debit_tokens - debit)
            st.refund_tokens = max(0.0, st.refund_tokens - refund)
            st.owed_tokens = max(0.0, st.owed_tokens - owed)
            if not reply.fresh:
                st.spent_since_record -= spent  # the record is exact as of the send
            if bye:
                continue
            granted = float(grants[name][0]) if name in grants else 0.0
            st.balance_tokens += granted
            st.need_tokens = 0.0
            lease = self._lease_size(st)
            st.want_renewal = st.balance_tokens < self.config.low_water_fraction * lease
            if granted + 1e-9 < want:
                # The global bucket ran dry: let about one chunk per instance refill.
                assert st.rate_per_s is not None
                wait_s = self._instances * want / st.rate_per_s
                st.renew_after_s = now + min(max(wait_s, 0.01), self.config.lease_ttl_s / 3)
                st.want_renewal = True
            else:
                st.renew_after_s = 0.0
        inflight = _pairs(reply.f)
        served = _pairs(reply.s)
        for name, st in self._tenants.items():
            st.fallback = None
            if name in sent.in_flight:
                st.in_flight_sent = sent.in_flight[name]
            if name in sent.served:
                st.served_sent = sent.served[name]
            st.in_flight_global = int(inflight.get(name, "0"))
            st.served_global = float(served.get(name, "0"))
        # A fresh registration (first contact, or Redis lost us) needs every counter once.
        self._resend_all = bool(reply.fresh) and not self._resend_all and not bye
