"""Per-tenant dispatch-slot shares: a light tenant finds a slot beside a flood.

While two or more tenants are *active* (requests queued or in flight, or one arrived
less than ``active_s`` ago), a tenant holds at most ``ceil(its share / the active tenants'
shares × ready slots × headroom)`` dispatched requests (at least one). At its cap its
requests wait in line and are passed over by the queues' ``eligible`` hook without
losing their place, so the slots it may not take stay free for the other active
tenants' next requests (dispatched at once beside a flood). Alone, a tenant takes every
slot. The reserve is by share, not by demand: a steady tenant of large share keeps its
share of the slots free while it is active even when it uses few of them, so a bursty
tenant of small share waits (and may be refused ``queue_full``) beside idle slots; the
simulator turns the shares on only when asked (``gateway.tenant_slot_headroom``).

:class:`TenantSlots` keeps what the caps are computed from (dispatched requests per
tenant, until when each counts as active for its last arrival) and takes ``now`` on every
call. The caps change with time alone when a tenant's last arrival ages out:
:meth:`TenantSlots.next_change_s` says when, so the driver's timer can dispatch what a
cap held back (:meth:`headway.core.gateway_core.GatewayCore.next_timer_s`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

__all__ = ["TenantSlots"]


class TenantSlots:
    """Slot shares of the tenants (see the module docstring)."""

    def __init__(
        self,
        shares: Mapping[str, float],
        weight: Callable[[str], float],
        *,
        headroom: float | None = 1.0,
        active_s: float = 2.0,
    ) -> None:
        """``shares``: tenant → its share of the slots; a tenant not named has
        ``weight(tenant)`` (its queue weight). ``headroom`` None: no caps."""
        self.shares = dict(shares)
        self.weight = weight
        self.headroom = headroom
        self.active_s = active_s
        self.held: dict[str, int] = {}
        """Dispatched (slot-holding) requests per tenant."""
        self._active_until: dict[str, float] = {}
        """When each tenant seen stops counting as active for its last arrival."""

    def seen(self, now: float, tenant: str) -> None:
        """A request of ``tenant`` arrived at ``now``: it is active until
        ``now + active_s``."""
        self._active_until[tenant] = now + self.active_s

    def took(self, tenant: str) -> None:
        """A request of ``tenant`` was dispatched: it holds a slot."""
        self.held[tenant] = self.held.get(tenant, 0) + 1

    def gave_back(self, tenant: str) -> None:
        """A dispatched request of ``tenant`` left its slot."""
        self.held[tenant] -= 1

    def share(self, tenant: str) -> float:
        """The tenant's share of the slots."""
        share = self.shares.get(tenant)
        return self.weight(tenant) if share is None else share

    def caps(self, now: float, in_flight: Mapping[str, int], total: int) -> dict[str, int] | None:
        """Most slots each active tenant may hold now, of ``total`` (None: no cap applies:
        the headroom is off, or fewer than two tenants are active). ``in_flight``: the
        tenants' queued or dispatched requests."""
        if self.headroom is None:
            return None
        active = {t for t, n in in_flight.items() if n > 0}
        stale = []
        for t, until in self._active_until.items():
            if now < until:
                active.add(t)
            elif t not in active:
                stale.append(t)
        for t in stale:
            del self._active_until[t]
        if len(active) < 2:
            return None
        shares = {t: self.share(t) for t in active}
        whole = sum(shares.values())
        if whole <= 0:
            return None
        return {t: max(1, math.ceil(s / whole * total * self.headroom)) for t, s in shares.items()}

    def next_change_s(self, now: float, in_flight: Mapping[str, int]) -> float | None:
        """The first time after ``now`` at which the caps change with no event: a tenant
        active only for its last arrival (nothing queued or in flight) stops counting
        (None: no such tenant, or no caps). Exactly then :meth:`caps` no longer counts it
        (the same sum, compared ``now < until``), so a timer armed for it finds it gone."""
        if self.headroom is None:
            return None
        return min(
            (u for t, u in self._active_until.items() if u > now and not in_flight.get(t)),
            default=None,
        )

    def at_cap(self, caps: Mapping[str, int] | None, tenant: str) -> bool:
        """Whether ``tenant`` holds its cap under ``caps`` (from :meth:`caps`)."""
        return caps is not None and self.held.get(tenant, 0) >= caps.get(tenant, 1)

    def eligible(self, caps: Mapping[str, int] | None) -> Callable[[str], bool] | None:
        """The queues' ``eligible`` hook under ``caps`` (None: every tenant is)."""
        if caps is None:
            return None
        return lambda tenant: not self.at_cap(caps, tenant)
