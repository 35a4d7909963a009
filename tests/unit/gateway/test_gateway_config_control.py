"""The gateway's config, its shed-to-status table, the stream usage scan and the
wall-clock controller (admission, queues, slots, dead queued leases, expiry)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import pytest

from headway.core.errors import ConfigError
from headway.core.policy.admission import AdmissionRequest
from headway.core.policy.decisions import Shed, ShedReason
from headway.gateway.config import parse_config
from headway.gateway.control import Controller, Lease, speed_prior
from headway.gateway.relay import stream_usage
from headway.gateway.sheds import status_for


def _cfg(**extra: Any) -> dict[str, Any]:
    return {"upstreams": [{"url": "http://127.0.0.1:9"}], **extra}


def test_config_errors_name_the_field_and_fix() -> None:
    with pytest.raises(ConfigError, match=r"upstreams\[0\].url|http://"):
        parse_config({"upstreams": [{"url": "localhost:8000"}]})
    with pytest.raises(ConfigError, match="slots_per_upstream"):
        parse_config(_cfg(slots_per_upstream=0))
    with pytest.raises(ConfigError, match=r"\$.tenants.*weight|weight"):
        parse_config(_cfg(tenants={"k": {"name": "a", "weight": -1}}))
    with pytest.raises(ConfigError, match="max_priority"):
        parse_config(_cfg(tenants={"k": {"name": "a", "max_priority": "urgent"}}))
    with pytest.raises(ConfigError, match=r"unknown_field|Object contains unknown field"):
        parse_config(_cfg(unknown_field=1))
    with pytest.raises(ConfigError, match="max_queued_requests"):
        parse_config(_cfg(queues={"interactive": {"max_queued_requests": -1}}))


def test_config_builds_policy_configs_from_tenants() -> None:
    config = parse_config(
        _cfg(
            tenants={
                "k1": {"name": "a", "weight": 2, "share": 3},
                "k2": {"name": "b", "share": 1, "max_concurrency": 4},
            },
            capacity_tokens_per_s=4000,
        )
    )
    assert config.queue_config().tenant_weights == {"a": 2.0, "b": 1.0}
    limits = config.admission_config().tenants
    assert limits["a"].token_rate_per_s == pytest.approx(3000)
    assert limits["b"].token_rate_per_s == pytest.approx(1000)
    assert limits["b"].max_concurrency == 4


def test_status_table() -> None:
    assert status_for(ShedReason.QUEUE_FULL) == 429
    assert status_for(ShedReason.TENANT_TOKEN_RATE) == 429
    assert status_for(ShedReason.TENANT_CONCURRENCY) == 429
    assert status_for(ShedReason.DRAINING) == 503
    assert status_for(ShedReason.KV_PROJECTION) == 503
    assert status_for(ShedReason.DOWNSTREAM_UNHEALTHY) == 503
    assert status_for(ShedReason.TOO_LARGE) == 400  # the client's request can never fit
    assert all(status_for(r) in (400, 429, 503) for r in ShedReason)


def test_stream_usage_reads_the_last_event() -> None:
    tail = (
        b'data: {"choices":[{"delta":{"content":"x"}}],"usage":null}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert stream_usage(tail) == 7
    assert stream_usage(b'data: {"choices":[]}\n\ndata: [DONE]\n\n') is None


def _request(tenant: str = "a", **extra: Any) -> AdmissionRequest:
    return AdmissionRequest(tenant=tenant, prompt_tokens=10, p95_output_tokens=10, **extra)


def test_controller_admits_queues_skips_dead_and_expires() -> None:
    # A fast prior, so that a 20 ms deadline is not refused at arrival: it must expire.
    config = parse_config(
        _cfg(slots_per_upstream=1, tpot_s=1e-6, queues={"critical_reserved_slots": 0})
    )

    async def scenario() -> None:
        ctl = Controller(config)
        first = ctl.offer(_request())
        assert isinstance(first, Lease) and first.upstream is not None
        queued = ctl.offer(_request())
        assert isinstance(queued, Lease) and queued.upstream is None
        behind = ctl.offer(_request("b"))
        assert isinstance(behind, Lease) and behind.upstream is None
        # The first queued client goes away: it leaves the line at once, never dispatched.
        ctl.release(queued, unused_tokens=queued.cost_tokens)
        assert len(ctl.queues) == 1
        ctl.queues.check_invariants()
        ctl.release(first, completed=True)
        assert ctl.ready(behind).done() and behind.upstream is not None
        assert ctl.skipped_dead == 0 and ctl.ready(queued).cancelled()
        assert ctl.running["interactive"] == 1
        # A queued request with a deadline expires with EXPIRED, never sent.
        late = ctl.offer(_request(deadline_s=ctl.now() + 0.02))
        assert isinstance(late, Lease)
        outcome = await asyncio.wait_for(ctl.ready(late), 1.0)
        assert isinstance(outcome, Shed) and outcome.reason is ShedReason.EXPIRED
        ctl.release(late)
        ctl.release(behind, completed=True)
        assert ctl.running["interactive"] == 0
        assert sum(ctl.in_flight.values()) == 0
        assert ctl.source.upstreams()[0].outstanding_requests == 0

    asyncio.run(scenario())


def test_controller_reroutes_and_drain_shrinks_slots() -> None:
    config = parse_config(
        {
            "upstreams": [{"url": "http://127.0.0.1:9"}, {"url": "http://127.0.0.1:10"}],
            "slots_per_upstream": 2,
            "queues": {"critical_reserved_slots": 0},
        }
    )

    async def scenario() -> None:
        ctl = Controller(config)
        lease = ctl.offer(_request())
        assert isinstance(lease, Lease) and lease.upstream is not None
        first = lease.upstream
        moved = ctl.reroute(lease)
        assert moved is not None and moved is not first
        assert first.outstanding_requests == 0 and moved.outstanding_requests == 1
        assert ctl.reroute(lease) is None  # both tried
        moved.draining = True
        assert ctl.total_slots() == 2
        ctl.release(lease, completed=True)
        assert moved.outstanding_requests == 0

    asyncio.run(scenario())


def test_infeasible_deadline_is_refused_at_arrival_in_under_a_millisecond() -> None:
    config = parse_config(_cfg(tpot_s=0.01, prefill_tokens_per_s=10_000.0))

    async def scenario() -> None:
        ctl = Controller(config)
        ctl.offer(_request())  # warm the code path
        start = time.perf_counter()
        request = AdmissionRequest(
            tenant="a", prompt_tokens=10, p95_output_tokens=1000, max_tokens=1000,
            deadline_s=ctl.now() + 1.0,
        )  # fmt: skip
        shed = ctl.offer(request)
        elapsed_s = time.perf_counter() - start
        assert isinstance(shed, Shed) and shed.reason is ShedReason.DEADLINE_UNMEETABLE
        assert shed.retry_after_s is None  # a fixed deadline: no retry can help
        assert elapsed_s < 0.05  # generous on a shared machine; the benchmark times it

    asyncio.run(scenario())


def test_slot_shares_cap_a_busy_tenant_only_while_another_is_active() -> None:
    """Alone a tenant takes every slot; once another is active it holds at most its share
    (shares 3:1 of 4 slots: 3 and 1), and the other's request is dispatched at once."""
    with pytest.raises(ConfigError, match="tenant_slot_headroom"):
        parse_config(_cfg(tenant_slot_headroom=0))
    config = parse_config(
        _cfg(
            slots_per_upstream=4,
            queues={"critical_reserved_slots": 0},
            tenants={"kh": {"name": "heavy", "share": 3}, "kl": {"name": "light"}},
        )
    )

    async def scenario() -> None:
        ctl = Controller(config)
        alone = [ctl.offer(_request("heavy")) for _ in range(4)]
        assert all(isinstance(x, Lease) and x.upstream is not None for x in alone)
        assert ctl.slot_caps(ctl.now(), 4) is None  # work-conserving while alone
        light = ctl.offer(_request("light"))  # every slot is taken: it waits ...
        assert isinstance(light, Lease) and light.upstream is None
        assert ctl.slot_caps(ctl.now(), 4) == {"heavy": 3, "light": 1}
        more = ctl.offer(_request("heavy"))  # queued behind
        assert isinstance(more, Lease) and more.upstream is None
        ctl.release(alone[0], completed=True)  # ... and takes the first freed slot
        assert light.upstream is not None and more.upstream is None
        ctl.release(light, completed=True)  # heavy is at 3 = its cap while light is active
        assert more.upstream is None
        assert ctl.dispatched_by == {"heavy": 3, "light": 0}
        second = ctl.offer(_request("light"))  # a free slot: dispatched at once
        assert isinstance(second, Lease) and second.upstream is not None
        for lease in (*alone[1:], second, more):
            ctl.release(lease, completed=True)
        assert sum(ctl.dispatched_by.values()) == 0

    asyncio.run(scenario())


def test_abandoned_queued_requests_free_the_tenants_bound_at_once() -> None:
    """Clients that disconnect while queued leave the line at once: a tenant whose bound
    was full of them is not refused ``queue_full`` for requests from clients still there."""
    config = parse_config(
        _cfg(
            slots_per_upstream=1, queues={"critical_reserved_slots": 0, "max_queued_per_tenant": 2}
        )
    )

    async def scenario() -> None:
        ctl = Controller(config)
        running = ctl.offer(_request())
        assert isinstance(running, Lease) and running.upstream is not None
        gone = [ctl.offer(_request()) for _ in range(2)]
        full = ctl.offer(_request())
        assert isinstance(full, Shed) and full.reason is ShedReason.QUEUE_FULL
        for lease in gone:
            assert isinstance(lease, Lease)
            ctl.release(lease, unused_tokens=lease.cost_tokens)
        assert len(ctl.queues) == 0
        again = ctl.offer(_request())
        assert isinstance(again, Lease) and again.upstream is None  # queued, not refused
        ctl.queues.check_invariants()
        ctl.release(running, completed=True)
        assert ctl.ready(again).done() and again.upstream is not None
        ctl.release(again, completed=True)
        assert sum(ctl.in_flight.values()) == 0

    asyncio.run(scenario())


def test_whole_answers_refine_the_speeds_that_feed_the_deadline_estimate() -> None:
    """Non-streamed answers are measured too (issue 15, defect 5): a prior of 1 ms per
    token admits 1,000 tokens against a 2 s deadline; twenty whole answers of 100 tokens
    that took 1 s each (10 ms per token) teach the gateway otherwise, and the same call is
    refused at arrival. With ``measure_speeds: false`` the prior alone decides."""

    async def scenario(measure: bool) -> tuple[Shed | Lease, Shed | Lease, float | None]:
        ctl = Controller(parse_config(_cfg(tpot_s=0.001, measure_speeds=measure)))

        def late() -> AdmissionRequest:
            return AdmissionRequest(
                tenant="a", prompt_tokens=10, p95_output_tokens=1000, max_tokens=1000,
                deadline_s=ctl.now() + 2.0,
            )  # fmt: skip

        before = ctl.offer(late())
        if isinstance(before, Lease):
            ctl.release(before)
        for _ in range(20):
            ctl.observe_whole(10, 100, 1.0)
        return before, ctl.offer(late()), ctl.tpot_s()

    before, after, tpot_s = asyncio.run(scenario(True))
    assert isinstance(before, Lease)
    assert tpot_s is not None and 0.008 < tpot_s <= 0.01
    assert isinstance(after, Shed) and after.reason is ShedReason.DEADLINE_UNMEETABLE
    before, after, tpot_s = asyncio.run(scenario(False))
    assert isinstance(before, Lease) and isinstance(after, Lease) and tpot_s == 0.001


def test_streamed_answers_measure_prefill_and_decode_apart() -> None:
    ctl = Controller(parse_config(_cfg(tpot_s=0.001, prefill_tokens_per_s=100_000)))
    for _ in range(60):
        ctl.observe_stream(1000, 101, 0.5, 1.5)  # 2,000 prompt tokens/s; 10 ms per token
    assert ctl.tpot_s() == pytest.approx(0.01, rel=0.01)
    assert ctl.speeds.prefill_tokens_per_s == pytest.approx(2000, rel=0.01)


def test_the_speed_prior_comes_from_the_config_a_profile_or_the_engine_model(
    tmp_path: Any,
) -> None:
    """Before any answer, the estimate has a prior (issue 14, defect 6): the configured
    speeds, a calibrated profile, or the engine model's roofline at the slot count."""
    assert speed_prior(parse_config(_cfg(tpot_s=0.05))).tpot_s == 0.05
    step = {"overhead_s": 0.02, "per_prefill_token_s": 1e-4, "per_prefill_pair_s": 0.0,
            "per_decode_seq_s": 1e-3, "per_decode_kv_token_s": 0.0}  # fmt: skip
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"format": "headway-profile/1", "step_time": step}))
    profiled = speed_prior(parse_config(_cfg(profile=str(path), slots_per_upstream=8)))
    assert profiled.tpot_s == pytest.approx(0.02 + 8 * 1e-3)
    engine = speed_prior(parse_config(_cfg(slots_per_upstream=4)))
    busier = speed_prior(parse_config(_cfg(slots_per_upstream=64)))
    assert 0 < engine.tpot_s < busier.tpot_s < 1.0
    assert math.isfinite(engine.prefill_tokens_per_s)
    with pytest.raises(ConfigError, match="engine_model: unknown model 'nosuch'"):
        speed_prior(parse_config(_cfg(engine_model="nosuch")))
    with pytest.raises(ConfigError, match="engine_gpu"):
        speed_prior(parse_config(_cfg(engine_gpu="nosuch")))
    assert Controller(parse_config(_cfg())).tpot_s() == pytest.approx(
        speed_prior(parse_config(_cfg())).tpot_s
    )


def test_a_small_pool_keeps_its_slots_and_its_first_refusal_says_when() -> None:
    """Issue 14, defect 6, at the gateway's defaults: 4 slots are all interactive (the old
    default reserved 2 for critical), and the first refusal of a burst, before anything
    completed, carries the time the queue needs at the prior's speeds, not the 60 s cap."""
    config = parse_config(_cfg(slots_per_upstream=4, tpot_s=0.01, queues={
        "max_queued_per_tenant": 8}))  # fmt: skip

    async def scenario() -> tuple[int, Shed]:
        ctl = Controller(config)
        leases = [ctl.offer(_request(max_tokens=100)) for _ in range(12)]
        dispatched = sum(1 for x in leases if isinstance(x, Lease) and x.upstream is not None)
        shed = ctl.offer(_request(max_tokens=100))
        assert isinstance(shed, Shed)
        return dispatched, shed

    dispatched, shed = asyncio.run(scenario())
    assert dispatched == 4
    assert shed.reason is ShedReason.QUEUE_FULL
    # 8 queued + 0 promised over 4 slots, each served in 0.1 s (the expected output is
    # the class's p95, 10 tokens, at 10 ms): 0.2 s.
    assert shed.retry_after_s == pytest.approx(8 * 0.1 / 4, rel=0.05)
    assert shed.ticket is not None


def test_an_expired_lease_is_refunded_once() -> None:
    # A 1,000-token bucket that barely refills; each request costs 400 tokens.
    config = parse_config(
        _cfg(
            slots_per_upstream=1,
            queues={"critical_reserved_slots": 0},
            tenants={"k": {"name": "a", "token_rate_per_s": 0.001, "burst_s": 1_000_000}},
            # Speeds so fast that the 20 ms deadline is judged reachable at arrival: the
            # request waits in the queue and expires there.
            tpot_s=1e-6,
            prefill_tokens_per_s=1e9,
        )
    )
    cost = {"prompt_tokens": 200, "p95_output_tokens": 200}

    async def scenario() -> None:
        ctl = Controller(config)
        bucket = ctl.admission
        start = bucket.tokens_available(ctl.now(), "a")
        assert start is not None
        first = ctl.offer(AdmissionRequest(tenant="a", **cost))
        assert isinstance(first, Lease) and first.upstream is not None
        late = ctl.offer(AdmissionRequest(tenant="a", deadline_s=ctl.now() + 0.02, **cost))
        assert isinstance(late, Lease) and late.upstream is None
        outcome = await asyncio.wait_for(ctl.ready(late), 1.0)
        assert isinstance(outcome, Shed) and outcome.reason is ShedReason.EXPIRED
        # The server releases every lease with what it did not use: all of an expired one.
        ctl.release(late, unused_tokens=late.cost_tokens)
        level = bucket.tokens_available(ctl.now(), "a")
        assert level == pytest.approx(start - 400, abs=1.0)  # the first one's 400 only
        ctl.release(first, completed=True)

    asyncio.run(scenario())


def test_degraded_modes_follow_the_gateways_pressure_and_survive_a_reload() -> None:
    with pytest.raises(ConfigError, match=r"degraded\.modes.*bands.*'urgent'"):
        parse_config(_cfg(degraded={"modes": {"brief": {"bands": ["urgent"], "max_tokens": 8}}}))
    with pytest.raises(ConfigError, match="a mode must change something"):
        parse_config(_cfg(degraded={"modes": {"brief": {"bands": ["interactive"]}}}))
    mode = {"bands": ["interactive"], "max_tokens": 8, "shed_optional": True,
            "enter": {"slot_utilization": 1.0}, "leave": {"slot_utilization": 0.5},
            "min_on_s": 0}  # fmt: skip
    config = parse_config(
        _cfg(
            slots_per_upstream=2,
            tpot_s=1e-6,
            queues={"critical_reserved_slots": 0},
            degraded={"modes": {"brief": mode}},
        )
    )
    assert parse_config(_cfg()).degraded.modes == {}

    async def scenario() -> None:
        ctl = Controller(config)
        asked = _request(max_tokens=100)
        offered, how = ctl.degrade(asked)
        assert how is None and offered is asked  # no slot held: below enter
        held = [ctl.offer(_request()), ctl.offer(_request())]
        offered, how = ctl.degrade(asked)  # both slots held: it enters
        assert how is not None and how.header() == "brief; max_tokens=8 (asked 100)"
        assert isinstance(offered, AdmissionRequest) and offered.max_tokens == 8
        [change] = ctl.core.modes.changes()
        assert change.on and change.cause.startswith("pressure: slot_utilization 1")
        shed, how = ctl.degrade(asked, optional=True)
        assert isinstance(shed, Shed) and shed.reason is ShedReason.DEGRADED_OPTIONAL
        ctl.reconfigure(config)  # a reload keeps the mode on
        assert ctl.core.modes.states["brief"].on
        for lease in held:
            assert isinstance(lease, Lease)
            ctl.release(lease, completed=True)
        offered, how = ctl.degrade(asked)  # no slot held: it leaves
        assert how is None and offered is asked
        assert [c.on for c in ctl.core.modes.changes()] == [False]

    asyncio.run(scenario())
