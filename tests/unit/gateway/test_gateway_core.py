"""The sans-I/O gateway core: a retry waits for an upstream it has not failed on, and a
dead upstream's ejections grow while it stays dead (a killed vLLM has no calls, so it is
the least loaded upstream the moment its ejection ends)."""

from __future__ import annotations

import pytest

from headway.core.gateway_core import (
    CoreSettings,
    GatewayCore,
    Lease,
    StaticUpstreams,
    UpstreamState,
)
from headway.core.policy.admission import AdmissionConfig, AdmissionRequest
from headway.core.policy.queues import QueueConfig


def _core(*states: UpstreamState) -> GatewayCore:
    settings = CoreSettings(
        admission=AdmissionConfig(), queues=QueueConfig(critical_reserved_slots=0),
        tenant_slot_headroom=None,
    )  # fmt: skip
    return GatewayCore(settings, StaticUpstreams(states))


def _offer(core: GatewayCore, now: float) -> Lease:
    request = AdmissionRequest(tenant="acme", prompt_tokens=100, p95_output_tokens=10)
    lease = core.offer(now, request)
    assert isinstance(lease, Lease), lease
    return lease


def test_a_requeued_retry_waits_for_an_upstream_it_has_not_failed_on() -> None:
    a, b = UpstreamState(url="a", slots=1), UpstreamState(url="b", slots=1)
    core = _core(a, b)
    first, second = _offer(core, 0.0), _offer(core, 0.0)
    assert [first.upstream, second.upstream] in ([a, b], [b, a])
    failed_on = second.upstream
    assert failed_on is not None
    # It broke under its answer, but the pool still says ready (no ejection here).
    assert core.reroute(0.1, second) is None  # the other one is full
    core.requeue(0.1, second)
    assert second.upstream is None and second.queued  # not straight back to where it failed
    assert core.outcomes() == []
    core.release(0.2, first, completed=True)  # the other one frees its slot
    assert second.upstream is first.upstream and second.upstream is not failed_on
    assert core.outcomes() == [(second, first.upstream)]


def test_a_retry_goes_back_when_nothing_else_serves() -> None:
    only = UpstreamState(url="only", slots=1)
    core = _core(only)
    lease = _offer(core, 0.0)
    assert core.reroute(0.1, lease) is None
    core.requeue(0.1, lease)  # the one it failed on is all there is: it is tried again
    assert lease.upstream is only and core.outcomes() == [(lease, only)]


def test_ejections_double_while_an_upstream_stays_dead_and_end_when_it_answers() -> None:
    u = UpstreamState(url="u")
    ends = []
    for now in (0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0):
        u.eject(now, 2.0)
        ends.append(u.down_until_s - now)
    assert ends == [2.0, 4.0, 8.0, 16.0, 32.0, 32.0, 32.0]
    assert not u.ready_at(60.0) and u.ready_at(92.0)
    u.answered()
    u.eject(100.0, 2.0)
    assert u.down_until_s == pytest.approx(102.0)
    u.reachable_again()
    assert u.ready_at(100.5) and u.failures_in_a_row == 0


def _tenant_offer(core: GatewayCore, now: float, tenant: str) -> Lease:
    request = AdmissionRequest(tenant=tenant, prompt_tokens=100, p95_output_tokens=10)
    lease = core.offer(now, request)
    assert isinstance(lease, Lease), lease
    return lease


def test_a_slot_cap_that_ends_with_time_alone_arms_the_timer() -> None:
    """A tenant counts as active for ``tenant_active_s`` after its last arrival; when the
    other tenant's last one ages out, the flood's cap lifts with no event, and the timer
    (not the next arrival or finish) dispatches what the cap held back."""
    settings = CoreSettings(
        admission=AdmissionConfig(), queues=QueueConfig(critical_reserved_slots=0),
        tenant_slot_headroom=1.0, tenant_active_s=2.0,
    )  # fmt: skip
    core = GatewayCore(settings, StaticUpstreams([UpstreamState(url="u", slots=4)]))
    light = _tenant_offer(core, 0.0, "light")
    core.release(0.1, light, completed=True)  # gone, but active until 2.0 by its arrival
    flood = [_tenant_offer(core, 0.2, "flood") for _ in range(4)]
    assert [lease.upstream is not None for lease in flood] == [True, True, False, False]
    assert core.next_timer_s(0.2) == 2.0  # no deadline queued: the cap's end alone
    core.on_timer(1.999)  # a timer a hair early: the cap holds, the time stays armed
    assert core.outcomes() == [] and core.next_timer_s(1.999) == 2.0
    core.on_timer(2.0)
    assert [lease for lease, _ in core.outcomes()] == flood[2:]
    assert all(lease.upstream is not None for lease in flood)
    assert core.next_timer_s(2.0) is None


def test_an_ejection_that_ends_with_time_alone_arms_the_timer() -> None:
    """One upstream is busy, the other ejected after a connection failure: a queued
    request goes when the ejection ends, at the timer, not at the next event."""
    busy, ejected = UpstreamState(url="busy", slots=1), UpstreamState(url="ejected", slots=1)
    core = _core(busy, ejected)
    ejected.eject(0.0, 2.0)
    first = _offer(core, 0.5)
    waiting = _offer(core, 0.5)
    assert first.upstream is busy and waiting.upstream is None and waiting.queued
    assert core.next_timer_s(0.5) == 2.0
    core.on_timer(2.0)
    assert core.outcomes() == [(waiting, ejected)]
    assert core.next_timer_s(2.0) is None


def test_no_timer_for_a_cap_or_an_ejection_while_nothing_waits() -> None:
    """The timer is for queued requests: with none, only their deadlines would count."""
    only = UpstreamState(url="only", slots=2)
    core = _core(only)
    only.eject(0.0, 2.0)
    assert core.next_timer_s(0.5) is None


def test_a_light_tenant_is_dispatched_at_once_beside_a_flood() -> None:
    """Slot shares on the core's clock (once an end-to-end test that slept against a
    real-time emulator): alone, a flooding tenant takes every slot (work-conserving); once
    a light tenant is active the flood drains down to its share (its dispatched requests
    are never pre-empted) and stays there, so every light request after that is
    dispatched at once while the flood's requests queue."""
    slots, heavy_cap = 4, 2  # ceil(1/2 × 4 slots × headroom 1.0)
    settings = CoreSettings(
        admission=AdmissionConfig(),
        queues=QueueConfig(critical_reserved_slots=0, max_queued_per_tenant=64),
        tenant_slot_headroom=1.0, tenant_active_s=5.0,
    )  # fmt: skip
    core = GatewayCore(settings, StaticUpstreams([UpstreamState(url="u", slots=slots)]))
    heavy = [_tenant_offer(core, 0.0, "heavy") for _ in range(12)]
    running = [lease for lease in heavy if lease.upstream is not None]
    assert len(running) == slots and core.dispatched_by == {"heavy": slots}
    now = 1.0
    first_light = _tenant_offer(core, now, "light")
    assert first_light.upstream is None  # every slot is the flood's: it waits for one

    def heavy_finishes() -> None:
        nonlocal now
        now += 0.1
        core.release(now, running.pop(0), completed=True)
        running.extend(lease for lease, _ in core.outcomes() if lease.tenant == "heavy")
        sent = _tenant_offer(core, now, "heavy")  # its client sends its next one at once
        assert sent.upstream is None  # the flood's line, never a slot past its share

    heavy_finishes()  # the freed slot goes to the light tenant, not to the flood's line
    assert first_light.upstream is not None
    core.release(now, first_light, completed=True)
    while core.dispatched_by["heavy"] > heavy_cap:
        heavy_finishes()
    held = []
    for _ in range(8):
        now += 0.1
        light = _tenant_offer(core, now, "light")
        assert light.upstream is not None  # dispatched at once: no queue wait at all
        heavy_finishes()  # the flood's next request takes its slot back, never more
        held.append(core.dispatched_by["heavy"])
        core.release(now, light, completed=True)
    assert max(held) <= heavy_cap, held
    assert core.queued_by(now)[1]["heavy"] >= 1  # the contention was real: it queued


def _route_offer(core: GatewayCore, now: float, route: str) -> Lease:
    request = AdmissionRequest(tenant="acme", prompt_tokens=100, p95_output_tokens=10)
    lease = core.offer(now, request, route=route)
    assert isinstance(lease, Lease), lease
    return lease


def test_a_full_route_holds_back_only_its_own_requests() -> None:
    """Seed 000: separate queues for unlike work. A route whose upstreams are full keeps
    its requests waiting; another route's requests, offered after them, go to their own
    free upstream at once, and when that one frees, its line moves while the full route's
    head still waits (one shared line held the bulk request behind the agent's head)."""
    agent = UpstreamState(url="agent", slots=1, route="agent")
    bulk = UpstreamState(url="bulk", slots=1, route="bulk")
    core = _core(agent, bulk)
    running = _route_offer(core, 0.0, "agent")
    waiting = _route_offer(core, 0.1, "agent")
    assert running.upstream is agent and waiting.queued
    first_bulk = _route_offer(core, 0.2, "bulk")
    assert first_bulk.upstream is bulk  # not queued behind the agent route's line
    second_bulk = _route_offer(core, 0.3, "bulk")
    assert second_bulk.queued and core.queued_requests() == 2
    core.release(0.4, first_bulk, completed=True)
    assert second_bulk.upstream is bulk and waiting.queued
    assert core.outcomes() == [(second_bulk, bulk)]
    core.release(0.5, running, completed=True)
    assert waiting.upstream is agent and core.queued_requests() == 0


def test_a_routes_strict_share_caps_it_and_keeps_the_rest_for_the_others() -> None:
    """Two routes on the same upstreams (none names a route), bulk with a strict 0.25
    share of their 8 slots: bulk holds at most 2 at once although 6 stand free, and the
    agent route, with 0.75, still finds its 6 while bulk waits."""
    shared = [UpstreamState(url=f"u{i}", slots=4) for i in range(2)]
    settings = CoreSettings(
        admission=AdmissionConfig(), queues=QueueConfig(critical_reserved_slots=0),
        tenant_slot_headroom=None, route_slot_shares={"bulk": 0.25, "agent": 0.75},
    )  # fmt: skip
    core = GatewayCore(settings, StaticUpstreams(shared))
    bulk = [_route_offer(core, 0.01 * i, "bulk") for i in range(5)]
    assert sum(lease.upstream is not None for lease in bulk) == 2
    agent = [_route_offer(core, 0.1 + 0.01 * i, "agent") for i in range(7)]
    assert sum(lease.upstream is not None for lease in agent) == 6
    assert sum(u.outstanding_requests for u in shared) == 8
    first_bulk = next(lease for lease in bulk if lease.upstream is not None)
    core.release(0.2, first_bulk, completed=True)  # a bulk slot frees: a bulk call goes
    running = [lease for lease in bulk if lease.upstream is not None and not lease.released]
    assert len(running) == 2 and sum(lease.queued for lease in bulk) == 2
    assert sum(lease.upstream is not None for lease in agent) == 6


def test_a_lease_a_pop_set_aside_past_its_deadline_still_expires() -> None:
    """A pop sets aside an entry past its deadline, and the line's length no longer
    counts it; its expiry must still end it (a lane skipped for being empty never did,
    and the simulator's timer fired at that deadline forever)."""
    only = UpstreamState(url="only", slots=1)
    core = _core(only)
    running = _offer(core, 0.0)
    request = AdmissionRequest(
        tenant="acme", prompt_tokens=100, p95_output_tokens=10, deadline_s=1.0
    )
    waiting = core.offer(0.0, request)
    assert isinstance(waiting, Lease) and waiting.queued
    core.release(2.0, running, completed=True)  # the pop finds it past its deadline
    (outcome,) = core.outcomes()
    assert outcome[0] is waiting and not waiting.queued
    assert core.queued_requests() == 0 and core.next_timer_s(2.0) is None
