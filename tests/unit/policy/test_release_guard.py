"""Route back to the last good release (issue 20, deliverable 3; seed 003: "if
error_rate_spikes: route to the previous release fingerprint"): the core policy alone,
then the gateway core routing unpinned calls away from a routed-back release."""

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
from headway.core.policy.releases import ReleaseGuard, ReleaseGuardConfig

CONFIG = ReleaseGuardConfig(window_s=5.0, min_attempts=10, hold_s=3.0, max_hold_s=20.0)


def _feed(
    guard: ReleaseGuard, start_s: float, n: int, revision: str, errors_every: int = 0
) -> float:
    """``n`` attempts 0.05 s apart on ``revision``, every ``errors_every``-th an error."""
    now = start_s
    for i in range(n):
        error = errors_every > 0 and i % errors_every == 0
        guard.observe(now, revision, error=error, first_byte_s=None if error else 0.1)
        now += 0.05
    return now


def test_a_release_whose_errors_spike_is_routed_back_and_returns_after_its_hold() -> None:
    guard = ReleaseGuard(CONFIG)
    _feed(guard, 0.0, 20, "r1")
    now = _feed(guard, 0.0, 9, "r2", errors_every=2)  # too few to judge
    assert guard.avoided(now) == frozenset()
    now = _feed(guard, now, 2, "r2", errors_every=1)
    assert guard.avoided(now) == {"r2"}
    (change,) = guard.changes()
    assert change.routed_back and change.revision == "r2" and "'r1'" in change.detail
    assert "error rate" in change.detail
    assert guard.avoided(now + 2.9) == {"r2"}  # held
    assert guard.avoided(now + 3.0) == frozenset()  # probation
    (back,) = guard.changes()
    assert not back.routed_back and back.revision == "r2"


def test_a_relapse_within_the_hold_doubles_it_up_to_the_longest() -> None:
    guard = ReleaseGuard(CONFIG)
    holds = []
    now = 0.0
    for _ in range(5):
        _feed(guard, now, 20, "r1")
        now = _feed(guard, now, 12, "r2", errors_every=1)
        (change,) = guard.changes()
        assert change.routed_back
        holds.append(float(change.detail.split(" for ")[1].split(" s")[0]))
        while guard.avoided(now):  # wait out the hold
            now += 0.5
        guard.changes()
    assert holds == [3.0, 6.0, 12.0, 20.0, 20.0]


def test_no_spike_no_route_back_and_latency_counts_too() -> None:
    calm = ReleaseGuard(CONFIG)
    _feed(calm, 0.0, 50, "r1", errors_every=25)  # 4% errors both: no spike
    _feed(calm, 0.0, 50, "r2", errors_every=25)
    assert calm.avoided(3.0) == frozenset() and calm.changes() == []
    slow = ReleaseGuard(CONFIG)
    _feed(slow, 0.0, 20, "r1")
    for i in range(20):
        slow.observe(0.05 * i, "r2", error=False, first_byte_s=0.5)  # 5× slower
    assert slow.avoided(1.0) == {"r2"}
    assert "slower" in slow.changes()[0].detail
    off = ReleaseGuard(ReleaseGuardConfig(enabled=False))
    _feed(off, 0.0, 20, "r1")
    _feed(off, 0.0, 20, "r2", errors_every=1)
    assert off.avoided(1.0) == frozenset()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("window_s", 0),
        ("min_attempts", 0),
        ("max_error_rate_increase", 1.0),
        ("max_latency_ratio", 1.0),
    ],
)
def test_bad_settings_are_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"release_guard.*{field}"):
        ReleaseGuardConfig(**{field: value})


def _guarded_core(ups: list[UpstreamState]) -> GatewayCore:
    settings = CoreSettings(
        admission=AdmissionConfig(), queues=QueueConfig(critical_reserved_slots=0),
        tenant_slot_headroom=None, release_guard=CONFIG,
    )  # fmt: skip
    return GatewayCore(settings, StaticUpstreams(ups))


def _offer(core: GatewayCore, now: float, revision: str | None = None) -> Lease:
    request = AdmissionRequest(tenant="acme", prompt_tokens=100, p95_output_tokens=10)
    lease = core.offer(now, request, revision)
    assert isinstance(lease, Lease), lease
    return lease


def test_the_core_sends_unpinned_calls_to_the_good_release_only() -> None:
    """Two upstreams of r1, one of r2. Once r2 is routed back, unpinned calls go to the r1
    upstreams and wait for their slots rather than take r2's free one; a call pinned to r2
    still reaches it; after the hold r2 takes unpinned calls again."""
    ups = [
        UpstreamState(url="a", revision="r1", slots=2),
        UpstreamState(url="b", revision="r1", slots=2),
        UpstreamState(url="c", revision="r2", slots=2),
    ]
    core = _guarded_core(ups)
    now, changes = 0.0, []
    for i in range(12):
        core.observe_attempt(now, ups[i % 2], error=False, first_byte_s=0.1)
        changes += core.observe_attempt(now, ups[2], error=True, first_byte_s=None)
        now += 0.05
    assert [c.routed_back for c in changes] == [True]
    leases = [_offer(core, now) for _ in range(4)]
    assert [lease.upstream for lease in leases].count(ups[2]) == 0
    pinned = _offer(core, now, revision="r2")
    assert pinned.upstream is ups[2]
    leases.append(_offer(core, now))
    assert leases[4].queued  # r1 is full: it waits for r1, not r2's free slot
    later = now + CONFIG.hold_s
    core.release(later, leases[0], completed=True)  # the hold is over: r2 takes calls again
    assert leases[4].upstream is not None
    fresh = [_offer(core, later) for _ in range(2)]
    assert any(lease.upstream is ups[2] for lease in fresh)


def test_with_only_the_bad_release_ready_calls_still_go_there() -> None:
    ups = [
        UpstreamState(url="a", revision="r1", slots=2),
        UpstreamState(url="c", revision="r2", slots=2),
    ]
    core = _guarded_core(ups)
    for i in range(12):
        core.observe_attempt(0.05 * i, ups[0], error=False, first_byte_s=0.1)
        core.observe_attempt(0.05 * i, ups[1], error=True, first_byte_s=None)
    ups[0].healthy = False  # the good release's only upstream is down
    assert _offer(core, 1.0).upstream is ups[1]


def test_the_healthy_release_is_the_reference_even_when_the_bad_one_answered_faster() -> None:
    """The bad release answered fast before it broke (its window still holds those
    answers), and the good one is slower: the good one is the reference, never routed
    back for being slower than a release that is failing (it was, once, and every call
    then went to the failing release)."""
    guard = ReleaseGuard(CONFIG)
    for i in range(20):
        guard.observe(0.05 * i, "r1", error=False, first_byte_s=0.5)
        guard.observe(0.05 * i, "r2", error=False, first_byte_s=0.05)
    assert guard.avoided(1.0) == {"r1"}  # slower: routed back, while nothing errs
    guard = ReleaseGuard(CONFIG)
    for i in range(20):
        guard.observe(0.05 * i, "r1", error=False, first_byte_s=0.5)
        guard.observe(0.05 * i, "r2", error=i >= 8, first_byte_s=0.05)
    assert guard.avoided(1.0) == {"r2"}
