"""The replica count each upstream pool should have: the core autoscaler on the gateway's
own counters and wall clock, exported as ``headway_gateway_desired_replicas{pool}``.

The gateway recommends; it never starts an engine. KEDA or an HPA on external metrics
reads the gauge and scales the engine's Deployment (``deploy/kubernetes/keda-scaledobject.yaml``).
A pool is the upstreams of one route (``upstreams[].route``), and ``default`` for those
without one. Per pool and per evaluation interval the gateway measures what the simulator
measures (:mod:`headway.sim.fleet`), and hands the same
:class:`~headway.core.policy.autoscaler.AutoscalerSignals` to the same
:class:`~headway.core.policy.autoscaler.Autoscaler`:

* ``offered_tokens_per_s``: prompt plus planned output tokens of every request offered
  (admitted, queued or shed);
* ``admitted_tokens_per_s``: the same of the requests dispatched;
* ``queue_delay_s``: their mean wait from offer to dispatch, and at least the wait so far
  of the pool's oldest queued request
  (:func:`~headway.core.policy.autoscaler.window_queue_delay_s`);
* ``deadline_miss_ratio``: of the requests that ended, those past their deadline;
* ``kv_occupancy``: the gateway's projected KV blocks over each ready upstream's blocks
  (``kv_blocks`` or what the pool scrapes), mean over ready upstreams;
* ``active_sequences``: requests dispatched and not yet ended on the ready upstreams.

``ready_replicas`` is the pool's ready upstreams. The autoscaler's own count (ready plus
starting) is the desired figure: a scale-up raises it, and the replicas it asked for count
as starting while they are missing, for ``startup_delay_s`` after the scale-up, so the same
load does not ask twice while Kubernetes starts them; a scale-down lowers it.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence

from headway.core.gateway_core import Lease, UpstreamState
from headway.core.policy.admission import AdmissionRequest
from headway.core.policy.autoscaler import (
    Autoscaler,
    AutoscalerConfig,
    AutoscalerSignals,
    ScaleDown,
    ScaleUp,
    window_queue_delay_s,
)
from headway.core.policy.decisions import Shed
from headway.gateway.config import GatewayFileConfig

__all__ = ["DEFAULT_POOL", "DesiredReplicas"]

DEFAULT_POOL = "default"
"""The pool of upstreams without a ``route``."""


class _Pool:
    """One pool's autoscaler, its recommendation and the counters of the current window."""

    def __init__(self, config: AutoscalerConfig, ready: int) -> None:
        self.scaler = Autoscaler(config)
        self.desired = max(config.min_replicas, min(config.max_replicas, ready))
        self.last_up_s: float | None = None
        self.offered_tokens = 0
        self.admitted_tokens = 0
        self.admitted = 0
        self.wait_s = 0.0
        self.ended = 0
        self.missed = 0


class DesiredReplicas:
    """Per pool: the window's counters, the autoscaler, the desired replica count."""

    def __init__(self, config: AutoscalerConfig, routes: list[str | None]) -> None:
        """``routes``: each configured upstream's ``route`` (its pool)."""
        self.config = config
        names = [route or DEFAULT_POOL for route in routes]
        self._pools = {name: _Pool(config, names.count(name)) for name in sorted(set(names))}
        self._offered_at: weakref.WeakKeyDictionary[Lease, float] = weakref.WeakKeyDictionary()
        self._counted: weakref.WeakKeyDictionary[Lease, int] = weakref.WeakKeyDictionary()
        """Per lease: 1 once dispatched, 2 once ended (a requeue or a second release is not
        counted again)."""
        self.next_evaluation_s: float | None = None
        self.last_reason: dict[str, str] = {}
        """Per pool, the reason of its last decision (for ``/admin/state`` and logs)."""

    @staticmethod
    def pools_of(config: GatewayFileConfig) -> set[str]:
        """The pools ``config``'s upstreams make (fixed at start: a reload that changes
        them is reported in ``needs_restart``)."""
        return {u.route or DEFAULT_POOL for u in config.upstreams}

    def pool_of(self, route: str | None) -> _Pool | None:
        """The pool that serves ``route`` (its own upstreams, else ``default``)."""
        pools = self._pools
        return pools.get(route or DEFAULT_POOL) or pools.get(DEFAULT_POOL)

    def offered(
        self, now: float, request: AdmissionRequest, route: str | None, decision: Lease | Shed
    ) -> None:
        """A request was offered and the core decided: shed, queued or dispatched."""
        pool = self.pool_of(route)
        if pool is not None:
            pool.offered_tokens += request.prompt_tokens + request.planned_output_tokens
        if isinstance(decision, Lease):
            if decision.upstream is None:
                self._offered_at[decision] = now
            else:
                self.dispatched(now, decision)

    def dispatched(self, now: float, lease: Lease) -> None:
        """``lease`` reached an upstream (at once or from its queue)."""
        pool = self.pool_of(lease.route)
        if pool is None or lease in self._counted:
            return
        self._counted[lease] = 1
        pool.admitted += 1
        pool.admitted_tokens += lease.prompt_tokens + lease.expected_output_tokens
        pool.wait_s += now - self._offered_at.pop(lease, now)

    def ended(self, now: float, lease: Lease) -> None:
        """``lease`` ended (served, failed, cancelled or expired)."""
        pool = self.pool_of(lease.route)
        if pool is None or self._counted.get(lease) == 2:
            return
        self._counted[lease] = 2
        pool.ended += 1
        if lease.deadline_s is not None and now > lease.deadline_s:
            pool.missed += 1

    def evaluate(
        self,
        now: float,
        upstreams: Sequence[UpstreamState],
        oldest_wait_by_route: Mapping[str | None, float] | None = None,
    ) -> None:
        """Close the window at ``now``: each pool's signals to its autoscaler, and its
        decision applied to the desired count. ``oldest_wait_by_route``: per queue lane
        (its route), how long its oldest request has waited (the core's
        :meth:`~headway.core.gateway_core.GatewayCore.oldest_wait_by_route`). Calls before
        the interval is up do nothing."""
        if self.next_evaluation_s is not None and now < self.next_evaluation_s:
            return
        interval_s = self.config.evaluation_interval_s
        window_s = interval_s
        if self.next_evaluation_s is not None:
            window_s = max(interval_s, now - self.next_evaluation_s + interval_s)
        self.next_evaluation_s = now + interval_s
        oldest_s: dict[_Pool, float] = {}
        for route, wait_s in (oldest_wait_by_route or {}).items():
            lane_pool = self.pool_of(route)
            if lane_pool is not None:
                oldest_s[lane_pool] = max(oldest_s.get(lane_pool, 0.0), wait_s)
        for name, pool in self._pools.items():
            ready = [u for u in upstreams if (u.route or DEFAULT_POOL) == name and u.ready_at(now)]
            starting = 0
            if pool.last_up_s is not None and now - pool.last_up_s < self.config.startup_delay_s:
                starting = max(0, pool.desired - len(ready))
            signals = AutoscalerSignals(
                ready_replicas=len(ready),
                starting_replicas=starting,
                queue_delay_s=window_queue_delay_s(
                    pool.wait_s, pool.admitted, oldest_s.get(pool, 0.0)
                ),
                admitted_tokens_per_s=pool.admitted_tokens / window_s,
                kv_occupancy=(
                    sum(min(1.0, u.projected_blocks / u.total_kv_blocks) for u in ready)
                    / len(ready)
                    if ready
                    else None
                ),
                deadline_miss_ratio=pool.missed / pool.ended if pool.ended else 0.0,
                offered_tokens_per_s=pool.offered_tokens / window_s,
                active_sequences=float(sum(u.outstanding_requests for u in ready)),
            )
            pool.offered_tokens = pool.admitted_tokens = pool.admitted = 0
            pool.wait_s = 0.0
            pool.ended = pool.missed = 0
            decision = pool.scaler.decide(now, signals)
            current = signals.current_replicas
            if isinstance(decision, ScaleUp):
                pool.desired = max(pool.desired, current + decision.count)
                pool.last_up_s = now
            elif isinstance(decision, ScaleDown):
                pool.desired = current - decision.count
            self.last_reason[name] = decision.reason

    def desired(self) -> dict[str, int]:
        """Each pool's desired replica count."""
        return {name: pool.desired for name, pool in self._pools.items()}
