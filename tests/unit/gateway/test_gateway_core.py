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
