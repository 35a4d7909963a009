"""The live gateway's driver of :class:`~headway.core.gateway_core.GatewayCore`: the wall
clock, asyncio futures for queued requests, one timer for queue expiry.

The decisions (admission, queues, slots, tenant slot shares, routing, fallback, speeds,
refunds, expiry) are the core's; this module turns them into what an aiohttp handler can
await. A request is offered with :meth:`Controller.offer`: a
:class:`~headway.core.policy.decisions.Shed`, or a :class:`Lease`; :meth:`Controller.ready`
is a future that resolves to the upstream it was dispatched to (at once when admitted;
when a slot frees when enqueued) or to a shed (expired). :meth:`Controller.release` frees
the slot and dispatches the next queued request. A queued lease whose client went away
leaves its line at once: it never reaches an upstream, never holds a slot, and frees its
place in the bounds. The retry budget (:class:`~headway.core.policy.retries.RetryPolicy`)
sits here beside it, for the relay's attempts.

Seams for the upstream pool and shared budgets: :class:`UpstreamSource` (the pool's
ready upstreams) and :class:`BudgetSeam` (a shared tenant budget checked before the
local policy); the defaults are the config's static list and local-only budgets.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from pathlib import Path

from headway.core.engine.catalog import get_gpu, get_model
from headway.core.engine.roofline import RooflineStepTime
from headway.core.engine.steptime import StepTimeModel
from headway.core.errors import ConfigError
from headway.core.gateway_core import (
    BudgetSeam,
    CoreSettings,
    GatewayCore,
    Lease,
    StaticUpstreams,
    UpstreamSource,
    UpstreamState,
)
from headway.core.policy.admission import AdmissionPolicy, AdmissionRequest, LoadSnapshot
from headway.core.policy.charges import Phase
from headway.core.policy.decisions import Shed
from headway.core.policy.degraded import Degradation
from headway.core.policy.fallback import NoFallback
from headway.core.policy.queues import PriorityQueues
from headway.core.policy.releases import ReleaseChange
from headway.core.policy.retries import RetryPolicy
from headway.core.policy.speeds import ServiceSpeeds, SpeedPrior, prior_from_step_time
from headway.gateway.config import GatewayFileConfig
from headway.gateway.desired_replicas import DesiredReplicas

__all__ = [
    "BudgetSeam",
    "Controller",
    "Lease",
    "UpstreamSource",
    "UpstreamState",
    "core_settings",
    "speed_prior",
]


def speed_prior(config: GatewayFileConfig) -> SpeedPrior:
    """The speeds admission predicts with before any answer was measured: the config's
    ``tpot_s`` (and ``prefill_tokens_per_s``), else its calibrated ``profile``, else the
    engine model's roofline for ``engine_model`` on ``engine_gpu``, each at a full batch
    of ``slots_per_upstream``."""
    if config.tpot_s is not None:
        return SpeedPrior(config.tpot_s, config.prefill_tokens_per_s or math.inf)
    step_time: StepTimeModel
    if config.profile is not None:
        from headway.calibrate.profile import read_profile

        step_time = read_profile(Path(config.profile)).step_time
    else:
        from headway.data import load_efficiency_table

        try:
            gpu = get_gpu(config.engine_gpu)
        except ConfigError as error:
            raise ConfigError(f"engine_gpu: {error}", path="engine_gpu") from None
        try:
            model = get_model(config.engine_model)
        except ConfigError as error:
            raise ConfigError(f"engine_model: {error}", path="engine_model") from None
        step_time = RooflineStepTime(
            model=model, gpu=gpu, efficiency=load_efficiency_table().profile_for(gpu)
        )
    return prior_from_step_time(step_time, num_seqs=config.slots_per_upstream)


def core_settings(config: GatewayFileConfig) -> CoreSettings:
    """What the core reads of the gateway's config."""
    return CoreSettings(
        admission=config.admission_config(),
        queues=config.queue_config(),
        fallback=config.fallback,
        routes=config.routes,
        route_slot_shares={
            name: r.slot_share for name, r in config.routes.items() if r.slot_share is not None
        },
        slot_shares={t.name: t.share if t.share > 0 else t.weight for t in config.tenants.values()},
        tenant_slot_headroom=config.tenant_slot_headroom,
        tenant_active_s=config.tenant_active_s,
        measure_speeds=config.measure_speeds,
        kv_blocks_per_upstream=config.kv_blocks_per_upstream,
        release_guard=config.release_guard,
        degraded=config.degraded,
    )


class Controller:
    """The core on the wall clock, with a future per queued request (module docstring)."""

    def __init__(
        self,
        config: GatewayFileConfig,
        source: UpstreamSource | None = None,
        budgets: BudgetSeam | None = None,
    ) -> None:
        self.config = config
        self.budgets = budgets
        self.retries = RetryPolicy(config.retries)
        states = source or StaticUpstreams(
            [self._state(config, i) for i in range(len(config.upstreams))]
        )
        self.core = GatewayCore(
            core_settings(config), states, speed_prior=speed_prior(config), budgets=budgets
        )
        self._waiting: weakref.WeakKeyDictionary[Lease, asyncio.Future[UpstreamState | Shed]] = (
            weakref.WeakKeyDictionary()
        )
        """Each lease's future, for as long as the lease lives (its handler holds it)."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        scaler = config.autoscaler
        self.desired = (
            None if scaler is None else DesiredReplicas(scaler, [u.route for u in config.upstreams])
        )
        """The desired replicas per pool (with ``autoscaler:``): fed here, evaluated by the
        server's timer."""

    @staticmethod
    def _state(config: GatewayFileConfig, index: int) -> UpstreamState:
        up = config.upstreams[index]
        return UpstreamState(
            url=up.url.rstrip("/"),
            revision=up.revision,
            route=up.route,
            slots=up.slots or config.slots_per_upstream,
            total_kv_blocks=config.kv_blocks_per_upstream,
            api_key=up.api_key,
        )

    @staticmethod
    def now() -> float:
        """The controller's clock (monotonic seconds)."""
        return time.monotonic()

    # -- the core's state, as the server and its metrics read it -----------------------------

    @property
    def source(self) -> UpstreamSource:
        """The upstreams (the pool replaces the config's static list)."""
        return self.core.source

    @source.setter
    def source(self, source: UpstreamSource) -> None:
        self.core.source = source

    @property
    def admission(self) -> AdmissionPolicy:
        return self.core.admission

    @property
    def queues(self) -> PriorityQueues[Lease]:
        return self.core.queues

    @property
    def speeds(self) -> ServiceSpeeds:
        return self.core.speeds

    @property
    def running(self) -> dict[str, int]:
        return self.core.running

    @property
    def in_flight(self) -> dict[str, int]:
        return self.core.in_flight

    @property
    def dispatched_by(self) -> dict[str, int]:
        return self.core.dispatched_by

    @property
    def expired(self) -> int:
        return self.core.expired

    @property
    def skipped_dead(self) -> int:
        return self.core.skipped_dead

    @property
    def capped(self) -> int:
        return self.core.capped

    @property
    def draining(self) -> bool:
        """This instance is shutting down: new requests are refused (``draining``);
        queued and dispatched ones finish."""
        return self.core.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.core.draining = value

    def total_slots(self) -> int:
        """Dispatch slots of the ready upstreams."""
        return self.core.total_slots(self.now())

    def route_health(self, route: str | None) -> float:
        """Ready upstreams of ``route`` / its upstreams (0 when none serves it)."""
        return self.core.route_health(self.now(), route)

    def choose_route(self, route: str) -> tuple[str, NoFallback | None]:
        """The route a call for ``route`` goes to (see the core)."""
        return self.core.choose_route(self.now(), route)

    def snapshot(
        self, now: float, request: AdmissionRequest, route: str | None = None
    ) -> LoadSnapshot:
        """The load admission reads for ``request`` at ``now``."""
        return self.core.snapshot(now, request, route)

    def slot_caps(self, now: float, total: int) -> dict[str, int] | None:
        """Most slots each active tenant may hold now (see the core)."""
        return self.core.slot_caps(now, total)

    def tpot_s(self) -> float | None:
        """The TPOT the service estimate uses: the prior, refined by measurement."""
        return self.core.speeds.tpot_s

    def observe_whole(self, prompt_tokens: int, output_tokens: int, duration_s: float) -> None:
        """A whole answer took ``duration_s`` from its dispatch."""
        self.core.observe_whole(prompt_tokens, output_tokens, duration_s)

    def observe_stream(
        self, prompt_tokens: int, output_tokens: int, first_token_s: float, duration_s: float
    ) -> None:
        """A streamed answer: its first and last token, seconds after its dispatch."""
        self.core.observe_stream(prompt_tokens, output_tokens, first_token_s, duration_s)

    def queued_by(self, now: float) -> tuple[dict[str, int], dict[str, int]]:
        """Queue depth per band and per tenant (the live ones, for metrics)."""
        return self.core.queued_by(now)

    # -- decisions ---------------------------------------------------------------------------

    def reconfigure(self, config: GatewayFileConfig) -> None:
        """Swap in ``config`` live: admission (tenant budgets), queue and retry settings
        take effect for the next decision; queued and dispatched requests keep their
        places and slots (see the policies' ``reconfigure``)."""
        self.core.reconfigure(self.now(), core_settings(config), speed_prior(config))
        self.retries.reconfigure(config.retries)
        self.config = config
        self._settle()

    def offer(
        self, request: AdmissionRequest, revision: str | None = None, route: str | None = None
    ) -> Shed | Lease:
        """Decide on one request now: a shed, or a lease (dispatched or queued: await
        :meth:`ready`)."""
        now = self.now()
        return self._track(now, request, route, self.core.offer(now, request, revision, route))

    def degrade(
        self, request: AdmissionRequest, *, optional: bool = False
    ) -> tuple[AdmissionRequest | Shed, Degradation | None]:
        """The degraded mode of ``request``'s band applied now (see the core): the request
        to offer, or the shed of an optional one; and what changed. The caller logs
        ``core.modes.changes()``."""
        return self.core.degrade(self.now(), request, optional=optional)

    def offer_on_route(
        self, request: AdmissionRequest, route: str | None, revision: str | None = None
    ) -> tuple[str | None, Shed | Lease]:
        """:meth:`offer` on the route the core sends a call for ``route`` to (its own or
        an allowed fallback): that route, and the decision."""
        now = self.now()
        chosen, decision = self.core.offer_on_route(now, request, route, revision)
        return chosen, self._track(now, request, chosen, decision)

    def _track(
        self, now: float, request: AdmissionRequest, route: str | None, decision: Shed | Lease
    ) -> Shed | Lease:
        """Count the offer for the desired replicas, make a future for a lease (set at
        once when dispatched), and settle the others."""
        if self.desired is not None:
            self.desired.offered(now, request, route, decision)
        if isinstance(decision, Lease):
            future = asyncio.get_running_loop().create_future()
            if decision.upstream is not None:
                future.set_result(decision.upstream)
            self._waiting[decision] = future
        self._settle()
        return decision

    def ready(self, lease: Lease) -> asyncio.Future[UpstreamState | Shed]:
        """Resolves to the upstream ``lease`` is dispatched to, or to the shed that ended
        it while it waited (cancelled when its request was released first)."""
        return self._waiting[lease]

    def observe_attempt(
        self, upstream: UpstreamState, *, error: bool, first_byte_s: float | None
    ) -> list[ReleaseChange]:
        """An attempt on ``upstream`` ended (see the core): the releases it routed back
        or returned, which the caller logs and counts."""
        changes = self.core.observe_attempt(
            self.now(), upstream, error=error, first_byte_s=first_byte_s
        )
        if changes:
            self._settle()
        return changes

    def reroute(self, lease: Lease) -> UpstreamState | None:
        """Move a dispatched lease to another ready upstream; None when none is free."""
        return self.core.reroute(self.now(), lease)

    def requeue(self, lease: Lease) -> None:
        """Put a dispatched lease back at the front of its line; await :meth:`ready`."""
        self._waiting[lease] = asyncio.get_running_loop().create_future()
        self.core.requeue(self.now(), lease)
        self._settle()

    def release(self, lease: Lease, *, completed: bool = False, unused_tokens: int = 0) -> None:
        """The request ended (served, failed, cancelled): free its slot, refund unused
        budget, dispatch what the queues let go next. Idempotent."""
        self.core.release(self.now(), lease, completed=completed, unused_tokens=unused_tokens)
        self._ended(lease)

    def end(self, lease: Lease, phase: Phase, output_tokens: int | None) -> None:
        """The request ended in ``phase``: the core's charging rule refunds its tenant,
        then :meth:`release`."""
        self.core.end(self.now(), lease, phase, output_tokens)
        self._ended(lease)

    def _ended(self, lease: Lease) -> None:
        """A waiter still on ``lease``'s future is cancelled; deliver what the release
        settled."""
        future = self._waiting.get(lease)
        if future is not None and not future.done():
            future.cancel()
        if self.desired is not None:
            self.desired.ended(self.now(), lease)
        self._settle()

    def pump(self) -> None:
        """Dispatch queued requests while slots and upstreams are free."""
        self.core.pump(self.now())
        self._settle()

    def on_timer(self) -> None:
        """The one timer: end the queued requests whose deadline passed (EXPIRED, never
        sent) and dispatch what a slot cap or an ejection no longer holds back."""
        self._timer = self._timer_at = None
        self.core.on_timer(self.now())
        self._settle()

    def _settle(self) -> None:
        """Deliver the core's settlements to their futures; arm the expiry timer."""
        for lease, outcome in self.core.outcomes():
            if self.desired is not None and isinstance(outcome, UpstreamState):
                self.desired.dispatched(self.now(), lease)
            future = self._waiting.get(lease)
            if future is not None and not future.done():
                future.set_result(outcome)
        at = self.core.next_timer_s(self.now())
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        if at is not None:
            # At the deadline itself (the simulator's expiry event is at the same time); a
            # timer that fires a hair early expires nothing and is armed again.
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(at - self.now(), 0.0), self.on_timer)
            self._timer_at = at
