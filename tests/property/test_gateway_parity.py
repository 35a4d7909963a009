"""Decision parity: the live gateway's driver and the simulator's give the same decisions.

Hypothesis generates sequences of offers, finishes (completed, cut in prefill or decode,
failed before a byte) and disconnects of queued requests at synthetic times, across
tenants with budgets, weights, concurrency bounds and slot shares, bands and deadlines.
Each sequence is fed to the live :class:`~headway.gateway.control.Controller` (its
futures and its one expiry timer, on an event loop whose clock is virtual) and to the
simulator's :class:`~headway.sim.gateway.SimGateway` (expiry at the core's timer, as the
simulator's events fire it). After every step both must have made the same decisions
(shed reason, Retry-After and ticket; the upstream chosen; queued), settled the same
queued requests the same way, and hold the same accounting (slots per band, requests
per tenant, queue statistics, token buckets, the speed estimate).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import event as note_event
from hypothesis import strategies as st

from headway.core.gateway_core import GatewayCore, Lease
from headway.core.policy.admission import AdmissionRequest
from headway.core.policy.charges import Phase
from headway.core.policy.decisions import Shed
from headway.core.policy.queues import BANDS
from headway.gateway.config import GatewayFileConfig, parse_config
from headway.gateway.control import Controller, speed_prior
from headway.sim.gateway import GatewayConfig, SimGateway

TENANTS = ("a", "b", "c")


class _VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is set by the test: timers fire when it passes them."""

    clock = 0.0

    def time(self) -> float:
        return self.clock


def _config(slots: int, headroom: float | None, rate: float | None) -> GatewayFileConfig:
    tenant_a: dict[str, Any] = {"name": "a", "weight": 1, "share": 2}
    if rate is not None:
        tenant_a["token_rate_per_s"] = rate
        tenant_a["burst_s"] = 2.0
    return parse_config(
        {
            "upstreams": [{"url": "http://127.0.0.1:9"}, {"url": "http://127.0.0.1:10"}],
            "slots_per_upstream": slots,
            "kv_blocks_per_upstream": 60,
            "tpot_s": 0.005,
            "prefill_tokens_per_s": 4000,
            "tenant_slot_headroom": headroom,
            "queues": {"critical_reserved_slots": 1 if slots > 1 else 0},
            "tenants": {
                "ka": tenant_a,
                "kb": {"name": "b", "weight": 2, "max_concurrency": 3},
                "kc": {"name": "c", "weight": 1},
            },
        }
    )


def _sim(config: GatewayFileConfig) -> SimGateway:
    """The simulator's gateway with the live config's settings."""
    sim_config = GatewayConfig(
        preset="headway-default",
        admission=config.admission_config(),
        queues=config.queue_config(),
        slots_per_replica=config.slots_per_upstream,
        tenant_slot_headroom=config.tenant_slot_headroom,
        tenant_active_s=config.tenant_active_s,
    )
    return SimGateway(
        sim_config,
        num_replicas=len(config.upstreams),
        max_num_seqs=config.slots_per_upstream,
        block_size=16,
        kv_blocks_per_replica=config.kv_blocks_per_upstream,
        speed_prior=speed_prior(config),
        slot_shares={t.name: t.share if t.share > 0 else t.weight for t in config.tenants.values()},
    )


_offer = st.tuples(
    st.just("offer"),
    st.floats(0.0, 0.05),
    st.sampled_from(TENANTS),
    st.sampled_from(BANDS),
    st.integers(1, 600),  # prompt tokens
    st.integers(1, 120),  # p95 output tokens
    st.one_of(st.none(), st.floats(0.05, 2.0)),  # deadline, seconds from now
)
_finish = st.tuples(
    st.just("finish"),
    st.floats(0.0, 0.3),
    st.integers(0, 50),  # which dispatched request
    st.sampled_from([Phase.COMPLETED, Phase.DECODE, Phase.PREFILL, Phase.UNSENT]),
    st.integers(0, 400),  # its output tokens
)
_leave = st.tuples(st.just("leave"), st.floats(0.0, 0.3), st.integers(0, 50))
_wait = st.tuples(st.just("wait"), st.floats(0.0, 2.5))
SEQUENCES = st.lists(
    st.one_of(_offer, _offer, _offer, _finish, _finish, _leave, _wait), min_size=1, max_size=60
)


def _decision(got: Shed | Lease, index_of: dict[int, int]) -> tuple[object, ...]:
    if isinstance(got, Shed):
        return ("shed", got.reason, got.retry_after_s, got.ticket)
    if got.upstream is None:
        return ("queued",)
    return ("dispatched", index_of[id(got.upstream)])


def _settlement(outcome: object, index_of: dict[int, int]) -> tuple[object, ...]:
    if isinstance(outcome, Shed):
        return ("shed", outcome.reason, outcome.retry_after_s)
    if isinstance(outcome, int):
        return ("dispatched", outcome)
    return ("dispatched", index_of[id(outcome)])


def _accounting(core: GatewayCore, now: float) -> tuple[object, ...]:
    probe = AdmissionRequest(tenant="a", prompt_tokens=1, p95_output_tokens=1)
    snapshot = core.snapshot(now, probe)
    buckets = tuple(core.admission.tokens_available(now, t) for t in TENANTS)
    upstreams = tuple(
        (u.outstanding_requests, u.outstanding_tokens, u.projected_blocks)
        for u in core.source.upstreams()
    )
    return (
        dict(core.running),
        {t: n for t, n in core.in_flight.items() if n},
        dict(core.dispatched_by),
        snapshot,
        buckets,
        upstreams,
        core.expired,
    )


@settings(
    max_examples=int(os.environ.get("HEADWAY_PARITY_EXAMPLES", "1000")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    sequence=SEQUENCES,
    slots=st.integers(1, 3),
    headroom=st.sampled_from([None, 1.0, 1.5]),
    rate=st.sampled_from([None, 300.0, 3000.0]),
)
def test_live_and_simulated_gateways_decide_alike(
    sequence: list[tuple[Any, ...]], slots: int, headroom: float | None, rate: float | None
) -> None:
    config = _config(slots, headroom, rate)
    sim = _sim(config)
    loop = _VirtualLoop()
    try:
        loop.run_until_complete(_replay(loop, config, sim, sequence))
    finally:
        loop.close()


async def _replay(
    loop: _VirtualLoop, config: GatewayFileConfig, sim: SimGateway, sequence: list[tuple[Any, ...]]
) -> None:
    live = Controller(config)
    live.now = lambda: loop.clock  # type: ignore[method-assign]
    live_index = {id(u): i for i, u in enumerate(live.source.upstreams())}
    sim_index = {id(u): i for i, u in enumerate(sim.core.source.upstreams())}
    settings_live = dataclasses.replace(live.core.settings, fallback=sim.core.settings.fallback)
    assert settings_live == sim.core.settings
    # Requests by their place in the sequence: (live lease, sim lease).
    dispatched: list[tuple[Lease, Lease]] = []
    queued: list[tuple[Lease, Lease]] = []
    clock = 0.0

    async def advance(to: float) -> None:
        """Run both drivers' expiry timers due up to ``to``, in time order."""
        nonlocal clock
        while True:
            at_live, at_sim = live.core.next_timer_s(clock), sim.next_timer_s(clock)
            assert at_live == at_sim
            if at_live is None or at_live > to:
                break
            loop.clock = clock = max(clock, at_live)
            for _ in range(3):  # the loop runs the due timer, then the futures' callbacks
                await asyncio.sleep(0)
            sim.on_timer(clock)
            settle()
        loop.clock = clock = to

    def settle() -> None:
        """Both drivers settled the same queued requests, the same way."""
        sim_settled = {id(lease): outcome for lease, outcome in sim.settled()}
        for pair in list(queued):
            future = live.ready(pair[0])
            live_done = future.done() and not future.cancelled()
            assert live_done == (id(pair[1]) in sim_settled)
            if not live_done:
                continue
            queued.remove(pair)
            outcome = future.result()
            assert _settlement(outcome, live_index) == _settlement(
                sim_settled[id(pair[1])], sim_index
            )
            note_event(f"settled: {'expired' if isinstance(outcome, Shed) else 'dispatched'}")
            if isinstance(outcome, Shed):  # expired: its handler ends it, never sent
                live.end(pair[0], Phase.UNSENT, 0)
                sim.end(clock, pair[1], Phase.UNSENT, 0)
            else:
                dispatched.append(pair)

    for step, event in enumerate(sequence):
        await advance(clock + event[1])
        kind = event[0]
        if kind == "offer":
            _, _, tenant, band, prompt, p95, deadline = event
            request = AdmissionRequest(
                tenant=tenant,
                prompt_tokens=prompt,
                p95_output_tokens=p95,
                priority=band,
                deadline_s=None if deadline is None else clock + deadline,
            )
            got_live = live.offer(request)
            _, got_sim = sim.offer(clock, request, step)
            decision = _decision(got_live, live_index)
            assert decision == _decision(got_sim, sim_index), step
            note_event(f"offer: {decision[0]} {decision[1] if decision[0] == 'shed' else ''}")
            if isinstance(got_live, Lease) and isinstance(got_sim, Lease):
                pair = (got_live, got_sim)
                (dispatched if got_live.upstream is not None else queued).append(pair)
        elif kind == "finish" and dispatched:
            _, _, pick, phase, output = event
            live_lease, sim_lease = dispatched.pop(pick % len(dispatched))
            if phase is Phase.COMPLETED:
                duration_s = 0.05 + output * 0.01
                live.observe_stream(live_lease.prompt_tokens, output, 0.05, duration_s)
                sim.core.observe_stream(sim_lease.prompt_tokens, output, 0.05, duration_s)
            live.end(live_lease, phase, None if phase is Phase.UNSENT else output)
            sim.end(clock, sim_lease, phase, None if phase is Phase.UNSENT else output)
        elif kind == "leave" and queued:
            live_lease, sim_lease = queued.pop(event[2] % len(queued))
            live.end(live_lease, Phase.UNSENT, 0)
            sim.end(clock, sim_lease, Phase.UNSENT, 0)
        await asyncio.sleep(0)
        settle()
        assert _accounting(live.core, clock) == _accounting(sim.core, clock), step
    # Everything ends: both balance to nothing in flight.
    for live_lease, sim_lease in dispatched + queued:
        live.end(live_lease, Phase.COMPLETED, 1)
        sim.end(clock, sim_lease, Phase.COMPLETED, 1)
    await asyncio.sleep(0)
    sim.settled()
    for core in (live.core, sim.core):
        assert sum(core.in_flight.values()) == 0
        assert set(core.running.values()) == {0}
        assert len(core.queues) == 0
        assert all(u.outstanding_requests == 0 for u in core.source.upstreams())
    assert not math.isnan(clock)
